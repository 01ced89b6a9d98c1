"""The parser, calculations, checksums and deparser as C, the counterparts of
softswitch.compiler.parser, .calculations and .deparser. A parser error leaves `off` where the
state that raised it started extracting, as the Python path's ParserError does."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..compiler.layout import HeaderLayout, hex_value
from ..compiler_errors import UnsupportedConstruct
from .cactions import PRIMITIVES, generate_primitive
from .cexpr import FIELD_BITS, MAX_BITS, CExpr, c_const
from .croll import roll

if TYPE_CHECKING:
    from .cprogram import CBuilder

MAX_CALC_BITS = 4096  # the bits_t buffer of prelude.h
HASHES = {"csum16": "h_csum16", "crc32": "h_crc32", "crc16": "h_crc16", "identity": "h_identity",
          "xor16": "h_xor16"}


def generate_calculation(cb: CBuilder, calculation: dict) -> None:
    layout = cb.layout
    index = cb.py.calc_index[calculation["name"]]
    cb.emit(f"static i128 K_{index}(const uint64_t *f) {{")
    cb.emit("bits_t s; s.n = 0;", 1)
    total = 0
    for source in calculation["input"]:
        kind = source["type"]
        if kind == "field":
            slot = layout.field(source["value"])
            header = layout.headers[source["value"][0]]
            width = layout.widths[slot]
            cb.emit(f"if (f[{header.valid}]) bits_put(&s, {width}, f[{slot}]);", 1)
            total += width
        elif kind == "hexstr":
            width = source["bitwidth"]
            if width > FIELD_BITS:
                raise UnsupportedConstruct(f"a calculation constant of {width} bits")
            value = hex_value(source["value"]) & ((1 << width) - 1)
            cb.emit(f"bits_put(&s, {width}, {value}ULL);", 1)
            total += width
        elif kind == "header":
            header = layout.headers[source["value"]]
            fields = " ".join(f"bits_put(&s, {w}, f[{header.first + i}]);" for i, (_, w, _) in
                              enumerate(header.fields))
            cb.emit(f"if (f[{header.valid}]) {{ {fields} }}", 1)
            total += header.nbits
        else:
            raise UnsupportedConstruct(f"calculation input of type {kind!r} in {calculation['name']!r}")
    if total > MAX_CALC_BITS:
        raise UnsupportedConstruct(f"calculation {calculation['name']!r} over {total} bits")
    if calculation["algo"] == "identity" and (total + 7) // 8 * 8 > MAX_BITS:
        raise UnsupportedConstruct(f"identity hash over {total} bits")
    cb.emit(f"return {HASHES[calculation['algo']]}(s.b, (s.n + 7) >> 3);", 1)
    cb.emit("}")


def generate_checksums(cb: CBuilder, verify: bool, indent: int) -> None:
    for checksum in cb.j.get("checksums", []):
        if not checksum.get("verify" if verify else "update", True):
            continue
        calc = cb.py.calc_index[checksum["calculation"]]
        target = cb.layout.field(checksum["target"])
        e = CExpr(cb.exprs)
        cond = e.exact(cb.exprs.node(checksum["if_cond"])) if checksum.get("if_cond") else "1"
        mask = c_const((1 << cb.layout.widths[target]) - 1)
        if verify:
            error_slot = cb.slots.get("checksum_error")
            action = f"f[{error_slot}] = 1;" if error_slot is not None else ""
            cb.emit(f"if ({cond}) {{ if ((K_{calc}(f) & {mask}) != {e.load(target)}) {{ {action} }} }}", indent)
        else:
            if cb.layout.signed[target]:
                raise UnsupportedConstruct(f"checksum {checksum['name']!r} into a signed field")
            cb.emit(f"if ({cond}) {{ f[{target}] = {e.stored(target, f'(K_{calc}(f) & {mask})')}; }}", indent)


def generate_parser(cb: CBuilder, parser: dict) -> None:
    states = {s["name"]: i for i, s in enumerate(parser["parse_states"])}
    cb.emit("static int64_t parse(uint64_t *f, const uint8_t *data, int64_t len) {")
    cb.emit("int64_t off = 0; int64_t err = 0; i128 k = 0; (void)k; (void)err; GROUPS", 1)
    cb.emit(f"goto P_{states[parser['init_state']]};", 1)
    for number, state in enumerate(parser["parse_states"]):
        cb.emit(f"P_{number}:", 0)
        for op in state["parser_ops"]:
            _generate_op(cb, state, op)
        _generate_transitions(cb, state, states)
    error_slot = cb.slots.get("parser_error")
    cb.emit("perr:", 0)
    cb.emit(f"f[{error_slot}] = (uint64_t)err;" if error_slot is not None else ";", 1)
    cb.emit("done:", 0)
    generate_checksums(cb, verify=True, indent=1)
    cb.emit("return off;", 1)
    cb.emit("}")


def _raise(code) -> str:
    return f"{{ err = {code}; goto perr; }}"


def _generate_op(cb: CBuilder, state: dict, op: dict) -> None:
    layout = cb.layout
    kind = op["op"]
    params = op["parameters"]
    too_short = cb.exprs.too_short
    e = CExpr(cb.exprs, in_parser=True)
    if kind == "extract" and params[0]["type"] == "stack":
        next_slot, elements = layout.stack(params[0]["value"])
        cb.emit(f"if (f[{next_slot}] >= {len(elements)}) {_raise(cb.py.errors.get('StackOutOfBounds', 3))}", 1)
        for i, header in enumerate(elements):
            cb.emit(f"{'if' if i == 0 else 'else if'} (f[{next_slot}] == {i}) {{", 1)
            generate_extract(cb, header, 2)
            cb.emit("}", 1)
        cb.emit(f"f[{next_slot}] += 1;", 1)
    elif kind == "extract":
        generate_extract(cb, layout.headers[params[0]["value"]], 1)
    elif kind == "set":
        slot = cb.py.lvalue(params[0])
        cb.parser_writes.add(slot)
        line = e.store(slot, cb.exprs.node(params[1]))
        for pre in e.precheck(too_short):
            cb.emit(pre, 1)
        cb.emit(line, 1)
    elif kind == "verify":
        cond = e.exact(cb.exprs.node(params[0]))
        error = e.exact(cb.exprs.node(params[1]))
        for pre in e.precheck(too_short):
            cb.emit(pre, 1)
        cb.emit(f"if (!{cond}) {_raise(f'(int64_t){error}')}", 1)
    elif kind in ("advance", "shift"):
        amount = e.nonneg(cb.exprs.node(params[0]), "an advance amount")
        for pre in e.precheck(too_short):
            cb.emit(pre, 1)
        step = f"({amount}) / 8" if kind == "advance" else f"({amount})"
        cb.emit(f"{{ i128 _n = {step}; if (off + _n > len) {_raise(too_short)} off += (int64_t)_n; }}", 1)
    elif kind == "primitive":
        primitive = params[0]
        if primitive["op"] not in PRIMITIVES or primitive["op"] == "exit":
            raise UnsupportedConstruct(f"primitive {primitive['op']!r} in parser state {state['name']!r}")
        lines = generate_primitive(cb, primitive, None, e)
        cb.parser_writes.update(int(c) for line in lines for c in re.findall(r"\bf\[(\d+)\]", line))
        for line in e.precheck(too_short) + lines:
            cb.emit(line, 1)
    else:
        raise UnsupportedConstruct(f"parser operation {kind!r} in state {state['name']!r}")


def _generate_transitions(cb: CBuilder, state: dict, states: dict) -> None:
    layout = cb.layout
    e = CExpr(cb.exprs, in_parser=True)
    parts = []
    for key in state.get("transition_key", []):
        if key["type"] == "field":
            slot = layout.field(key["value"])
            width = layout.widths[slot]
            parts.append((f"({e.load(slot)} & {c_const((1 << width) - 1)})", (width + 7) // 8 * 8))
        elif key["type"] == "stack_field":
            next_slot, elements = layout.stack(key["value"][0])
            slots = [el.index(key["value"][1]) for el in elements]
            width = layout.widths[slots[0]]
            if width > FIELD_BITS:
                raise UnsupportedConstruct(f"a field of {width} bits")
            table = ", ".join(str(s) for s in slots)
            parts.append((f"({{ static const int _s[] = {{{table}}}; int64_t _j = (int64_t)f[{next_slot}] - 1; "
                          f"if (_j < 0) _j += {len(slots)}; (i128)(f[_s[_j]] & {(1 << width) - 1}ULL); }})",
                          (width + 7) // 8 * 8))
        elif key["type"] == "lookahead":
            bit_offset, width = key["value"]
            parts.append((e.code(("lk", bit_offset, width)), (width + 7) // 8 * 8))
        else:
            raise UnsupportedConstruct(f"transition key of type {key['type']!r} in state {state['name']!r}")
    total = sum(bits for _, bits in parts)
    if total > MAX_BITS:
        raise UnsupportedConstruct(f"a parser select key of {total} bits in state {state['name']!r}")
    for pre in e.precheck(cb.exprs.too_short):
        cb.emit(pre, 1)
    if parts:
        code = parts[0][0]
        for part, bits in parts[1:]:
            code = f"(({code} << {bits}) | {part})"
        cb.emit(f"k = {code};", 1)
    for transition in state["transitions"]:
        next_state = transition["next_state"]
        target = f"goto P_{states[next_state]};" if next_state is not None else "goto done;"
        if transition["type"] == "default":
            cb.emit(target, 1)
            return
        value = hex_value(transition["value"])
        mask = hex_value(transition["mask"]) if transition.get("mask") is not None else None
        if mask is not None:
            value &= mask
        if value.bit_length() > MAX_BITS or (mask is not None and mask.bit_length() > MAX_BITS) or value < 0:
            continue  # wider than any key: never equal
        test = f"(k & {c_const(mask)}) == {c_const(value)}" if mask is not None else f"k == {c_const(value)}"
        cb.emit(f"if ({test}) {target}", 1)
    cb.emit("goto done;", 1)


def generate_extract(cb: CBuilder, header: HeaderLayout, indent: int) -> None:
    nbytes = header.nbits // 8
    cb.emit(f"if (off + {nbytes} > len) {_raise(cb.exprs.too_short)}", indent)
    bit = 0
    lines = []
    for i, (_, width, signed) in enumerate(header.fields):
        if width > FIELD_BITS:
            raise UnsupportedConstruct(f"field {header.name}.{header.fields[i][0]} of {width} bits")
        value = f"get_bits(data + off, {bit}, {width})" if not _whole(bit, width) else \
            f"get_be{width}(data + off + {bit // 8})"
        if signed:
            h = 1 << (width - 1)
            value = f"(uint64_t)(int64_t)(((i128){value} + {c_const(h)} & {c_const((1 << width) - 1)}) - {c_const(h)})"
        lines.append(f"f[{header.first + i}] = {value};")
        bit += width
    for line in roll(lines):
        cb.emit(line, indent)
    cb.emit(f"f[{header.valid}] = 1; off += {nbytes};", indent)


def generate_deparser(cb: CBuilder, deparser: dict) -> None:
    """deparse(): the frame into `out` (cap bytes); its length, or -1 when it does not fit."""
    cb.emit("static int64_t deparse(uint64_t *f, const uint8_t *data, int64_t len, int64_t off, uint8_t *out, "
            "int64_t cap) {")
    cb.emit("GROUPS", 1)
    generate_checksums(cb, verify=False, indent=1)
    headers = [cb.layout.headers[name] for name in deparser["order"]]
    size = " + ".join(f"(f[{h.valid}] ? {h.nbits // 8} : 0)" for h in headers) or "0"
    cb.emit(f"int64_t total = {size} + (len - off);", 1)
    cb.emit("if (total > cap) return -1;", 1)
    cb.emit("uint8_t *p = out;", 1)
    for h in headers:
        bit = 0
        puts = []
        for i, (_, width, _) in enumerate(h.fields):
            puts.append(f"put_bits(p, {bit}, {width}, f[{h.first + i}]);" if not _whole(bit, width) else
                        f"put_be{width}(p + {bit // 8}, f[{h.first + i}]);")
            bit += width
        cb.emit(f"if (f[{h.valid}]) {{", 1)
        for line in roll(puts):
            cb.emit(line, 2)
        cb.emit(f"p += {h.nbits // 8};", 2)
        cb.emit("}", 1)
    cb.emit("memcpy(p, data + off, (size_t)(len - off));", 1)
    cb.emit("return total;", 1)
    cb.emit("}")


def _whole(bit: int, width: int) -> bool:
    """A field of whole bytes that one load or store moves: a rolled loop's offset is no constant,
    so get_bits could not pick that path itself (and the loop would not vectorise)."""
    return bit % 8 == 0 and width in (8, 16, 32, 64)
