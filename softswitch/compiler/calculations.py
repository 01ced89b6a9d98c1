"""Calculations (field lists hashed by an algorithm) and the checksums verified after the
parser and updated before the deparser, as bm_sim's calculations and checksums."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..compiler_errors import ProgramError, UnsupportedConstruct
from .expressions import ExpressionEmitter
from .layout import hex_value

if TYPE_CHECKING:
    from .program import ProgramBuilder


def generate_calculation(builder: ProgramBuilder, calculation: dict) -> None:
    """K_<n>(f): the calculation's inputs packed into bytes, through its algorithm H_<n>."""
    layout = builder.layout
    index = builder.calc_index[calculation["name"]]
    builder.emit(f"def K_{index}(f):")
    builder.emit("v = 0", 1)
    builder.emit("n = 0", 1)
    for source in calculation["input"]:
        kind = source["type"]
        if kind == "field":
            slot = layout.field(source["value"])
            header = layout.headers[source["value"][0]]
            width = layout.widths[slot]
            builder.emit(f"if f[{header.valid}]:", 1)
            builder.emit(f"v = (v << {width}) | (f[{slot}] & {(1 << width) - 1}); n += {width}", 2)
        elif kind == "hexstr":
            width = source["bitwidth"]
            builder.emit(f"v = (v << {width}) | {hex_value(source['value']) & ((1 << width) - 1)}; n += {width}", 1)
        elif kind == "header":
            header = layout.headers[source["value"]]
            builder.emit(f"if f[{header.valid}]:", 1)
            for i, (_, width, _) in enumerate(header.fields):
                builder.emit(f"v = (v << {width}) | (f[{header.first + i}] & {(1 << width) - 1}); n += {width}", 2)
        else:
            raise UnsupportedConstruct(f"calculation input of type {kind!r} in {calculation['name']!r}")
    builder.emit("pad = -n % 8", 1)
    builder.emit(f"return H_{index}((v << pad).to_bytes((n + pad) // 8, 'big'))", 1)
    builder.emit("")


def generate_checksums(builder: ProgramBuilder, verify: bool, indent: int) -> None:
    """verify: a mismatch sets standard_metadata.checksum_error; else the target field is rewritten."""
    for checksum in builder.j.get("checksums", []):
        if checksum.get("type", "generic") != "generic":
            raise UnsupportedConstruct(f"checksum type {checksum.get('type')!r} ({checksum['name']!r})")
        if not checksum.get("verify" if verify else "update", True):
            continue
        if checksum["calculation"] not in builder.calcs:
            raise ProgramError(f"checksum {checksum['name']!r}: unknown calculation {checksum['calculation']!r}")
        calc = builder.calc_index[checksum["calculation"]]
        target = builder.layout.field(checksum["target"])
        emitter = ExpressionEmitter(builder.exprs)
        cond = emitter.expr(builder.exprs.node(checksum["if_cond"])) if checksum.get("if_cond") else "True"
        mask = (1 << builder.layout.widths[target]) - 1
        builder.emit(f"if {cond}:", indent)
        if verify:
            error_slot = builder.slots.get("checksum_error")
            builder.emit(f"if K_{calc}(f) & {mask} != f[{target}]:", indent + 1)
            builder.emit(f"f[{error_slot}] = 1" if error_slot is not None else "pass", indent + 2)
        else:
            builder.emit(f"f[{target}] = K_{calc}(f) & {mask}", indent + 1)
