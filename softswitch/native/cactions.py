"""Actions as C functions `static int A_<n>(uint64_t *restrict f, const uint64_t *a)` (1: exit was called),
one generator per BMv2 primitive, each the counterpart of softswitch.compiler.primitives."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..compiler.layout import hex_value
from ..compiler_errors import UnsupportedConstruct
from .cexpr import FIELD_BITS, CExpr, mask_u64
from .croll import roll

if TYPE_CHECKING:
    from .cprogram import CBuilder

Primitive = Callable[["CBuilder", list, "list[int] | None", CExpr], "list[str]"]


def generate_action(cb: CBuilder, action: dict) -> None:
    widths = [rd["bitwidth"] for rd in action.get("runtime_data", [])]
    if any(w > FIELD_BITS for w in widths):
        raise UnsupportedConstruct(f"an action parameter wider than 64 bits in action {action['name']!r}")
    cb.emit(f"static int {cb.py.action_fn[action['id']]}(uint64_t *restrict f, const uint64_t *a) {{")
    cb.emit("(void)f; (void)a; GROUPS", 1)
    lines = [line for p in action.get("primitives", []) for line in generate_primitive(cb, p, widths, CExpr(cb.exprs))]
    for line in roll(lines):
        cb.emit(line, 1)
    cb.emit("return 0;", 1)
    cb.emit("}")


def generate_primitive(cb: CBuilder, primitive: dict, widths, e: CExpr) -> list[str]:
    generate = PRIMITIVES.get(primitive["op"])
    if generate is None:
        raise UnsupportedConstruct(f"primitive {primitive['op']!r}")
    return generate(cb, primitive.get("parameters", []), widths, e)


def _node(cb: CBuilder, param: dict, widths):
    return cb.exprs.node(param, widths)


def _unsigned_lvalue(cb: CBuilder, param: dict, what: str) -> int:
    slot = cb.py.lvalue(param)
    if cb.layout.signed[slot] or cb.layout.widths[slot] > FIELD_BITS:
        raise UnsupportedConstruct(f"{what} into a signed or wide field")
    return slot


def assign(cb, params, widths, e):
    slot = cb.py.lvalue(params[0])
    return [e.store(slot, _node(cb, params[1], widths))]


def assign_header(cb, params, widths, e):
    dst = cb.layout.headers[params[0]["value"]]
    src = cb.layout.headers[params[1]["value"]]
    return [f"memmove(f + {dst.valid}, f + {src.valid}, {8 * (src.end - src.valid)});"]


def add_header(cb, params, widths, e):
    h = cb.layout.headers[params[0]["value"]]
    return [f"if (!f[{h.valid}]) {{ memset(f + {h.first}, 0, {8 * len(h.fields)}); f[{h.valid}] = 1; "
            f"f[{cb.layout.plen}] += {h.nbits // 8}; }}"]


def remove_header(cb, params, widths, e):
    h = cb.layout.headers[params[0]["value"]]
    return [f"if (f[{h.valid}]) {{ f[{h.valid}] = 0; f[{cb.layout.plen}] -= {h.nbits // 8}; }}"]


def push_or_pop(op: str) -> Primitive:
    def generate(cb, params, widths, e):
        if params[0]["type"] != "header_stack" or params[1]["type"] != "hexstr":
            raise UnsupportedConstruct(f"{op} on a {params[0]['type']} with a {params[1]['type']} count")
        next_slot, elements = cb.layout.stack(params[0]["value"])
        size, n = len(elements), hex_value(params[1]["value"])
        valid = " + ".join(f"(int64_t)f[{el.valid}]" for el in elements)
        out = [f"{{ int64_t _nv = {valid};"]
        order = range(size - 1, -1, -1) if op == "push" else range(size)
        for i in order:
            src = i - n if op == "push" else i + n
            dst = elements[i]
            nbytes = 8 * (dst.end - dst.valid)
            if 0 <= src < size:
                out.append(f"  memmove(f + {dst.valid}, f + {elements[src].valid}, {nbytes});")
            else:
                out.append(f"  memset(f + {dst.valid}, 0, {nbytes});")
        if op == "push":
            out.append(f"  f[{next_slot}] = f[{next_slot}] + {n} < {size} ? f[{next_slot}] + {n} : {size};")
        else:
            out.append(f"  f[{next_slot}] = (int64_t)f[{next_slot}] - {n} > 0 ? f[{next_slot}] - {n} : 0;")
        out.append(f"  f[{cb.layout.plen}] += (uint64_t)(({valid} - _nv) * {elements[0].nbits // 8}); }}")
        return out
    return generate


def mark_to_drop(cb, params, widths, e):
    out = [f"f[{cb.slots['egress_spec']}] = {cb.py.drop_port};"]
    if "mcast_grp" in cb.slots:
        out.append(f"f[{cb.slots['mcast_grp']}] = 0;")
    return out


def register_read(cb, params, widths, e):
    register = cb.py.register(params[1])
    slot = _unsigned_lvalue(cb, params[0], "register_read")
    if cb.reg_widths[register] > cb.layout.widths[slot]:
        raise UnsupportedConstruct(f"register_read of {register!r} into a narrower field")
    index = e.nonneg(_node(cb, params[2], widths), "a register index")
    cell = cb.reg_cell(register, "(int64_t)_i")
    return [f"{{ i128 _i = {index}; if (_i < {cb.registers[register]}) f[{slot}] = {cell}; }}"]


def register_write(cb, params, widths, e):
    register = cb.py.register(params[0])
    index = e.nonneg(_node(cb, params[1], widths), "a register index")
    value = e.modular(_node(cb, params[2], widths))
    width = cb.reg_widths[register]
    if width > FIELD_BITS:
        raise UnsupportedConstruct(f"register {register!r} of {width} bits")
    masked = f"(uint64_t)({value}) & {mask_u64(width)}" if width < 64 else f"(uint64_t)({value})"
    cell = cb.reg_cell(register, "(int64_t)_i")
    return [f"{{ i128 _i = {index}; if (_i < {cb.registers[register]}) {cell} = {masked}; }}"]


def count(cb, params, widths, e):
    name = params[0]["value"]
    counter = cb.py.counters[name]
    index = e.nonneg(_node(cb, params[1], widths), "a counter index")
    number = cb.py.counter_index[name]
    return [f"{{ i128 _i = {index}; if (_i < {counter['size']}) {{ CP_{number}[(int64_t)_i] += 1; "
            f"CB_{number}[(int64_t)_i] += f[{cb.layout.ilen}]; }} }}"]


def hash_based_offset(cb, params, widths, e):
    slot = _unsigned_lvalue(cb, params[0], "hash")
    base = e.code(_node(cb, params[1], widths))
    size = e.exact(_node(cb, params[3], widths))
    calc = cb.py.calc_index[params[2]["value"]]
    return [f"f[{slot}] = {e.stored(slot, f'x_add({base}, x_hmod(K_{calc}(f), {size}))')};"]


def random_uniform(cb, params, widths, e):
    slot = _unsigned_lvalue(cb, params[0], "random")
    lo = e.exact(_node(cb, params[1], widths))
    hi = e.exact(_node(cb, params[2], widths))
    return [f"f[{slot}] = {e.stored(slot, f'rng_uniform({lo}, {hi})')};"]


def exit_pipeline(cb, params, widths, e):
    return ["return 1;"]


def no_effect(cb, params, widths, e):
    return []


PRIMITIVES: dict[str, Primitive] = {
    "assign": assign,
    "assign_header": assign_header,
    "add_header": add_header,
    "remove_header": remove_header,
    "push": push_or_pop("push"),
    "pop": push_or_pop("pop"),
    "mark_to_drop": mark_to_drop,
    "drop": mark_to_drop,
    "register_read": register_read,
    "register_write": register_write,
    "count": count,
    "modify_field_with_hash_based_offset": hash_based_offset,
    "modify_field_rng_uniform": random_uniform,
    "exit": exit_pipeline,
    "log_msg": no_effect,
    "assume": no_effect,
    "assert": no_effect,
}
