"""The optimizer node's update for any CPU (ARM, an x86 without AVX2 or F16C): plain numba loops,
no x86 intrinsic and no fp16 type, bit-identical to fused's AVX2 kernel and to the reference
composition (mean_gradient, apply, astype(float16)).

The same float32 operations in the same order (numba sets no fast-math flag, so LLVM fuses
nothing into FMA on any target), the mean gradient by the reference's float64 arithmetic, and the
fp16 conversion by numpy's rule in integer arithmetic (`half_bits`): round to nearest even, a NaN
keeps the top of its payload (never 0: a signalling NaN is not quieted, unlike F16C's).
"""
from __future__ import annotations

import numba
import numpy as np

from mindp.protocol import SCALE_BITS, K

from . import jitcache

jitcache.use()

BLOCK = max(1, 2048 // K)  # records per task of the parallel loop, as the AVX2 kernel's
_INV_SCALE = 2.0**-SCALE_BITS


@numba.njit(inline="always")
def half_bits(b):
    """float32 bits (an int64 holding 0..2**32-1) -> numpy's fp16 bits for them (npy_floatbits_to_halfbits),
    as selects between the cases, so that LLVM may vectorise the loop around it."""
    a = b & 0x7FFFFFFF
    sign = (b >> 16) & 0x8000
    nan = 0x7C00 | ((a & 0x7FFFFF) >> 13)
    nan = 0x7C01 if nan == 0x7C00 else nan
    # A normal fp16: drop 13 bits, round to nearest even (a carry may reach the exponent: right).
    normal = (a - 0x38000000 + 0xFFF + ((a >> 13) & 1)) >> 13
    # A subnormal fp16 (or zero): the significand with its implicit bit, in units of 2**-24, rounded
    # the same way; shifts past 25 give 0 anyway (the clamp keeps every shift defined).
    shift = min(max(126 - (a >> 23), 14), 25)
    sig = (a & 0x7FFFFF) | 0x800000
    q, rest, half = sig >> shift, sig & ((1 << shift) - 1), 1 << (shift - 1)
    sub = q + np.int64((rest > half) | ((rest == half) & ((q & 1) == 1)))
    r = sub if a < 0x38800000 else (normal if a < 0x477FF000 else 0x7C00)  # 0x477FF000 rounds to inf
    return sign | (nan if a > 0x7F800000 else r)


@numba.njit(inline="always")
def _gradients(sums, nw, i, g):
    """g = record i's float32 mean gradients: float64(sum) * 2**-24 / nworkers, as mean_gradient."""
    d = nw[i]
    for j in range(K):
        g[j] = np.float32(np.float64(sums[i, j]) * _INV_SCALE / d)


@numba.njit(inline="always")
def _fp16_out(dst_bits, out, i):
    for j in range(K):
        out[i, j] = np.uint16(half_bits(np.int64(dst_bits[i, 0, j])))


_opts = dict(nogil=True, cache=True, error_model="numpy", parallel=True)


@numba.njit(**_opts)
def _adamw(src, dst, dst_bits, sums, nw, c, decay, out):
    n = src.shape[0]
    for b in numba.prange((n + BLOCK - 1) // BLOCK):
        g = np.empty(K, np.float32)
        for i in range(b * BLOCK, min(b * BLOCK + BLOCK, n)):
            _gradients(sums, nw, i, g)
            for j in range(K):
                p, m, v = src[i, 0, j], src[i, 1, j], src[i, 2, j]
                if decay:
                    p = p * c[0]
                m = m * c[1] + c[2] * g[j]
                v = v * c[3] + c[4] * (g[j] * g[j])
                den = np.sqrt(v) / c[5] + c[6]
                dst[i, 0, j], dst[i, 1, j], dst[i, 2, j] = p - (m / den) * c[7], m, v
            _fp16_out(dst_bits, out, i)


@numba.njit(**_opts)
def _sgd(src, dst, dst_bits, sums, nw, c, decay, out):
    n = src.shape[0]
    for b in numba.prange((n + BLOCK - 1) // BLOCK):
        g = np.empty(K, np.float32)
        for i in range(b * BLOCK, min(b * BLOCK + BLOCK, n)):
            _gradients(sums, nw, i, g)
            for j in range(K):
                p, m, gj = src[i, 0, j], src[i, 1, j], g[j]
                if decay:
                    gj = gj + c[0] * p
                m = m * c[1] + gj
                dst[i, 0, j], dst[i, 1, j] = p - c[2] * m, m
            _fp16_out(dst_bits, out, i)


KERNELS = {"adamw": _adamw, "sgd": _sgd}


def update(kind: str, src: np.ndarray, dst: np.ndarray, sums: np.ndarray, nw: np.ndarray, c: np.ndarray,
           decay: bool, out: np.ndarray) -> None:
    """fused.update_records' work (its arguments checked there): records src -> dst, out = the fp16
    bits (uint16) of the new masters; c = fused.scalars(cfg, step), nw float64 per record."""
    KERNELS[kind](src, dst, dst.view(np.uint32), sums, nw, c, decay, out)


@numba.njit(cache=True)
def _half_bits_of(bits, out):
    for i in range(len(bits)):
        out[i] = np.uint16(half_bits(np.int64(bits[i])))


def f16_bits(bits: np.ndarray) -> np.ndarray:
    """float32 bit patterns (uint32) -> the fp16 bits this kernel writes for them (uint16)."""
    out = np.empty(len(bits), np.uint16)
    _half_bits_of(np.ascontiguousarray(bits, np.uint32), out)
    return out
