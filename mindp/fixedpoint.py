"""Exact fixed point for in-network sums (docs/DESIGN.md invariant 1).

Every finite fp16 value is an integer multiple of 2**-24 with magnitude below
2**16, so x * 2**24 is an integer of at most 41 bits. The switch converts each
element exactly this way (sign, exponent, mantissa) and adds in 64 bits; this
module is the numpy reference for that conversion and for the sum.
"""
from __future__ import annotations

import numpy as np

from .protocol import SCALE_BITS

SCALE = float(2**SCALE_BITS)


def fp16_to_fixed(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fp16 values -> (int64 values * 2**24, non-finite mask).

    Inf and NaN contribute 0 and are reported in the mask, as in the switch.
    """
    bits = np.ascontiguousarray(values, dtype=np.float16).view(np.uint16).astype(np.int64)
    sign = bits >> 15
    exp = (bits >> 10) & 0x1F
    man = bits & 0x3FF
    shift = np.where(exp == 0, 0, exp - 1)
    mag = np.where(exp == 0, man, man | 0x400) << shift
    fixed = np.where(sign == 1, -mag, mag)
    nonfinite = exp == 0x1F
    fixed[nonfinite] = 0
    return fixed, nonfinite


def to_fp16(values: np.ndarray) -> np.ndarray:
    """float32 or float64 values -> fp16 rounded to nearest even: numpy's `astype(np.float16)` bit
    for bit (NaN payloads included), without its scalar loop for results below fp16's normal
    range, 30x slower than the rest, where most gradients land. There fp16 values are the
    multiples of 2**-24, so rounding |x| * 2**24 (exact: a power of two) to an integer is the
    conversion."""
    x = np.asarray(values)
    if x.dtype == np.float16:  # nothing to round (and 2**24 below is no fp16)
        return x.copy()
    mag = np.abs(x)
    small = mag < 2.0**-14  # False for NaN: astype keeps its payload
    if np.count_nonzero(small) * 10 < small.size:  # a few: the scalar loop costs less than the passes below
        return x.astype(np.float16)
    units = np.rint(np.fmin(mag, 2.0**-14) * 2.0**24).astype(np.uint16)  # <= 1024: 0x400 is 2**-14
    tiny = units | (np.signbit(x).astype(np.uint16) << 15)
    rest = np.where(small, 0, x).astype(np.float16).view(np.uint16)
    return np.where(small, tiny, rest).view(np.float16)


def fixed_to_float64(fixed: np.ndarray) -> np.ndarray:
    """int64 fixed point -> float64; exact while |fixed| < 2**53."""
    return np.asarray(fixed, dtype=np.int64).astype(np.float64) / SCALE


def fixed_to_fp16(fixed: np.ndarray) -> np.ndarray:
    """The inverse of fp16_to_fixed for one value (round to nearest fp16 beyond)."""
    return to_fp16(fixed_to_float64(fixed))


def exact_sum(contributions: list[np.ndarray] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact sum of several workers' fp16 vectors.

    Returns (int64 sum at scale 2**24, per-element non-finite mask over all
    workers). The sum is independent of order and exact for up to 2**22 workers.
    """
    stacked = np.asarray(contributions, dtype=np.float16)
    if stacked.ndim == 1:
        stacked = stacked[None, :]
    fixed, nonfinite = fp16_to_fixed(stacked)
    return fixed.sum(axis=0, dtype=np.int64), nonfinite.any(axis=0)
