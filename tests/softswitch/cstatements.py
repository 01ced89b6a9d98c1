"""Statements of generated C run on a packet-state array: the native passes' tests compare a pass's
output with its input on the same cells."""
from __future__ import annotations

import ctypes

from softswitch.native import build, cprogram


def run(lines: list[str], cells: list[int]) -> list[int]:
    """The cells after `lines` (C statements on `uint64_t *f`) ran on them."""
    source = cprogram.PRELUDE.read_text() + "void run(uint64_t *f) {\n" + "\n".join(lines) + "\n}\n"
    lib = ctypes.CDLL(str(build.build(source)))
    array = (ctypes.c_uint64 * len(cells))(*cells)
    lib.run(array)
    return list(array)
