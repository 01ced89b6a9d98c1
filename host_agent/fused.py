"""The optimizer node's whole job on a run of chunks in one pass: int64 sums in, the (master, m, v)
record read from one state copy and written to the other, fp16 parameters out.

`update_records` is bit-identical to composing `optim.mean_gradient`, `optim.apply` and
`astype(float16)` (the reference's path): the numba kernel performs the same IEEE float32
operations in the same order (numba without fastmath contracts nothing into FMA, and the scalars
are the same float32 roundings), and converts to fp16 with numpy's own rule (round to nearest
even; a NaN keeps the top of its payload). Without numba the numpy composition runs instead.
"""
from __future__ import annotations

import math
import os

import numpy as np

from mindp.protocol import K, SCALE_BITS

from . import optim
from .optim import OptimizerConfig

F32 = np.float32
MASTER, M, V = 0, 1, 2
_INV_SCALE = 2.0**-SCALE_BITS

try:  # numba is a dependency; the numpy path stays for platforms without an llvmlite wheel
    import numba
except ImportError:  # pragma: no cover - exercised by forcing NUMPY_ONLY
    numba = None

NUMPY_ONLY = numba is None or os.environ.get("MINDP_NO_NUMBA") == "1"
PARALLEL_MIN = 1 << 14  # chunks below which the kernel runs on one thread (thread wake-up costs more)


def scalars(cfg: OptimizerConfig, step: int) -> np.ndarray:
    """The float32 constants of one step, rounded exactly as `optim.apply` rounds them."""
    lr = cfg.lr
    if cfg.kind == "adamw":
        b1, b2 = cfg.betas
        t = step + 1
        return np.array([1.0 - lr * cfg.weight_decay, b1, 1.0 - b1, b2, 1.0 - b2, math.sqrt(1.0 - b2**t),
                         cfg.eps, lr / (1.0 - b1**t)], dtype=F32)
    return np.array([cfg.weight_decay, cfg.momentum, lr], dtype=F32)


def update_numpy(cfg: OptimizerConfig, src: np.ndarray, dst: np.ndarray, sums: np.ndarray, nworkers,
                 step: int, out: np.ndarray) -> None:
    """The reference composition (records (n, 3, K) float32, sums (n, K) int64, out (n, K) float16;
    nworkers an int or one count per record)."""
    nworkers = np.asarray(nworkers, dtype=np.int64).reshape(-1, 1) if np.ndim(nworkers) else nworkers
    if dst is not src:
        dst[...] = src
    g = optim.mean_gradient(sums, nworkers)
    optim.apply(cfg, dst[:, MASTER], dst[:, M], dst[:, V], g, step)
    out[...] = dst[:, MASTER].astype(np.float16)


if not NUMPY_ONLY:
    @numba.njit(inline="always")
    def _f16_bits(f):
        """float32 bits -> IEEE binary16 bits, numpy's npy_floatbits_to_halfbits rule."""
        sign = np.uint16((f >> np.uint32(16)) & np.uint32(0x8000))
        a = f & np.uint32(0x7FFFFFFF)
        if a >= np.uint32(0x7F800000):
            if a == np.uint32(0x7F800000):
                return sign | np.uint16(0x7C00)
            r = np.uint32(0x7C00) + ((a & np.uint32(0x7FFFFF)) >> np.uint32(13))
            if r == np.uint32(0x7C00):
                r = np.uint32(0x7C01)
            return sign | np.uint16(r)
        if a >= np.uint32(0x477FF000):  # >= 65520: rounds to infinity
            return sign | np.uint16(0x7C00)
        e = a >> np.uint32(23)
        mant = (a & np.uint32(0x7FFFFF)) | np.uint32(0x800000)
        if e < np.uint32(113):  # below 2**-14: a subnormal half (or zero)
            if e < np.uint32(102):
                return sign
            s = np.uint32(126) - e
            r = mant >> s
            rem = mant & ((np.uint32(1) << s) - np.uint32(1))
            half = np.uint32(1) << (s - np.uint32(1))
        else:
            r = ((e - np.uint32(112)) << np.uint32(10)) | ((a & np.uint32(0x7FFFFF)) >> np.uint32(13))
            rem = a & np.uint32(0x1FFF)
            half = np.uint32(0x1000)
        if rem > half or (rem == half and (r & np.uint32(1))):
            r += np.uint32(1)
        return sign | np.uint16(r)

    def _adamw(src, dst, bits, sums, nw, c, decay, out):
        n, _, k = src.shape
        for i in numba.prange(n):
            for j in range(k):
                g = np.float32(np.float64(sums[i, j]) * _INV_SCALE / nw[i])
                p = src[i, 0, j]
                if decay:
                    p = p * c[0]
                m = src[i, 1, j] * c[1]
                m = m + c[2] * g
                v = src[i, 2, j] * c[3]
                v = v + c[4] * (g * g)
                d = np.sqrt(v)
                d = d / c[5]
                d = d + c[6]
                u = m / d
                u = u * c[7]
                p = p - u
                dst[i, 0, j] = p
                dst[i, 1, j] = m
                dst[i, 2, j] = v
                out[i, j] = _f16_bits(bits[i, 0, j])

    def _sgd(src, dst, bits, sums, nw, c, decay, out):
        n, _, k = src.shape
        for i in numba.prange(n):
            for j in range(k):
                g = np.float32(np.float64(sums[i, j]) * _INV_SCALE / nw[i])
                p = src[i, 0, j]
                if decay:
                    g = g + c[0] * p
                m = src[i, 1, j] * c[1]
                m = m + g
                p = p - c[2] * m
                dst[i, 0, j] = p
                dst[i, 1, j] = m
                dst[i, 2, j] = src[i, 2, j]
                out[i, j] = _f16_bits(bits[i, 0, j])

    _opts = dict(nogil=True, cache=True, error_model="numpy")
    _kernels = {
        ("adamw", False): numba.njit(**_opts)(_adamw),
        ("adamw", True): numba.njit(parallel=True, **_opts)(_adamw),
        ("sgd", False): numba.njit(**_opts)(_sgd),
        ("sgd", True): numba.njit(parallel=True, **_opts)(_sgd),
    }
    
    @numba.njit(cache=True)
    def f16_bits(f):
        """Vectorised _f16_bits, for tests: uint32 array -> uint16 array."""
        out = np.empty(f.shape, np.uint16)
        for i in range(f.size):
            out[i] = _f16_bits(f[i])
        return out


def update_records(cfg: OptimizerConfig, src: np.ndarray, dst: np.ndarray, sums: np.ndarray, nworkers,
                   step: int, out: np.ndarray) -> None:
    """dst = one optimizer step of src with the mean of `sums` over `nworkers` (an int or one count
    per record); out = fp16(dst master). src may be dst."""
    if NUMPY_ONLY:
        update_numpy(cfg, src, dst, sums, nworkers, step, out)
        return
    kernel = _kernels[(cfg.kind, len(src) >= PARALLEL_MIN)]
    nw = np.broadcast_to(np.asarray(nworkers, dtype=np.float64).reshape(-1), (len(src),))
    kernel(src, dst, dst.view(np.uint32), sums, nw, scalars(cfg, step), cfg.weight_decay != 0.0, out.view(np.uint16))


def warm(cfg: OptimizerConfig) -> None:
    """Compile (or load from numba's cache) the kernels `cfg` uses, so the first step does not wait."""
    if NUMPY_ONLY:
        return
    for n in (1, PARALLEL_MIN):
        rec = np.zeros((n, 3, K), np.float32)
        update_records(cfg, rec, rec, np.zeros((n, K), np.int64), 1, 0, np.empty((n, K), np.float16))
