"""A worker's gradients straight into its GRAD frames: one pass over a tensor rounds each element to
fp16, writes it big-endian into its frame row in place and marks the rows holding a non-finite
value (the frame's NONFINITE flag), with no per-frame Python work.

The rounding is numpy's `astype(float16)` bit for bit, NaN payloads included. float32 (torch's and
most models' gradients) is converted in the kernel: 8 lanes at a time by F16C where the node's
kernel is AVX2 (fused.half_lanes), else element by element (portable.half_bits). fp16 is taken as
it is; other dtypes are rounded by fixedpoint.to_fp16 first. Without numba, numpy does the same in
a few whole-array passes (numpy's fp16 cast and isfinite cost 10-12 ns an element; F16C 0.4).
"""
from __future__ import annotations

import threading

import numpy as np

from mindp import codec, fixedpoint
from mindp.protocol import K, Kind

from . import fused

#: Where a GRAD frame's elements start, in uint16 units of the frame (its length and this are even).
BODY16 = (codec.PREFIX_LEN + codec.HEADER_LEN) // 2
assert (codec.PREFIX_LEN + codec.HEADER_LEN) % 2 == 0 and codec.frame_len(Kind.GRAD) % 2 == 0

if not fused.NUMPY_ONLY:
    import numba
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from .portable import half_bits

    def _rounded8(context, builder, sig, args):
        """(src, i, out, o): the big-endian fp16 bits of float32 src[i:i + 8] (fused.half_lanes: F16C,
        to numpy's bits), their lanes as fp16 bits, and out[o]'s address as 8 int16 lanes."""
        sty, ity, oty, _ = sig.args
        f8, h8 = ir.VectorType(ir.FloatType(), 8), ir.VectorType(ir.IntType(16), 8)
        ps = builder.bitcast(fused.row_pointer(context, builder, sty, args[0], ity, args[1]), f8.as_pointer())
        po = builder.bitcast(fused.row_pointer(context, builder, oty, args[2], ity, args[3]), h8.as_pointer())
        h = fused.half_lanes(builder, builder.load(ps, align=4))
        bswap = cgutils.get_or_insert_function(builder.module, ir.FunctionType(h8, [h8]), "llvm.bswap.v8i16")
        return builder.call(bswap, [h]), h, po

    def _any8(builder, lanes):
        """8 i1 lanes -> nonzero int64 if one is set."""
        return builder.zext(builder.bitcast(lanes, ir.IntType(8)), ir.IntType(64))

    @intrinsic
    def _lanes8(typingctx, src, i, out, o):
        """out[o:o + 8] = the big-endian fp16 bits of float32 src[i:i + 8]; returns nonzero if one
        of them is Inf or NaN. Both 1-D, any alignment."""
        def codegen(context, builder, sig, args):
            swapped, h, po = _rounded8(context, builder, sig, args)
            builder.store(swapped, po, align=2)
            exp = ir.Constant(h.type, [0x7C00] * 8)
            return _any8(builder, builder.icmp_unsigned("==", builder.and_(h, exp), exp))
        return types.int64(src, i, out, o), codegen

    @intrinsic
    def _differs8(typingctx, src, i, out, o):
        """Nonzero if out[o:o + 8] are not what _lanes8 would write there."""
        def codegen(context, builder, sig, args):
            swapped, _, po = _rounded8(context, builder, sig, args)
            return _any8(builder, builder.icmp_unsigned("!=", builder.load(po, align=2), swapped))
        return types.int64(src, i, out, o), codegen

    @numba.njit(inline="always")
    def _be(h):
        """fp16 bits h as out holds them: big-endian."""
        return np.uint16(((h & 0xFF) << 8) | (h >> 8))

    @numba.njit(inline="always")
    def _store(out, at, h):
        """fp16 bits h into out[at] big-endian; 1 if h is Inf or NaN (an all-ones exponent), else 0."""
        out[at] = _be(h)
        return ((h & 0x7C00) + 0x400) >> 15

    @numba.njit(nogil=True, cache=True)
    def _put_avx2(src, bits, out, width, off, nonfinite, check):
        """src (float32; bits: its uint32 view) at flat element `off` on: into out (the frames' uint16
        view, flat; `width` uint16 a frame) as big-endian fp16, 8 elements at a time where a row's
        part allows; nonfinite[row] = 1 where a rounded value is Inf or NaN. check: write nothing,
        compare: 1 at the first element out does not hold as this would write it, else 0."""
        i, size = 0, src.shape[0]
        while i < size:
            row, col = divmod(off + i, K)
            m = min(K - col, size - i)
            at = row * width + BODY16 + col
            bad = 0
            j = 0
            while j + 8 <= m:
                if check:
                    if _differs8(src, i + j, out, at + j):
                        return 1
                else:
                    bad |= _lanes8(src, i + j, out, at + j)
                j += 8
            while j < m:
                h = half_bits(np.int64(bits[i + j]))
                if check:
                    if out[at + j] != _be(h):
                        return 1
                else:
                    bad |= _store(out, at + j, h)
                j += 1
            if bad:
                nonfinite[row] = 1
            i += m
        return 0

    @numba.njit(nogil=True, cache=True)
    def _put_bits(bits, half, out, width, off, nonfinite, check):
        """_put_avx2 one element at a time in integer arithmetic (any CPU): bits are float32 bits
        (half False: rounded by portable.half_bits) or fp16 bits already rounded (half True)."""
        i, size = 0, bits.shape[0]
        while i < size:
            row, col = divmod(off + i, K)
            m = min(K - col, size - i)
            at = row * width + BODY16 + col
            bad = 0
            for j in range(m):
                h = np.int64(bits[i + j]) if half else half_bits(np.int64(bits[i + j]))
                if check:
                    if out[at + j] != _be(h):
                        return 1
                else:
                    bad |= _store(out, at + j, h)
            if bad:
                nonfinite[row] = 1
            i += m
        return 0


def as_array(grad) -> np.ndarray:
    """A numpy array, or a torch tensor as reference.to_fp16 reads it (float32 on the CPU)."""
    if hasattr(grad, "detach"):
        grad = grad.detach().cpu().float().numpy()
    return np.asarray(grad)


def put(frames: np.ndarray, off: int, grad: np.ndarray, nonfinite: np.ndarray, kernel: str | None = None,
        scale: float = 1.0) -> None:
    """Elements off .. off + grad.size of the frames' flat element space (K a row) = grad / scale
    rounded to fp16, big-endian; nonfinite[row] set to 1 for rows that received an Inf or NaN (never
    cleared).

    frames: (n, GRAD frame length) uint8, C-contiguous; nonfinite: (n,) uint8; kernel: fused's
    'avx2', 'portable' or 'numpy' (default: fused.selected(), as the node's); scale (a loss scale;
    float32 gradients only): divided in float32 a block at a time, the bits of torch's
    `grad / scale`, not through a gradient's copy."""
    if nonfinite.shape != (len(frames),):
        raise ValueError(f"nonfinite has {nonfinite.shape} flags for {len(frames)} frames")
    _walk(frames, off, np.ravel(grad), nonfinite, kernel, scale, False)


def holds(frames: np.ndarray, off: int, grad: np.ndarray, kernel: str | None = None, scale: float = 1.0) -> bool:
    """Whether elements off .. off + grad.size of the frames are grad / scale as put() writes it
    (rounded to fp16), compared element by element in put()'s own kernel, which writes nothing then
    (the headers, which a pump thread may flag meanwhile, and other tensors' elements in the same
    rows are not looked at). Only the caller's put() writes elements. `scale` (a loss scale;
    float32 gradients only): divided as put() divides it when it sends."""
    return _walk(frames, off, np.ravel(grad), _NO_FLAGS, kernel, scale, True)


def _walk(frames: np.ndarray, off: int, flat: np.ndarray, nonfinite: np.ndarray, kernel: str | None, scale: float,
          check: bool) -> bool:
    """put() (check False: True), or holds()'s comparison (check True; nonfinite untouched)."""
    if not flat.size:  # (an empty tensor holds: put() writes nothing for it either)
        return True
    if frames.ndim != 2 or frames.shape[1] != codec.frame_len(Kind.GRAD) or not frames.flags.c_contiguous:
        raise ValueError("frames must be C-contiguous rows of GRAD frames")
    if not 0 <= off <= len(frames) * K - flat.size:
        raise ValueError(f"{flat.size} elements at {off} do not fit {len(frames)} frames")
    if scale != 1.0:
        _check_scaled(flat)
        step = HOLDS_ROWS * K
        for i in range(0, flat.size, step):
            part = flat[i : i + step]
            quotient = np.divide(part, np.float32(scale), out=_unscaled(part.size))
            if not _walk(frames, off + i, quotient, nonfinite, kernel, 1.0, check):
                return False
        return True
    kernel = kernel or fused.selected()
    out, width = frames.view(np.uint16), frames.shape[1] // 2
    if kernel == "numpy":
        if check:
            return _holds_numpy(frames, off, flat)
        _put_numpy(out, off, flat, nonfinite)
        return True
    if flat.dtype == np.float32:
        flat = np.ascontiguousarray(flat)
        if kernel == "avx2":
            return not _put_avx2(flat, flat.view(np.uint32), out.reshape(-1), width, off, nonfinite, check)
        return not _put_bits(flat.view(np.uint32), False, out.reshape(-1), width, off, nonfinite, check)
    return not _put_bits(_fp16_bits(flat), True, out.reshape(-1), width, off, nonfinite, check)


def _holds_numpy(frames: np.ndarray, off: int, flat: np.ndarray) -> bool:
    """holds() in numpy's passes: put() again into rows of its own (the first and last copied, for
    other tensors' elements there), HOLDS_ROWS at a time into this thread's scratch rows, and the
    elements compared."""
    i = 0
    while i < flat.size:
        row = (off + i) // K
        end = min(flat.size, (row + HOLDS_ROWS) * K - off)
        rows = frames[row : -(-(off + end) // K)]
        again, differ = _scratch(len(rows))
        again[[0, -1]] = rows[[0, -1]]
        _put_numpy(again.view(np.uint16), off + i - row * K, flat[i:end], np.zeros(len(again), np.uint8))
        body = slice(BODY16, None)
        if np.not_equal(again.view(np.uint16)[:, body], rows.view(np.uint16)[:, body], out=differ).any():
            return False
        i = end
    return True


_NO_FLAGS = np.zeros(1, np.uint8)  # holds()'s nonfinite: the kernels' argument, never written when comparing

#: Rows at a time where a gradient is divided by a scale, or compared in numpy's passes: 256 KiB of
#: frames, in a core's L2 with what is compared (a Python loop's turn a block).
HOLDS_ROWS = max(1, (256 << 10) // codec.frame_len(Kind.GRAD))
_scratches = threading.local()


def _check_scaled(flat: np.ndarray) -> None:
    if flat.dtype != np.float32:  # (torch divides fp16 in float32, a float64 gradient before its view)
        raise ValueError(f"gradframes divides float32 gradients by a scale, not {flat.dtype}")


def _unscaled(n: int) -> np.ndarray:
    """n float32 elements of this thread's own, for put()'s block divided by a scale."""
    if len(getattr(_scratches, "unscaled", ())) < n:
        _scratches.unscaled = np.empty(HOLDS_ROWS * K, np.float32)
    return _scratches.unscaled[:n]


def _scratch(n: int) -> tuple[np.ndarray, np.ndarray]:
    """n GRAD frame rows and their elements' comparison, views of this thread's own arrays."""
    if len(getattr(_scratches, "rows", ())) < n:
        _scratches.rows = np.empty((n, codec.frame_len(Kind.GRAD)), np.uint8)
        _scratches.differ = np.empty((n, K), bool)
    return _scratches.rows[:n], _scratches.differ[:n]


def warm(kernel: str | None = None) -> None:
    """Compile (or load from numba's cache) put()'s kernel for float32 gradients now: a first put
    that compiled it held a worker's first gradients for minutes on a loaded machine, longer than
    its peers' step deadline."""
    put(np.zeros((1, codec.frame_len(Kind.GRAD)), np.uint8), 0, np.zeros(K, np.float32), np.zeros(1, np.uint8),
        kernel)


def _fp16_bits(flat: np.ndarray) -> np.ndarray:
    # fp16 input is taken as it is (fixedpoint.to_fp16 scales its subnormals in fp16 and overflows).
    # An overflow to Inf is no warning: it is the frame's NONFINITE flag.
    if flat.dtype != np.float16:
        with np.errstate(over="ignore", invalid="ignore"):
            flat = fixedpoint.to_fp16(flat)
    return np.ascontiguousarray(flat).view(np.uint16)


def _put_numpy(out: np.ndarray, off: int, flat: np.ndarray, nonfinite: np.ndarray) -> None:
    """put in whole-array passes: the first row's part, whole rows, the last row's part."""
    bits = _fp16_bits(flat)
    bad = (bits & 0x7C00) == 0x7C00
    bits = bits.byteswap()
    i = 0
    while i < len(bits):
        row, col = divmod(off + i, K)
        m = min(K - col, len(bits) - i) if col or len(bits) - i < K else (len(bits) - i) // K * K
        rows = -(-m // K)
        out[row : row + rows, BODY16 + col : BODY16 + col + min(m, K)] = bits[i : i + m].reshape(rows, -1)
        nonfinite[row : row + rows] |= bad[i : i + m].reshape(rows, -1).any(axis=1)
        i += m
