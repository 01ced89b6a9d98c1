"""Actions: straight-line lists of BMv2 primitives, one generator function per primitive
registered in PRIMITIVES (as bm_sim's core/primitives). Each returns the lines of Python
it compiles to and tells the emitter which slots it wrote, so no stale subexpression is
reused after them."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..compiler_errors import ProgramError, UnsupportedConstruct
from .expressions import ExpressionEmitter, count_nodes
from .layout import hex_value

if TYPE_CHECKING:
    from .program import ProgramBuilder

# (builder, JSON parameters, action parameter widths or None, emitter) -> lines
Primitive = Callable[["ProgramBuilder", list, "list[int] | None", ExpressionEmitter], "list[str]"]
OPERAND_TYPES = ("expression", "field", "hexstr", "runtime_data", "local", "bool", "register")


def generate_action(builder: ProgramBuilder, action: dict) -> None:
    widths = [rd["bitwidth"] for rd in action.get("runtime_data", [])]
    primitives = action.get("primitives", [])
    for p in primitives:
        if p["op"] not in PRIMITIVES:
            raise UnsupportedConstruct(f"primitive {p['op']!r} in action {action['name']!r}")
    builder.emit(f"def {builder.action_fn[action['id']]}(f, a):")
    if not generate_block(builder, primitives, widths, 1):
        builder.emit("pass", 1)
    builder.emit("")


def generate_block(builder: ProgramBuilder, primitives: list, widths: list[int] | None, indent: int) -> int:
    """Straight-line primitives; returns the number of lines written."""
    counts: dict = {}
    for p in primitives:
        for param in p.get("parameters", []):
            if param["type"] in OPERAND_TYPES:
                try:
                    count_nodes(builder.exprs.node(param, widths), counts)
                except ProgramError:
                    pass  # reported when the primitive itself is compiled
    emitter = ExpressionEmitter(builder.exprs, counts)
    start = len(builder.lines)
    for p in primitives:
        for line in generate_primitive(builder, p, widths, emitter):
            builder.emit(line, indent)
    return len(builder.lines) - start


def generate_primitive(builder: ProgramBuilder, primitive: dict, widths, emitter: ExpressionEmitter) -> list[str]:
    generate = PRIMITIVES.get(primitive["op"])
    if generate is None:
        raise UnsupportedConstruct(f"primitive {primitive['op']!r}")
    return generate(builder, primitive.get("parameters", []), widths, emitter)


def _value(builder: ProgramBuilder, emitter: ExpressionEmitter, param: dict, widths) -> str:
    return emitter.expr(builder.exprs.node(param, widths))


def assign(builder, params, widths, emitter):
    slot = builder.lvalue(params[0])
    if slot == builder.layout.headers[params[0]["value"][0]].valid:
        raise ProgramError("assignment to $valid$")
    line = emitter.store(slot, builder.exprs.node(params[1], widths))
    emitter.invalidate([slot])
    return emitter.take_pre() + [line]


def assign_header(builder, params, widths, emitter):
    dst = builder.layout.headers[params[0]["value"]]
    src = builder.layout.headers[params[1]["value"]]
    if [w for _, w, _ in dst.fields] != [w for _, w, _ in src.fields]:
        raise ProgramError(f"assign_header {src.name!r} -> {dst.name!r}: different types")
    emitter.invalidate(range(dst.valid, dst.end))
    return [f"f[{dst.valid}:{dst.end}] = f[{src.valid}:{src.end}]"]


def add_header(builder, params, widths, emitter):
    header = builder.layout.headers[params[0]["value"]]
    emitter.invalidate(range(header.valid, header.end))
    return [f"if not f[{header.valid}]:",
            f"    f[{header.first}:{header.end}] = {[0] * len(header.fields)!r}",
            f"    f[{header.valid}] = 1",
            f"    f[{builder.layout.plen}] += {header.nbits // 8}"]


def remove_header(builder, params, widths, emitter):
    header = builder.layout.headers[params[0]["value"]]
    emitter.invalidate([header.valid])
    return [f"if f[{header.valid}]:", f"    f[{header.valid}] = 0", f"    f[{builder.layout.plen}] -= {header.nbits // 8}"]


def push_or_pop(op: str) -> Primitive:
    """push_front(n) / pop_front(n): elements move n places up / down, the n freed ones
    become invalid, the next index follows (clamped), packet length by the valid count."""
    def generate(builder, params, widths, emitter):
        layout = builder.layout
        if params[0]["type"] != "header_stack" or params[1]["type"] != "hexstr":
            raise UnsupportedConstruct(f"{op} on a {params[0]['type']} with a {params[1]['type']} count")
        next_slot, elements = layout.stack(params[0]["value"])
        size, n = len(elements), hex_value(params[1]["value"])
        valid = " + ".join(f"f[{e.valid}]" for e in elements)
        out = [f"_nv = {valid}"]
        order = range(size - 1, -1, -1) if op == "push" else range(size)
        for i in order:
            src = i - n if op == "push" else i + n
            dst = elements[i]
            if 0 <= src < size:
                out.append(f"f[{dst.valid}:{dst.end}] = f[{elements[src].valid}:{elements[src].end}]")
            else:
                out.append(f"f[{dst.valid}:{dst.end}] = {[0] * (1 + len(dst.fields))!r}")
        out.append(f"f[{next_slot}] = min({size}, f[{next_slot}] + {n})" if op == "push"
                   else f"f[{next_slot}] = max(0, f[{next_slot}] - {n})")
        out.append(f"f[{layout.plen}] += ({valid} - _nv) * {elements[0].nbits // 8}")
        emitter.invalidate([next_slot] + [s for e in elements for s in range(e.valid, e.end)])
        return out
    return generate


def mark_to_drop(builder, params, widths, emitter):
    egress_spec = builder.slots["egress_spec"]
    out = [f"f[{egress_spec}] = {builder.drop_port}"]
    written = [egress_spec]
    if "mcast_grp" in builder.slots:
        out.append(f"f[{builder.slots['mcast_grp']}] = 0")
        written.append(builder.slots["mcast_grp"])
    emitter.invalidate(written)
    return out


def register_read(builder, params, widths, emitter):
    slot = builder.lvalue(params[0])
    register = builder.register(params[1])
    index = _value(builder, emitter, params[2], widths)
    out = emitter.take_pre()
    out += [f"if {index} < {builder.registers[register]}:",
            f"    f[{slot}] = {builder.exprs.register_cell(register, index)}"]
    emitter.invalidate([slot])
    return out


def register_write(builder, params, widths, emitter):
    register = builder.register(params[0])
    index = _value(builder, emitter, params[1], widths)
    value_node = builder.exprs.node(params[2], widths)
    value = emitter.expr(value_node)
    width = builder.reg_widths[register]
    value_width = builder.exprs.width(value_node)
    if value_width is None or value_width > width:
        value = f"{value} & {(1 << width) - 1}"
    number = builder.exprs.register_index[register]
    out = emitter.take_pre()
    cell = builder.exprs.register_cell(register, index)
    out += [f"if {index} < {builder.registers[register]}:", f"    {cell} = {value}"]
    if builder.traced:
        out.append(f"    _trace.reg({number}, {index}, {cell})")
    return out  # no temporary reads a register (ExpressionEmitter.expr binds none): none to forget


def count(builder, params, widths, emitter):
    name = params[0]["value"]
    counter = builder.counters.get(name)
    if counter is None:
        raise ProgramError(f"unknown counter {name!r}")
    index = _value(builder, emitter, params[1], widths)
    number = builder.counter_index[name]
    out = emitter.take_pre()
    out += [f"if {index} < {counter['size']}:",
            f"    CP_{number}[{index}] += 1",
            f"    CB_{number}[{index}] += f[{builder.layout.ilen}]"]
    if builder.traced:
        out.append(f"    _trace.count({number}, {index})")
    return out


def _set_masked(builder, emitter, slot: int, value: str) -> list[str]:
    """`f[slot] = value` cut to the field's width, after the statements `value` needs."""
    out = emitter.take_pre()
    out.append(f"f[{slot}] = {value} & {(1 << builder.layout.widths[slot]) - 1}")
    emitter.invalidate([slot])
    return out


def hash_based_offset(builder, params, widths, emitter):
    slot = builder.lvalue(params[0])
    base = _value(builder, emitter, params[1], widths)
    calculation = params[2]["value"]
    if calculation not in builder.calcs:
        raise ProgramError(f"unknown calculation {calculation!r}")
    size = _value(builder, emitter, params[3], widths)
    return _set_masked(builder, emitter, slot, f"({base} + _hmod(K_{builder.calc_index[calculation]}(f), {size}))")


def random_uniform(builder, params, widths, emitter):
    slot = builder.lvalue(params[0])
    lo, hi = _value(builder, emitter, params[1], widths), _value(builder, emitter, params[2], widths)
    return _set_masked(builder, emitter, slot, f"_rng.randint({lo}, max({lo}, {hi}))")


def exit_pipeline(builder, params, widths, emitter):
    return ["raise _Exit()"]


def no_effect(builder, params, widths, emitter):
    """log_msg (bmv2 prints it with --log-console only), assume/assert (bmv2 aborts the
    switch on failure; this one keeps forwarding)."""
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
