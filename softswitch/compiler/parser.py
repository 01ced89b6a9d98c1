"""The parser: one function P_<n>(f, data, off) per parse state returning the next state and
offset, and parse(f, data) running them from the initial state, catching parser errors
(the packet keeps the headers extracted so far) and verifying checksums."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..compiler_errors import ProgramError, UnsupportedConstruct
from .calculations import generate_checksums
from .expressions import ExpressionEmitter
from .layout import HeaderLayout, header_struct, hex_value
from .primitives import PRIMITIVES, generate_primitive

if TYPE_CHECKING:
    from .program import ProgramBuilder


def generate_parser(builder: ProgramBuilder, parser: dict) -> None:
    states = {s["name"]: s for s in parser["parse_states"]}
    if len(states) != len(parser["parse_states"]):
        raise ProgramError("two parser states with one name")
    state_fn = {name: f"P_{i}" for i, name in enumerate(states)}
    builder.state_names = list(states)
    for number, state in enumerate(parser["parse_states"]):
        builder.emit(f"def {state_fn[state['name']]}(f, data, off):")
        if builder.traced:
            builder.emit(f"_trace.state({number})", 1)
        for op in state["parser_ops"]:
            _generate_op(builder, state, op)
        _generate_transitions(builder, state, states, state_fn)
        builder.emit("")
    if parser["init_state"] not in states:
        raise ProgramError(f"unknown initial parser state {parser['init_state']!r}")
    error_slot = builder.slots.get("parser_error")
    builder.emit("def parse(f, data):")
    builder.emit(f"st = {state_fn[parser['init_state']]}", 1)
    builder.emit("off = 0", 1)
    builder.emit("try:", 1)
    builder.emit("while st is not None:", 2)
    builder.emit("st, off = st(f, data, off)", 3)
    builder.emit("except PErr as e:", 1)
    builder.emit("off = e.off", 2)
    if builder.traced:
        builder.emit("_trace.parser_error(e.code)", 2)
    builder.emit(f"f[{error_slot}] = e.code" if error_slot is not None else "pass", 2)
    generate_checksums(builder, verify=True, indent=1)
    builder.emit("return off", 1)
    builder.emit("")


def _generate_op(builder: ProgramBuilder, state: dict, op: dict) -> None:
    layout = builder.layout
    exprs = builder.exprs
    kind = op["op"]
    params = op["parameters"]
    if kind == "extract" and params[0]["type"] == "stack":
        # extract(stack.next): the element at the next index, StackOutOfBounds past the end
        next_slot, elements = layout.stack(params[0]["value"])
        builder.emit(f"if f[{next_slot}] >= {len(elements)}:", 1)
        builder.emit(f"raise PErr({builder.errors.get('StackOutOfBounds', 3)}, off)", 2)
        for i, header in enumerate(elements):
            builder.emit(f"{'if' if i == 0 else 'elif'} f[{next_slot}] == {i}:", 1)
            generate_extract(builder, header, 2)
        builder.emit(f"f[{next_slot}] += 1", 1)
    elif kind == "extract":
        if params[0]["type"] != "regular":
            raise UnsupportedConstruct(f"extract to a {params[0]['type']} in state {state['name']!r}")
        generate_extract(builder, layout.headers[params[0]["value"]], 1)
    elif kind == "set":
        slot = builder.lvalue(params[0])
        emitter = ExpressionEmitter(exprs)
        line = emitter.store(slot, exprs.node(params[1]))
        for pre in emitter.take_pre():
            builder.emit(pre, 1)
        builder.emit(line, 1)
    elif kind == "verify":
        emitter = ExpressionEmitter(exprs)
        cond = emitter.expr(exprs.node(params[0]))
        error = emitter.expr(exprs.node(params[1]))
        builder.emit(f"if not {cond}:", 1)
        builder.emit(f"raise PErr({error}, off)", 2)
    elif kind in ("advance", "shift"):
        amount = ExpressionEmitter(exprs).expr(exprs.node(params[0]))
        builder.emit(f"_n = ({amount}) // 8" if kind == "advance" else f"_n = ({amount})", 1)
        builder.emit("if off + _n > len(data):", 1)
        builder.emit(f"raise PErr({exprs.too_short}, off)", 2)
        builder.emit("off += _n", 1)
    elif kind == "primitive":
        primitive = params[0]
        if primitive["op"] not in PRIMITIVES or primitive["op"] == "exit":
            raise UnsupportedConstruct(f"primitive {primitive['op']!r} in parser state {state['name']!r}")
        for line in generate_primitive(builder, primitive, None, ExpressionEmitter(exprs)):
            builder.emit(line, 1)
    else:
        raise UnsupportedConstruct(f"parser operation {kind!r} in state {state['name']!r}")


def _generate_transitions(builder: ProgramBuilder, state: dict, states: dict, state_fn: dict) -> None:
    layout = builder.layout
    parts = []  # (code, bits): the select key, each part padded to whole bytes as bmv2 does
    for key in state.get("transition_key", []):
        if key["type"] == "field":
            slot = layout.field(key["value"])
            width = layout.widths[slot]
            parts.append((f"(f[{slot}] & {(1 << width) - 1})", (width + 7) // 8 * 8))
        elif key["type"] == "stack_field":  # stack.last.field: the element last extracted
            next_slot, elements = layout.stack(key["value"][0])
            slots = tuple(e.index(key["value"][1]) for e in elements)
            width = layout.widths[slots[0]]
            parts.append((f"(f[{slots!r}[f[{next_slot}] - 1]] & {(1 << width) - 1})", (width + 7) // 8 * 8))
        elif key["type"] == "lookahead":
            bit_offset, width = key["value"]
            parts.append((f"_lookahead(data, off, {bit_offset}, {width}, {builder.exprs.too_short})",
                          (width + 7) // 8 * 8))
        else:
            raise UnsupportedConstruct(f"transition key of type {key['type']!r} in state {state['name']!r}")
    if parts:
        code = parts[0][0]
        for part, bits in parts[1:]:
            code = f"(({code}) << {bits}) | {part}"
        builder.emit(f"k = {code}", 1)
    for transition in state["transitions"]:
        next_state = transition["next_state"]
        if next_state is not None and next_state not in states:
            raise ProgramError(f"state {state['name']!r}: unknown next state {next_state!r}")
        target = state_fn[next_state] if next_state is not None else "None"
        if transition["type"] == "default":
            builder.emit(f"return {target}, off", 1)
            return
        if transition["type"] != "hexstr":
            raise UnsupportedConstruct(f"transition of type {transition['type']!r} in state {state['name']!r}")
        value = hex_value(transition["value"])
        if transition.get("mask") is not None:
            mask = hex_value(transition["mask"])
            builder.emit(f"if k & {mask} == {value & mask}:", 1)
        else:
            builder.emit(f"if k == {value}:", 1)
        builder.emit(f"return {target}, off", 2)
    builder.emit("return None, off", 1)


def generate_extract(builder: ProgramBuilder, header: HeaderLayout, indent: int) -> None:
    nbytes = header.nbits // 8
    if header.nbits % 8:
        raise ProgramError(f"header {header.name!r} is not a whole number of bytes")
    builder.emit(f"if off + {nbytes} > len(data):", indent)
    builder.emit(f"raise PErr({builder.exprs.too_short}, off)", indent + 1)
    if header_struct(header) is not None:
        builder.emit(f"f[{header.first}:{header.end}] = S_{builder.header_index[header.name]}.unpack_from(data, off)",
                     indent)
    else:
        builder.emit(f"v = int.from_bytes(data[off:off + {nbytes}], 'big')", indent)
        shift = header.nbits
        for i, (_, width, signed) in enumerate(header.fields):
            shift -= width
            value = f"(v >> {shift}) & {(1 << width) - 1}" if shift else f"v & {(1 << width) - 1}"
            if signed:
                half = 1 << (width - 1)
                value = f"((({value}) + {half}) & {(1 << width) - 1}) - {half}"
            builder.emit(f"f[{header.first + i}] = {value}", indent)
    builder.emit(f"f[{header.valid}] = 1", indent)
    builder.emit(f"off += {nbytes}", indent)
    if builder.traced:
        builder.emit(f"_trace.extract({builder.header_index[header.name]})", indent)
