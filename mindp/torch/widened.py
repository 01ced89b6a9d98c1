"""Whether float32 parameters hold fp16 values widened, in one compiled pass.

DataParallel checks each step that no parameter was edited through `.data` since the network wrote
it (parallel.DataParallel._check_values): every element read again. Through torch (a scratch block
copied and compared, a Python turn a block) that was 1.5 ms a step for the 1.3M gpt; here 0.8
(bench/checks.py).
Widening fp16 to float32 is exact, so every value but a NaN has one float32 form (numpy's, a
table of all 65,536 patterns). A NaN is the same as any NaN: torch's vector and scalar copies give
one different payloads and signs (fp16 0xFE00 becomes 0xFFC00000 or 0x7FFFFFFF), and which one a
parameter gets depends on where its elements fall in the copy.
"""
from __future__ import annotations

import functools

import numpy as np

from host_agent import fused

COMPILED = not fused.NUMPY_ONLY  # without numba, parallel compares through torch

if COMPILED:
    import numba

    @numba.njit(nogil=True, cache=True)
    def _same(bits, half, table):
        for i in range(bits.shape[0]):
            b, h = bits[i], half[i]
            if b != table[h]:
                if (h & 0x7C00) != 0x7C00 or not h & 0x3FF or (b & 0x7F800000) != 0x7F800000 or not b & 0x7FFFFF:
                    return False  # (not both NaNs)
        return True


@functools.cache
def table() -> np.ndarray:
    """The float32 bits of each fp16 bit pattern widened, indexed by the pattern."""
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32).view(np.uint32)


def same(bits: np.ndarray, half: np.ndarray) -> bool:
    """Whether the float32 bits `bits` are the fp16 bits `half` widened, element for element (both
    flat, as long; a NaN matches any NaN). Needs numba (COMPILED)."""
    return bits.shape == half.shape and _same(bits, half, table())


def warm() -> None:
    """Compile (or load from numba's cache) the comparison now, not within a step."""
    if COMPILED:
        same(np.zeros(1, np.uint32), np.zeros(1, np.uint16))
