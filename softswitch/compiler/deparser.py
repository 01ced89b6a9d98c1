"""The deparser: checksums updated, then the valid headers in the JSON's order, then the
payload the parser did not consume."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..compiler_errors import ProgramError
from .calculations import generate_checksums
from .layout import header_struct

if TYPE_CHECKING:
    from .program import ProgramBuilder


def generate_deparser(builder: ProgramBuilder, deparser: dict) -> None:
    builder.emit("def deparse(f, data, off):")
    generate_checksums(builder, verify=False, indent=1)
    builder.emit("out = []", 1)
    for name in deparser["order"]:
        header = builder.layout.headers.get(name)
        if header is None:
            raise ProgramError(f"deparser: unknown header {name!r}")
        builder.emit(f"if f[{header.valid}]:", 1)
        if header_struct(header) is not None:
            builder.emit(f"out.append(S_{builder.header_index[name]}.pack(*f[{header.first}:{header.end}]))", 2)
            continue
        parts = []
        shift = header.nbits
        for i, (_, width, signed) in enumerate(header.fields):
            shift -= width
            value = f"(f[{header.first + i}] & {(1 << width) - 1})" if signed else f"f[{header.first + i}]"
            parts.append(f"({value} << {shift})" if shift else value)
        builder.emit(f"out.append(({' | '.join(parts)}).to_bytes({header.nbits // 8}, 'big'))", 2)
    builder.emit("out.append(data[off:])", 1)
    builder.emit("return b''.join(out)", 1)
    builder.emit("")
