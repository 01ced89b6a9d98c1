"""A worker's gradients straight into its GRAD frames: one pass over a tensor rounds each element to
fp16, writes it big-endian into its frame row in place and marks the rows holding a non-finite
value (the frame's NONFINITE flag), with no per-frame Python work.

The rounding is numpy's `astype(float16)` bit for bit, NaN payloads included. float32 (torch's and
most models' gradients) is converted in the kernel: 8 lanes at a time by F16C where the node's
kernel is AVX2 (fused.half_lanes), else element by element (portable.half_bits). fp16 is taken as
it is; other dtypes are rounded by fixedpoint.to_fp16 first. Without numba, numpy does the same in
a few whole-array passes (numpy's fp16 cast and isfinite cost 10-12 ns an element; F16C 0.4).

The other way, `ParamReader` reads the PARAM frames waiting in the socket's receive ring
(mindp.rxring) straight into the step's parameters: one compiled pass checks each frame as the
worker's numpy path does (source, mindp header, job, step, chunk, sent), counts a rejected one under
the first check it fails, copies a fresh chunk's elements in place and hands the slot back. The
numpy path (the ring's rows copied out, then decoded, checked and scattered) made 100-160 numpy
calls a read: ~330 us of CPU a read, ~30 reads a step of the 1.3M gpt, ~10 ms of its ~300.
"""
from __future__ import annotations

import numpy as np

from mindp import codec, fixedpoint, rxring
from mindp.protocol import HEADER_DTYPE, IPPROTO_UDP, PROTOCOL_VERSION, UDP_PORT, K, Kind

from . import fused

#: Where a GRAD frame's elements start, in uint16 units of the frame (its length and this are even).
BODY16 = (codec.PREFIX_LEN + codec.HEADER_LEN) // 2
assert (codec.PREFIX_LEN + codec.HEADER_LEN) % 2 == 0 and codec.frame_len(Kind.GRAD) % 2 == 0

#: ParamReader's counters, by the first check a frame fails (index 0: taken or a duplicate), named
#: as the worker's stats name them.
REJECTS = ("", "rejected_source", "rejected_ethertype", "rejected_ipv4", "rejected_udp", "rejected_port",
           "rejected_version", "rejected_kind", "rejected_job", "stale", "future", "rejected_chunk", "unsent",
           "rejected_tagged", "rejected_length")
_H = {name: codec.PREFIX_LEN + off for name, (_, off) in HEADER_DTYPE.fields.items()}  # fields' first bytes
H_VERSION, H_KIND, H_FLAGS, H_JOB, H_COUNT, H_STEP, H_CHUNK = (
    _H[f] for f in ("version", "kind", "flags", "job", "count", "step", "chunk"))
BODY = codec.PREFIX_LEN + codec.HEADER_LEN
PARAM_LEN = codec.frame_len(Kind.PARAM)
PARAM_KIND = int(Kind.PARAM)
USER, VLAN_VALID, OUTGOING = rxring.TP_STATUS_USER, rxring.TP_STATUS_VLAN_VALID, rxring.PACKET_OUTGOING
PKTTYPE = 42  # struct sockaddr_ll's sll_pkttype in a ring slot (rxring.header_dtype)

if not fused.NUMPY_ONLY:
    import numba
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from .portable import half_bits

    @intrinsic
    def _lanes8(typingctx, src, i, out, o):
        """out[o:o + 8] = the big-endian fp16 bits of float32 src[i:i + 8] (fused.half_lanes: F16C, to
        numpy's bits); returns nonzero if one of them is Inf or NaN. Both 1-D, any alignment."""
        def codegen(context, builder, sig, args):
            sty, ity, oty, _ = sig.args
            f8, h8 = ir.VectorType(ir.FloatType(), 8), ir.VectorType(ir.IntType(16), 8)
            ps = builder.bitcast(fused.row_pointer(context, builder, sty, args[0], ity, args[1]), f8.as_pointer())
            po = builder.bitcast(fused.row_pointer(context, builder, oty, args[2], ity, args[3]), h8.as_pointer())
            h = fused.half_lanes(builder, builder.load(ps, align=4))
            bswap = cgutils.get_or_insert_function(builder.module, ir.FunctionType(h8, [h8]), "llvm.bswap.v8i16")
            builder.store(builder.call(bswap, [h]), po, align=2)
            exp = ir.Constant(h8, [0x7C00] * 8)
            bad = builder.icmp_unsigned("==", builder.and_(h, exp), exp)
            return builder.zext(builder.bitcast(bad, ir.IntType(8)), ir.IntType(64))
        return types.int64(src, i, out, o), codegen

    @numba.njit(inline="always")
    def _store(out, at, h):
        """fp16 bits h into out[at] big-endian; 1 if h is Inf or NaN (an all-ones exponent), else 0."""
        out[at] = np.uint16(((h & 0xFF) << 8) | (h >> 8))
        return ((h & 0x7C00) + 0x400) >> 15

    @numba.njit(nogil=True, cache=True)
    def _put_avx2(src, bits, out, width, off, nonfinite):
        """src (float32; bits: its uint32 view) at flat element `off` on: into out (the frames' uint16
        view, flat; `width` uint16 a frame) as big-endian fp16, 8 elements at a time where a row's
        part allows; nonfinite[row] = 1 where a rounded value is Inf or NaN."""
        i, size = 0, src.shape[0]
        while i < size:
            row, col = divmod(off + i, K)
            m = min(K - col, size - i)
            at = row * width + BODY16 + col
            bad = 0
            j = 0
            while j + 8 <= m:
                bad |= _lanes8(src, i + j, out, at + j)
                j += 8
            while j < m:
                bad |= _store(out, at + j, half_bits(np.int64(bits[i + j])))
                j += 1
            if bad:
                nonfinite[row] = 1
            i += m

    @numba.njit(nogil=True, cache=True)
    def _put_bits(bits, half, out, width, off, nonfinite):
        """_put_avx2 one element at a time in integer arithmetic (any CPU): bits are float32 bits
        (half False: rounded by portable.half_bits) or fp16 bits already rounded (half True)."""
        i, size = 0, bits.shape[0]
        while i < size:
            row, col = divmod(off + i, K)
            m = min(K - col, size - i)
            at = row * width + BODY16 + col
            bad = 0
            for j in range(m):
                bad |= _store(out, at + j, np.int64(bits[i + j]) if half else half_bits(np.int64(bits[i + j])))
            if bad:
                nonfinite[row] = 1
            i += m


    @intrinsic
    def _fence(typingctx):
        """A full memory fence: a ring slot's frame is read only after its status said the slot is
        ours, and the slot is handed back only after its frame was read (as the switch's C loop)."""
        def codegen(context, builder, sig, args):
            builder.fence("seq_cst")
            return context.get_dummy_value()
        return types.void(), codegen

    @numba.njit(inline="always")
    def _be(f, at, width):
        v = 0
        for i in range(width):
            v = (v << 8) | np.int64(f[at + i])
        return v

    @numba.njit(inline="always")
    def _check(f, want, job, step, counts, attempts):
        """A received frame of PARAM length: 0 if it may be taken, else its REJECTS index."""
        for i in range(6):
            if f[6 + i] != want[i]:
                return 1
        for i in range(4):
            if f[26 + i] != want[6 + i]:
                return 1
        if f[12] != 0x08 or f[13] != 0x00:
            return 2
        if f[14] != 0x45:
            return 3
        if f[23] != IPPROTO_UDP:
            return 4
        if _be(f, 36, 2) != UDP_PORT:
            return 5
        if f[H_VERSION] != PROTOCOL_VERSION:
            return 6
        if f[H_KIND] != PARAM_KIND:
            return 7
        if _be(f, H_JOB, 2) != job:
            return 8
        s = _be(f, H_STEP, 4)
        if s < step:
            return 9
        if s > step:
            return 10
        c = _be(f, H_CHUNK, 4)
        if c >= len(counts) or _be(f, H_COUNT, 2) != counts[c]:
            return 11
        if attempts[c] == 0:
            return 12
        return 0

    @numba.njit(nogil=True, cache=True)
    def _take(raw, raw32, raw16, head, limit, want, job, step, counts, attempts, done, stamp, mark, params,
              chunks, flags, rejects):
        """rxring's slots from head[0] on, up to `limit` of them: see ParamReader.take. raw, raw32, raw16:
        the ring's memory as (slots, slot bytes) uint8, uint32 and uint16 (struct tpacket2_hdr's
        status, len, snaplen at words 0-2, mac at half-word 6, the VLAN tci at 12, pkttype at byte
        42); params: the step's parameters as (chunks, K) uint16. Returns (slots used, chunks taken,
        frames that passed every check)."""
        nslots = raw.shape[0]
        h = head[0]
        used = taken = passed = 0
        while used < limit:
            k = h % nslots
            status = raw32[k, 0]
            if not status & USER:
                break
            _fence()
            used += 1
            h += 1
            if raw[k, PKTTYPE] != OUTGOING:  # our own sends (kernels before 4.20) are not counted
                n, mac = raw32[k, 1], raw16[k, 6]
                if status & VLAN_VALID or raw16[k, 12]:
                    rejects[13] += 1
                elif n != PARAM_LEN or raw32[k, 2] != n:
                    f = raw[k, mac:mac + min(raw32[k, 2], 38)]
                    if (len(f) >= 38 and f[12] == 0x08 and f[13] == 0 and f[23] == IPPROTO_UDP
                            and _be(f, 36, 2) == UDP_PORT):  # a mindp frame (not ARP, the digest's UDP)
                        rejects[14] += 1
                else:
                    f = raw[k, mac:mac + PARAM_LEN]
                    why = _check(f, want, job, step, counts, attempts)
                    rejects[why] += 1
                    if not why:
                        passed += 1
                        c = _be(f, H_CHUNK, 4)
                        if not done[c] and stamp[c] != mark:  # fresh: not had, first in this call
                            stamp[c] = mark
                            row = params[c]
                            for j in range(K):
                                at = BODY + 2 * j
                                row[j] = (np.uint16(f[at]) << 8) | np.uint16(f[at + 1])
                            chunks[taken] = c
                            flags[taken] = f[H_FLAGS]
                            taken += 1
            _fence()
            raw32[k, 0] = 0  # the slot back to the kernel, after its frame was read
        head[0] = h
        return used, taken, passed


def as_array(grad) -> np.ndarray:
    """A numpy array, or a torch tensor as reference.to_fp16 reads it (float32 on the CPU)."""
    if hasattr(grad, "detach"):
        grad = grad.detach().cpu().float().numpy()
    return np.asarray(grad)


def put(frames: np.ndarray, off: int, grad: np.ndarray, nonfinite: np.ndarray, kernel: str | None = None) -> None:
    """Elements off .. off + grad.size of the frames' flat element space (K a row) = grad rounded to
    fp16, big-endian; nonfinite[row] set to 1 for rows that received an Inf or NaN (never cleared).

    frames: (n, GRAD frame length) uint8, C-contiguous; nonfinite: (n,) uint8; kernel: fused's
    'avx2', 'portable' or 'numpy' (default: fused.selected(), as the node's)."""
    flat = np.ravel(grad)
    if not flat.size:
        return
    if frames.ndim != 2 or frames.shape[1] != codec.frame_len(Kind.GRAD) or not frames.flags.c_contiguous:
        raise ValueError("frames must be C-contiguous rows of GRAD frames")
    if not 0 <= off <= len(frames) * K - flat.size or nonfinite.shape != (len(frames),):
        raise ValueError(f"{flat.size} elements at {off} do not fit {len(frames)} frames")
    kernel = kernel or fused.selected()
    out, width = frames.view(np.uint16), frames.shape[1] // 2
    if kernel == "numpy":
        _put_numpy(out, off, flat, nonfinite)
    elif flat.dtype == np.float32:
        flat = np.ascontiguousarray(flat)
        if kernel == "avx2":
            _put_avx2(flat, flat.view(np.uint32), out.reshape(-1), width, off, nonfinite)
        else:
            _put_bits(flat.view(np.uint32), False, out.reshape(-1), width, off, nonfinite)
    else:
        _put_bits(_fp16_bits(flat), True, out.reshape(-1), width, off, nonfinite)


def warm(kernel: str | None = None) -> None:
    """Compile (or load from numba's cache) put()'s kernel for float32 gradients now: a first put
    that compiled it held a worker's first gradients for minutes on a loaded machine, longer than
    its peers' step deadline."""
    put(np.zeros((1, codec.frame_len(Kind.GRAD)), np.uint8), 0, np.zeros(K, np.float32), np.zeros(1, np.uint8),
        kernel)


class ParamReader:
    """One agent's socket ring read into its parameters: PARAM frames from `src` (the node's MAC and IP, 10
    bytes) of job `job`, chunk c holding counts[c] elements. Needs numba (fused.NUMPY_ONLY: none)."""

    LIMIT = 4096  # slots a call reads at most, as the numpy path's receive buffer holds

    def __init__(self, ring: rxring.RxRing, counts: np.ndarray, src: bytes, job: int):
        self.ring = ring
        raw = ring.slots
        self.views = (raw, raw.view(np.uint32), raw.view(np.uint16))
        self.want = np.frombuffer(src, np.uint8).copy()
        self.job = job
        self.counts = np.ascontiguousarray(counts, dtype=np.uint16)
        self.stamp = np.zeros(len(counts), np.int64)  # per chunk, the call that took it
        self.mark = 0
        self.chunks = np.zeros(self.LIMIT, np.int64)
        self.flags = np.zeros(self.LIMIT, np.uint8)
        self.rejects = np.zeros(len(REJECTS), np.int64)  # the last call's frames, by REJECTS
        # Compiled (or loaded from numba's cache) now, with the types of every later call.
        _take(*self.views, np.zeros(1, np.int64), 0, self.want, job, 0, self.counts, np.zeros(len(counts), np.int32),
              np.zeros(len(counts), bool), self.stamp, 0, np.zeros((1, K), np.uint16), self.chunks, self.flags,
              self.rejects)

    def take(self, step: int, attempts: np.ndarray, done: np.ndarray, params: np.ndarray):
        """The frames waiting in the ring into `params` (a step's flat fp16 parameters): each checked
        as the worker's receive checks it (step `step`; attempts, done: its Window's), a chunk not
        done and not taken earlier in this call copied in place. Returns (slots read, chunks taken,
        their flags, frames that passed every check: taken or duplicates); `rejects` counts the
        others."""
        self.mark += 1
        self.rejects[:] = 0
        used, taken, passed = _take(*self.views, self.ring.head, self.LIMIT, self.want, self.job, step, self.counts,
                                    attempts, done, self.stamp, self.mark, params.reshape(-1, K).view(np.uint16),
                                    self.chunks, self.flags, self.rejects)
        return used, self.chunks[:taken], self.flags[:taken], passed


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
