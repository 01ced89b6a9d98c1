"""The optimizer node's whole job on a run of chunks in one pass: int64 sums in, the (master, m, v)
record read from one state copy and written to the other, fp16 parameters out.

`update_records` is bit-identical to composing `optim.mean_gradient`, `optim.apply` and
`astype(float16)` (the reference's path): the kernel performs the same IEEE float32 operations
in the same order (LLVM contracts nothing into FMA without fast-math flags, and the scalars are
the same float32 roundings), and converts to fp16 with numpy's own rule (round to nearest even;
a NaN keeps the top of its payload). Without numba the numpy composition runs instead.

Which kernel runs (`selected`): the AVX2 one below where the CPU reports AVX2 and F16C (llvmlite's
host features, on x86-64), else `portable`'s (numba loops with no x86 instruction: any CPU numba
runs on, ARM included); MINDP_KERNEL=portable forces the latter, MINDP_KERNEL=avx2 the former.
The node runs kernelpick.update_kernel's: under auto, the faster of the two where both run.

Speed: a record's update is AVX2 vector code written out with llvmlite (record_update: 8 float32
lanes, four vectors a lane), not a loop for LLVM to vectorise: that loop checked at run time,
for every record, that no two arrays overlapped. The fp16 conversion is F16C's instruction (plus
a select for the one case where numpy differs), and nothing branches. The mean gradients are
computed first, a block of records at a time, in a loop of their own. A row of sums that fit
int32, averaged over a power-of-two count (the usual row: a mean gradient below 128), converts
in float32 lanes with a multiply, exactly (_narrow_row; SGD +15 %, AdamW +14 %); any other row
converts to float64 from the sums' 32-bit halves (AVX2 converts int32 vectors, not int64) and
divides, as the reference does. Both loops prefetch the next block's rows as they go (SGD
+13-15 %, AdamW +5-7 %), the source records non-temporally (read once a step). Each new
record goes out to the other state copy with non-temporal stores (SGD +10-15 %, AdamW +0-5 %).
Every call has one argument signature per kernel (nworkers always a contiguous float64 array),
so the kernels `warm` compiles are the only ones the node ever runs.
"""
from __future__ import annotations

import functools
import math
import os
import platform

import numpy as np

from mindp import codec, schedule
from mindp.protocol import SCALE_BITS, Flag, K, Kind

from . import jitcache, optim
from .optim import OptimizerConfig

F32 = np.float32
MASTER, M, V = 0, 1, 2
_INV_SCALE = 2.0**-SCALE_BITS

# The kernel's OpenMP threads sleep between batches rather than spin: spinning, two shard processes
# (or a node beside the workers and the switch) on 2 cores ran 20x slower. Read when numba's OpenMP
# pool starts, at the first parallel call; a value set by the user stays.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

try:  # numba is a dependency; the numpy path stays for platforms without an llvmlite wheel
    import numba
except ImportError:  # pragma: no cover - exercised by forcing NUMPY_ONLY
    numba = None
else:
    jitcache.use()

NUMPY_ONLY = numba is None or os.environ.get("MINDP_NO_NUMBA") == "1"
KERNELS = ("auto", "avx2", "portable")  # MINDP_KERNEL's values
# Records per task of the kernel's parallel loop: 2,048 elements (their gradients, 8 KiB, stay in L1).
BLOCK = max(1, 2048 // K)
# Batches of fewer elements run on the calling thread: waking the pool cost more than it saved (256
# elements: 45 us against 18 us on one thread, 73 against 16 with the cores busy), and a node that
# keeps up with the switch applies a few sums at a time.
SERIAL_BELOW = max(1, 131072 // K)


class KernelError(optim.ConfigError):
    """MINDP_KERNEL asks for a kernel that cannot run here; the message says why."""


@functools.cache
def host_has_avx2() -> bool:
    """Whether numba's target CPU runs the AVX2 kernel: x86-64 with AVX2 and F16C, by llvmlite's
    host CPU features (or NUMBA_CPU_FEATURES, which NUMBA_CPU_NAME=generic makes empty)."""
    if NUMPY_ONLY or platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    from llvmlite import binding
    from numba.core import config

    features = config.CPU_FEATURES
    if features is None:
        features = binding.get_host_cpu_features().flatten()
    return {"+avx2", "+f16c"} <= set(features.split(","))


def choose(asked: str, avx2: bool) -> str:
    """MINDP_KERNEL's value -> the kernel to run, on a CPU with (avx2) or without AVX2 and F16C."""
    if asked not in KERNELS:
        raise KernelError(f"MINDP_KERNEL must be one of {'|'.join(KERNELS)}, got {asked!r}")
    if asked == "avx2" and not avx2:
        raise KernelError("MINDP_KERNEL=avx2, but this CPU lacks AVX2 or F16C: "
                          "unset it (auto) or set MINDP_KERNEL=portable")
    return asked if asked != "auto" else ("avx2" if avx2 else "portable")


def selected() -> str:
    """The update kernel this process runs: 'avx2', 'portable', or 'numpy' without numba."""
    if NUMPY_ONLY:
        return "numpy"
    return choose(os.environ.get("MINDP_KERNEL", "auto").strip().lower() or "auto", host_has_avx2())


def scalars(cfg: OptimizerConfig, step: int, lr: float | None = None) -> np.ndarray:
    """The float32 constants of one step, rounded exactly as `optim.apply` rounds them (`lr`: the
    step's scheduled lr, a float64 rounded to float32 only inside these products, as there)."""
    lr = cfg.lr if lr is None else lr
    if cfg.kind == "adamw":
        b1, b2 = cfg.betas
        t = step + 1
        return np.array([1.0 - lr * cfg.weight_decay, b1, 1.0 - b1, b2, 1.0 - b2, math.sqrt(1.0 - b2**t),
                         cfg.eps, lr / (1.0 - b1**t)], dtype=F32)
    return np.array([cfg.weight_decay, cfg.momentum, lr], dtype=F32)


#: The node's checks of a SUM header, in order: a row is counted under the first it fails.
CHECKS = ("job", "nworkers", "chunk", "count", "slot")
_F = codec.HEADER_DTYPE.fields  # byte offsets of the big-endian header fields the checks read
_O_VER, _O_JOB, _O_SLOT, _O_COUNT = _F["ver"][1], _F["job"][1], _F["slot"][1], _F["count"][1]
_O_STEP, _O_CHUNK, _O_NWORKERS = _F["step"][1], _F["chunk"][1], _F["nworkers"][1]
_O_KIND, _O_FLAGS, _O_WORKER = _F["kind"][1], _F["flags"][1], _F["worker"][1]
_NONFINITE, _RETRANSMIT, _PARAM = int(Flag.NONFINITE), int(Flag.RETRANSMIT), int(Kind.PARAM)


def wire_order(h: np.ndarray) -> np.ndarray:
    """Headers as codec.HEADER_DTYPE (big-endian), which the compiled passes read as bytes: numpy
    turns them native-endian in np.concatenate, for one."""
    return h if h.dtype == codec.HEADER_DTYPE else h.astype(codec.HEADER_DTYPE)


def check_sums_numpy(h: np.ndarray, job: int, max_workers: int, lo: int, hi: int, n_total: int, slots: int,
                     last_count: int) -> tuple[np.ndarray, np.ndarray]:
    """check_sums by numpy."""
    chunk = h["chunk"].astype(np.int64)
    step = h["step"].astype(np.int64)
    ok = np.ones(len(h), dtype=bool)
    bad = np.zeros(len(CHECKS), dtype=np.int64)
    nw = h["nworkers"]
    passes = [h["job"] == job, (nw >= 1) & (nw <= max_workers), (chunk >= lo) & (chunk <= hi)]
    for i, passed in enumerate(passes):
        bad[i] = np.count_nonzero(ok & ~passed)
        ok &= passed
    c = np.where(ok, chunk, lo)
    slot, ver = schedule.slots_and_versions(step, c, n_total, slots)
    for i, passed in enumerate((h["count"] == np.where(c == hi, last_count, K),
                                (h["slot"] == slot) & (h["ver"] == ver)), start=3):
        bad[i] = np.count_nonzero(ok & ~passed)
        ok &= passed
    return ok, bad


def check_sums(h: np.ndarray, job: int, max_workers: int, lo: int, hi: int, n_total: int, slots: int,
               last_count: int) -> tuple[np.ndarray, np.ndarray]:
    """The node's checks of SUM headers (codec.HEADER_DTYPE) in one pass: the job, 1 <= nworkers
    <= max_workers, the chunk within lo..hi (inclusive, job-wide), its element count (K, or
    last_count for chunk hi), its slot and version (mindp.schedule over n_total chunks and
    `slots`). Returns (row passed all, rows failed per CHECKS, each row under its first failure)."""
    if NUMPY_ONLY:
        return check_sums_numpy(h, job, max_workers, lo, hi, n_total, slots, last_count)
    h = wire_order(h)
    ok = np.empty(len(h), dtype=np.bool_)
    bad = np.zeros(len(CHECKS), dtype=np.int64)
    _check(h.view(np.uint8).reshape(len(h), h.dtype.itemsize), job, max_workers, lo, hi, n_total, slots, last_count,
           ok, bad)
    return ok, bad


def in_order_batch(h: np.ndarray, job: int, max_workers: int, lo: int, hi: int, n_total: int, slots: int,
                   last_count: int, step: int, applied: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The node's usual batch in one pass: every SUM header passes check_sums, is of `step`, not
    NONFINITE, and the chunks are consecutive and none `applied` (indexed by chunk - lo). Then
    (the PARAM headers answering them, nworkers as float64), else None (the caller takes the
    general path; always, without numba)."""
    if NUMPY_ONLY or not len(h) or slots > 1 << 16:  # (no slot field holds more)
        return None
    h = wire_order(h)
    if not h.flags.c_contiguous or h.ctypes.data % 8:
        h = h.copy()  # numpy's allocations are aligned: each row's three words then are
    hw = h.view(np.uint8).view("<u8")
    ow = np.empty_like(hw)
    nw = np.empty(len(h), np.float64)
    if not _in_order(hw, ow, nw, job, max_workers, lo, hi, n_total, slots, last_count, step, applied):
        return None
    return ow.view(np.uint8).view(h.dtype), nw


def update_numpy(cfg: OptimizerConfig, src: np.ndarray, dst: np.ndarray, sums: np.ndarray, nworkers,
                 step: int, out: np.ndarray, lr: float | None = None) -> None:
    """The reference composition (records (n, 3, K) float32, or (n, 2, K) for SGD, which has no v;
    sums (n, K) int64, out (n, K) float16; nworkers an int or one count per record)."""
    nworkers = np.asarray(nworkers, dtype=np.int64).reshape(-1, 1) if np.ndim(nworkers) else nworkers
    if dst is not src:
        dst[...] = src
    g = optim.mean_gradient(sums, nworkers)
    optim.apply(cfg, dst[:, MASTER], dst[:, M], dst[:, V] if dst.shape[1] > V else None, g, step, lr)
    out[...] = dst[:, MASTER].astype(np.float16)


if not NUMPY_ONLY:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from . import jitpool, portable

    def _splat(ty, v):
        """The constant v in every lane of ty (or v, for a scalar type)."""
        return ir.Constant(ty, [v] * ty.count) if isinstance(ty, ir.VectorType) else ir.Constant(ty, v)

    def half_lanes(builder, f):
        """float32 lanes (a vector or a scalar) -> IEEE binary16 bits (int16 lanes) by numpy's
        npy_floatbits_to_halfbits rule: F16C's conversion (round to nearest even, as numpy) for
        every value but a signalling NaN, which the hardware quiets and numpy does not (it keeps
        the top of the payload, never 0). Without a branch: selects in 32-bit lanes."""
        n = f.type.count if isinstance(f.type, ir.VectorType) else None
        lanes = (lambda t: ir.VectorType(t, n)) if n else (lambda t: t)
        i32, i16 = lanes(ir.IntType(32)), lanes(ir.IntType(16))
        c = lambda v: _splat(i32, v)  # noqa: E731
        hw = builder.zext(builder.bitcast(builder.fptrunc(f, lanes(ir.HalfType())), i16), i32)
        bits = builder.bitcast(f, i32)
        a = builder.and_(bits, c(0x7FFFFFFF))
        sign = builder.and_(builder.lshr(bits, c(16)), c(0x8000))
        nan = builder.or_(c(0x7C00), builder.lshr(builder.and_(a, c(0x7FFFFF)), c(13)))
        nan = builder.select(builder.icmp_unsigned("==", nan, c(0x7C00)), c(0x7C01), nan)
        r = builder.select(builder.icmp_unsigned(">", a, c(0x7F800000)), builder.or_(sign, nan), hw)
        return builder.trunc(r, i16)

    @numba.njit
    def _f64(s):
        """int64 -> float64 rounded to nearest, as a conversion instruction would, but from 32-bit
        halves: AVX2 has no vector int64 conversion, int32 ones it has (hi * 2**32 is exact, and
        so is the unsigned low half: the sum is rounded once)."""
        hi = np.int32(s >> 32)
        lo = np.int32(np.uint32(s & 0xFFFFFFFF) ^ np.uint32(0x80000000))
        return np.float64(hi) * 4294967296.0 + (np.float64(lo) + 2147483648.0)

    @numba.njit(inline="always")
    def _pow2(d):
        n = np.int64(d)
        return n == d and n > 0 and (n & (n - 1)) == 0

    @numba.njit(inline="always")
    def _gradients(sums, nw, lo, hi, g):
        """g[i - lo] = the float32 mean gradients of records lo..hi-1: a loop of its own, since
        its float64 lanes would halve the float32 lanes of the update's loop. A row of sums that
        fit int32, averaged over a power-of-two count (the usual row), takes float32 lanes and no
        division (_narrow_row); any other row the float64 reference arithmetic."""
        for i in range(lo, hi):
            _fetch_sums(sums, i + BLOCK)
            d = nw[i]
            if not (_pow2(d) and _narrow_row(sums, i, g, i - lo, np.float32(_INV_SCALE / d))):
                for j in range(K):
                    g[i - lo, j] = np.float32(_f64(sums[i, j]) * _INV_SCALE / d)

    def row_pointer(context, builder, aty, arr, ity, i):
        """The address of arr[i, 0, ...] (no bounds check: i may be past the end)."""
        zero = context.get_constant(types.intp, 0)
        at = [context.cast(builder, i, ity, types.intp)] + [zero] * (aty.ndim - 1)
        return cgutils.get_item_pointer(context, builder, aty, context.make_array(aty)(context, builder, arr), at,
                                        wraparound=False, boundscheck=False)

    @intrinsic
    def _narrow_row(typingctx, sums, i, g, gi, scale):
        """If every sum of row i fits int32: g[gi] = float32(sums[i]) * scale, and True; else
        False, g untouched. With scale a power of two this is the reference's float32(float64(s)
        * 2**-24 / d) bit for bit: float64(s) is then exact, so both round s once, and scaling by
        a power of two is exact (no float32 here comes near the subnormals). Written as vector
        code: numba's loops convert integers to floats one at a time."""
        def codegen(context, builder, sig, args):
            sty, ity, gty, gity, _ = sig.args
            ps = row_pointer(context, builder, sty, args[0], ity, args[1])
            pg = row_pointer(context, builder, gty, args[2], gity, args[3])
            i32 = ir.IntType(32)
            wide, narrow = ir.VectorType(ir.IntType(64), K), ir.VectorType(i32, K)
            floats = ir.VectorType(ir.FloatType(), K)
            s = builder.load(builder.bitcast(ps, wide.as_pointer()), align=8)
            t = builder.trunc(s, narrow)
            same = builder.icmp_signed("==", builder.sext(t, wide), s)
            fits = builder.icmp_signed("==", builder.bitcast(same, ir.IntType(K)), ir.Constant(ir.IntType(K), -1))
            with builder.if_then(fits):
                one = builder.insert_element(ir.Constant(floats, ir.Undefined), args[4], i32(0))
                every = builder.shuffle_vector(one, one, ir.Constant(narrow, [0] * K))
                builder.store(builder.fmul(builder.sitofp(t, floats), every), builder.bitcast(pg, floats.as_pointer()),
                              align=4)
            return fits
        return types.boolean(sums, i, g, gi, scale), codegen

    @intrinsic
    def _sfence(typingctx):
        """Non-temporal stores are weakly ordered: fence them before another thread reads the state."""
        def codegen(context, builder, sig, args):
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse.sfence")
            builder.call(fn, [])
            return context.get_dummy_value()
        return types.void(), codegen

    def _prefetcher(lines, locality):
        """An intrinsic: prefetch the first `lines` cache lines of arr[i] (rows of a C-contiguous
        array) with LLVM's `locality` (3: prefetcht0, kept in every level; 0: prefetchnta, for
        data used once). i may be past the end: a prefetch never faults."""
        @intrinsic
        def prefetch(typingctx, arr, i):
            def codegen(context, builder, sig, args):
                aty, ity = sig.args
                i32, i8p = ir.IntType(32), ir.IntType(8).as_pointer()
                row = builder.bitcast(row_pointer(context, builder, aty, args[0], ity, args[1]), i8p)
                fn = cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0i8")
                for line in range(lines):  # read, data cache
                    builder.call(fn, [builder.gep(row, [i32(64 * line)]), i32(0), i32(locality), i32(1)])
                return context.get_dummy_value()
            return types.void(arr, i), codegen
        return prefetch

    # A sums row is 4 lines; a record 6 (SGD's 4: master and m; of a format-1 state, its first 4).
    # A source record is read once a step: prefetchnta keeps it from displacing lines that are
    # used again (at 4M elements, kernel +4-5 % for both optimizers; at 32M no change).
    _fetch_sums, _fetch_record6, _fetch_record4 = _prefetcher(4, 3), _prefetcher(6, 0), _prefetcher(4, 0)

    # The optimizers on 8-float lanes, in the reference's operations and order (no FMA: LLVM
    # contracts nothing without fast-math flags). c: scalars(cfg, step), each in every lane.
    def _sgd_lanes(builder, c, decay, g, p, m):
        g = builder.select(decay, builder.fadd(g, builder.fmul(c[0], p)), g)
        m = builder.fadd(builder.fmul(m, c[1]), g)
        return builder.fsub(p, builder.fmul(c[2], m)), m

    def _adamw_lanes(builder, c, decay, g, p, m, v):
        p = builder.select(decay, builder.fmul(p, c[0]), p)
        m = builder.fadd(builder.fmul(m, c[1]), builder.fmul(c[2], g))
        v = builder.fadd(builder.fmul(v, c[3]), builder.fmul(c[4], builder.fmul(g, g)))
        sqrt = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v.type, [v.type]), "llvm.sqrt.v8f32")
        den = builder.fadd(builder.fdiv(builder.call(sqrt, [v]), c[5]), c[6])
        return builder.fsub(p, builder.fmul(builder.fdiv(m, den), c[7])), m, v

    def record_update(lanes_of, n_lanes, n_scalars):
        """An intrinsic updating record i: its first n_lanes lanes of K float32 read from src[i]
        as 8-float vectors, with gradients g[gi] and the n_scalars of c, by
        lanes_of(builder, scalars, decay, g, *lanes) -> new lanes (the first the master); the
        new lanes written to dst[i], out[i] = their master's fp16 bits (half_lanes).

        Records are C-contiguous (update_records checks). dst[i] takes non-temporal stores when
        `far` (dst is not the source: the other state copy, not in cache, whose lines the step
        overwrites whole, so a plain store's read for ownership is wasted traffic) and it is
        32-byte aligned (always in the node: records in page-aligned memory); a page buffer
        updated in place is in cache and is written to the file next: plain stores. Vector code
        written out, not a loop for LLVM to vectorise: numba's loop checked at run time, for
        every record, that none of the arrays overlapped (a third of its instructions)."""
        @intrinsic
        def update(typingctx, src, dst, i, g, gi, out, c, decay, far):
            def codegen(context, builder, sig, args):
                sty, dty, ity, gty, gity, oty, cty, _, _ = sig.args
                i32, i64 = ir.IntType(32), ir.IntType(64)
                f8, h8 = ir.VectorType(ir.FloatType(), 8), ir.VectorType(ir.IntType(16), 8)

                def row(arg, aty, index, index_ty, vector):  # args[arg][index] as a pointer to vectors
                    ptr = row_pointer(context, builder, aty, args[arg], index_ty, index)
                    return builder.bitcast(ptr, vector.as_pointer())
                ps, pd, po = row(0, sty, args[2], ity, f8), row(1, dty, args[2], ity, f8), row(5, oty, args[2], ity, h8)
                pg = row(3, gty, args[4], gity, f8)
                pc = row_pointer(context, builder, cty, args[6], types.intp, context.get_constant(types.intp, 0))
                scalars = []
                for k in range(n_scalars):
                    one = builder.insert_element(ir.Constant(f8, ir.Undefined), builder.load(builder.gep(pc, [i64(k)])),
                                                 i32(0))
                    scalars.append(builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(i32, 8), [0] * 8)))
                per_lane = K // 8
                new = []  # (the vector's place in the record, its new value)
                for q in range(per_lane):
                    old = [builder.load(builder.gep(ps, [i64(lane * per_lane + q)]), align=4) for lane in range(n_lanes)]
                    lanes = lanes_of(builder, scalars, args[7], builder.load(builder.gep(pg, [i64(q)]), align=4), *old)
                    new += [(lane * per_lane + q, v) for lane, v in enumerate(lanes)]
                    builder.store(half_lanes(builder, lanes[0]), builder.gep(po, [i64(q)]), align=2)
                new.sort(key=lambda kv: kv[0])
                aligned = builder.icmp_unsigned("==", builder.and_(builder.ptrtoint(pd, i64), i64(31)), i64(0))
                nontemporal = builder.module.add_metadata([ir.Constant(i32, 1)])
                with builder.if_else(builder.and_(aligned, args[8])) as (yes, no):
                    for branch, align in ((yes, 32), (no, 4)):
                        with branch:
                            for at, v in new:
                                st = builder.store(v, builder.gep(pd, [i64(at)]), align=align)
                                if align == 32:
                                    st.set_metadata("nontemporal", nontemporal)
                return context.get_dummy_value()
            return types.void(src, dst, i, g, gi, out, c, decay, far), codegen
        return update

    _sgd_record, _adamw_record = record_update(_sgd_lanes, 2, 3), record_update(_adamw_lanes, 3, 8)

    # The kernel: blocks of BLOCK records over the threads; each block's gradients first, then
    # its records by the intrinsic record update of the optimizer (record_update), each fetching
    # the record a block ahead; the non-temporal stores fenced at the end of each block. One
    # module-level function for both optimizers (the branch is per block): numba's disk cache
    # keys a closure by its pickled cells, which differ in every process, so a kernel made per
    # optimizer by a closure was compiled again (3 s) at every start and its cache grew.
    # Only the parallel kernel: compiling a serial one first leaves numba's parfor with 4x
    # slower code (measured: 70M against 370M elements/s), and a one-thread call saves 3 us.
    @numba.njit(nogil=True, cache=True, error_model="numpy", parallel=True)
    def _kernel(src, dst, sums, nw, c, decay, out, far, adamw):
        n = src.shape[0]
        for b in numba.prange((n + BLOCK - 1) // BLOCK):
            lo, hi = b * BLOCK, min(b * BLOCK + BLOCK, n)
            g = np.empty((hi - lo, K), np.float32)
            _gradients(sums, nw, lo, hi, g)
            if adamw:
                for i in range(lo, hi):
                    _fetch_record6(src, i + BLOCK)
                    _adamw_record(src, dst, i, g, i - lo, out, c, decay, far)
            else:
                for i in range(lo, hi):
                    _fetch_record4(src, i + BLOCK)
                    _sgd_record(src, dst, i, g, i - lo, out, c, decay, far)
            _sfence()

    @numba.njit(nogil=True, cache=True)
    def _kernel_alone(src, dst, sums, nw, c, decay, out, far, adamw):
        """_kernel on the calling thread only (update_records: a batch below SERIAL_BELOW), its
        threads given back after."""
        threads = jitpool.swap_threads(1)
        _kernel(src, dst, sums, nw, c, decay, out, far, adamw)
        jitpool.swap_threads(threads)

    @numba.njit(inline="always")
    def _be(row, off, size):
        v = np.int64(0)
        for b in range(size):
            v = (v << 8) | np.int64(row[off + b])
        return v

    @numba.njit(inline="always")
    def _first_failed(row, job, max_workers, lo, hi, n_total, slots, last_count):
        """The index in CHECKS of the first check the SUM header `row` fails, or -1."""
        if _be(row, _O_JOB, 2) != job:
            return 0
        nw = _be(row, _O_NWORKERS, 2)
        if nw < 1 or nw > max_workers:
            return 1
        c = _be(row, _O_CHUNK, 4)
        if c < lo or c > hi:
            return 2
        if _be(row, _O_COUNT, 2) != (last_count if c == hi else K):
            return 3
        slot = c % slots
        uses = (n_total - slot + slots - 1) // slots
        ver = (_be(row, _O_STEP, 4) * uses + c // slots) & 1
        if _be(row, _O_SLOT, 2) != slot or np.int64(row[_O_VER]) != ver:
            return 4
        return -1

    @numba.njit(nogil=True, cache=True)
    def _check(hb, job, max_workers, lo, hi, n_total, slots, last_count, ok, bad):
        for i in range(hb.shape[0]):
            failed = _first_failed(hb[i], job, max_workers, lo, hi, n_total, slots, last_count)
            ok[i] = failed < 0
            if failed >= 0:
                bad[failed] += 1

    @numba.njit(inline="always")
    def _swap16(x):
        return ((x & 0xFF) << 8) | ((x >> 8) & 0xFF)

    @numba.njit(inline="always")
    def _swap32(x):
        return (_swap16(x & 0xFFFF) << 16) | _swap16((x >> 16) & 0xFFFF)

    # A header as three little-endian words (codec.HEADER_DTYPE: 24 bytes, big-endian fields): the
    # fields' bit positions in them, their bytes still in wire order.
    _W0_VER_JOB = (0xFF << 24) | (0xFFFF << 32)  # ver (byte 3), job (bytes 4-5)
    # An answer's w0: version, the RETRANSMIT flag, ver and job kept; kind PARAM; other flags and worker cleared.
    _W0_KEEP = 0xFF | (_RETRANSMIT << 16) | (0xFF << 24) | (0xFFFF << 32)
    _W0_PARAM, _W0_NONFINITE = _PARAM << 8, _NONFINITE << 16
    _W2_CHUNK, _W2_KEEP = 0xFFFFFFFF, 0xFFFF0000FFFFFFFF  # chunk (bytes 16-19); nworkers (20-21) cleared

    def _vector(values):
        """A constant <4 x i64> of unsigned 64-bit values."""
        return ir.Constant(ir.VectorType(ir.IntType(64), 4), [v - (1 << 64) if v >= 1 << 63 else v for v in values])

    def _by_word(w0, w1, w2):
        """The three constant vectors over four rows' twelve words, each word given the value of its
        place in a header (w0, w1 or w2)."""
        return [_vector([(w0, w1, w2)[(4 * i + lane) % 3] for lane in range(4)]) for i in range(3)]

    @intrinsic
    def _later_uses(typingctx, hw, ow, nw, applied, k0, groups, c0, back, top):
        """Rows k0 .. k0 + 4 * groups - 1 of _in_order (row k of chunk c0 + k), four at a time as
        three vectors of their twelve words, each row checked against the row `back` (= slots)
        before it, its slot's last use in the run (checked already): the same job, step, count and
        slot (w1 whole), the version flipped, not NONFINITE; its chunk, nworkers and applied flag
        checked alone. Returns the OR of every row's mismatches; writes the answers' words and
        nworkers. No shuffle of words into fields but the four w2s: 15 instructions a row against
        29 in _in_order_rows, which derives each row's slot and version."""
        def codegen(context, builder, sig, args):
            i32, i64 = ir.IntType(32), ir.IntType(64)
            v4, v4i32, v4f64 = ir.VectorType(i64, 4), ir.VectorType(i32, 4), ir.VectorType(ir.DoubleType(), 4)
            data = [context.make_array(t)(context, builder, a).data for t, a in zip(sig.args[:4], args[:4])]
            phw, pow_, pnw, pap = data
            k0, groups, c0, back, top = (context.cast(builder, a, t, types.int64) for a, t in zip(args[4:], sig.args[4:]))
            same = _by_word(_W0_VER_JOB, (1 << 64) - 1, 0)  # bits equal to the earlier row's ...
            flip = _by_word(1 << 24, 0, 0)  # ... but the version's
            nonfinite = _by_word(_W0_NONFINITE, 0, 0)
            keep = _by_word(_W0_KEEP, (1 << 64) - 1, _W2_KEEP)
            param = _by_word(_W0_PARAM, 0, 0)
            undef = ir.Constant(v4, ir.Undefined)
            splat = lambda v: builder.shuffle_vector(  # noqa: E731
                builder.insert_element(undef, v, i32(0)), undef, ir.Constant(v4i32, [0] * 4))
            acc = cgutils.alloca_once_value(builder, ir.Constant(v4, [0] * 4))
            bswap = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v4i32, [v4i32]), "llvm.bswap.v4i32")
            with cgutils.for_range(builder, groups) as loop:
                k = builder.add(k0, builder.mul(loop.index, i64(4)))
                w = builder.mul(k, i64(3))

                def words(p, at):
                    return [builder.bitcast(builder.gep(p, [builder.add(at, i64(4 * i))]), v4.as_pointer())
                            for i in range(3)]
                cur = [builder.load(q, align=8) for q in words(phw, w)]
                was = [builder.load(q, align=8) for q in words(phw, builder.sub(w, builder.mul(back, i64(3))))]
                bad = builder.load(acc)
                for i in range(3):
                    delta = builder.xor(builder.xor(cur[i], was[i]), flip[i])
                    bad = builder.or_(bad, builder.or_(builder.and_(delta, same[i]), builder.and_(cur[i], nonfinite[i])))
                for q, v, k_, p_ in zip(words(pow_, w), cur, keep, param):
                    builder.store(builder.or_(builder.and_(v, k_), p_), q, align=8)
                w2 = builder.shuffle_vector(builder.shuffle_vector(cur[0], cur[1], ir.Constant(v4i32, [2, 5, 0, 0])),
                                            cur[2], ir.Constant(v4i32, [0, 1, 4, 7]))  # rows' w2 in order
                chunk = builder.add(splat(builder.add(c0, k)), _vector(range(4)))
                want = builder.zext(builder.call(bswap, [builder.trunc(chunk, v4i32)]), v4)
                bad = builder.or_(bad, builder.xor(builder.and_(w2, _vector([_W2_CHUNK] * 4)), want))
                count = builder.or_(builder.and_(builder.lshr(w2, _vector([40] * 4)), _vector([0xFF] * 4)),
                                    builder.and_(builder.lshr(w2, _vector([24] * 4)), _vector([0xFF00] * 4)))
                beyond = builder.icmp_unsigned(">", builder.sub(count, _vector([1] * 4)), splat(top))
                bad = builder.or_(bad, builder.zext(beyond, v4))
                done = builder.load(builder.bitcast(builder.gep(pap, [k]), i32.as_pointer()), align=1)
                bad = builder.or_(bad, builder.insert_element(ir.Constant(v4, [0] * 4), builder.zext(done, i64), i32(0)))
                builder.store(builder.sitofp(builder.trunc(count, v4i32), v4f64),
                              builder.bitcast(builder.gep(pnw, [k]), v4f64.as_pointer()), align=8)
                builder.store(bad, acc)
            bad = builder.load(acc)
            lanes = [builder.extract_element(bad, i32(i)) for i in range(4)]
            return builder.or_(builder.or_(lanes[0], lanes[1]), builder.or_(lanes[2], lanes[3]))
        return types.uint64(hw, ow, nw, applied, k0, groups, c0, back, top), codegen

    @numba.njit(inline="always")
    def _in_order_rows(hw, ow, nw, applied, c0, q, r, slots, magic, rem, odd, want0, want1, top):
        """Rows of _in_order, row k of chunk c0 + k, row 0 of slot r: the OR of every row's
        mismatches. A row's version is the parity of q (step * qt + row 0's quotient by `slots`),
        of the wraps of the slots since row 0, and of `step` once more for a slot below rem. No
        branch: LLVM vectorises the loop, 1.6x the speed of one that returns at the first mismatch
        or keeps the slot running (wrapped by a select). Called on slices, so that k starts at 0:
        a loop from an offset was not vectorised."""
        bad = np.uint64(0)
        for k in range(len(nw)):
            t = np.uint64(r + k)  # slots past row 0's slot
            dq = np.int64((t * magic) >> np.uint64(40))  # t // slots
            s = np.int64(t) - dq * slots  # row k's slot
            ver = np.uint64((q + dq + (odd if s < rem else 0)) & 1) << np.uint64(24)
            w0, w1, w2 = hw[3 * k], hw[3 * k + 1], hw[3 * k + 2]
            nwk = ((w2 >> np.uint64(40)) & np.uint64(0xFF)) | ((w2 >> np.uint64(24)) & np.uint64(0xFF00))
            bad |= ((w1 ^ (want1 | np.uint64(_swap16(s)))) | (w0 & np.uint64(_W0_NONFINITE))
                    | ((w0 & np.uint64(_W0_VER_JOB)) ^ (want0 | ver))
                    | ((w2 & np.uint64(_W2_CHUNK)) ^ np.uint64(_swap32(c0 + k))) | np.uint64(nwk - np.uint64(1) > top)
                    | np.uint64(applied[k]))
            nw[k] = np.float64(np.int32(nwk))
            ow[3 * k] = (w0 & np.uint64(_W0_KEEP)) | np.uint64(_W0_PARAM)
            ow[3 * k + 1] = w1
            ow[3 * k + 2] = w2 & np.uint64(_W2_KEEP)
        return bad

    @numba.njit(nogil=True, cache=True)
    def _in_order(hw, ow, nw, job, max_workers, lo, hi, n_total, slots, last_count, step, applied):
        """_first_failed's checks for consecutive chunks, on each header's three 64-bit words (hw
        and ow flat) against the words expected, and the answers' words: the usual batch, the
        node's hot path. The first use of each slot in the run is checked in full
        (_in_order_rows), every later one against the use before it (_later_uses), the last few
        rows in full again. A row's slot comes from its distance t to the first row's slot
        divided by `slots` as a multiply: t * ceil(2**40 / slots) >> 40 == t // slots while
        t * slots < 2**40, so for every row checked in full (t < 2 * slots + 4) with slots <= 2**16."""
        n = len(hw) // 3
        c0 = _swap32(np.int64(hw[2] & _W2_CHUNK))
        if c0 < lo or c0 + n - 1 > hi:
            return False
        qt, rem = n_total // slots, n_total % slots  # slot r has qt + (r < rem) uses per step
        magic = np.uint64(-(-(1 << 40) // slots))
        odd = step & 1
        want0 = np.uint64(_swap16(job)) << np.uint64(32)
        w1_step = np.uint64(_swap32(step & 0xFFFFFFFF)) << np.uint64(32)
        k_be, last_be = np.uint64(_swap16(K)) << np.uint64(16), np.uint64(_swap16(last_count)) << np.uint64(16)
        top = np.uint64(max_workers - 1)
        app = applied[c0 - lo : c0 - lo + n]
        last = n - 1 if c0 + n - 1 == hi else n  # chunk hi holds last_count elements, the others K
        head = min(slots, last)
        groups = (last - head) // 4
        tail = head + 4 * groups
        bad = _later_uses(hw, ow, nw, app, head, groups, c0, slots, top)
        for a, b in ((0, head), (tail, last)):
            q, r = (c0 + a) // slots, (c0 + a) % slots
            bad |= _in_order_rows(hw[3 * a : 3 * b], ow[3 * a : 3 * b], nw[a:b], app[a:b], c0 + a, step * qt + q, r,
                                  slots, magic, rem, odd, want0, w1_step | k_be, top)
        if last < n:
            q, r = hi // slots, hi % slots
            bad |= _in_order_rows(hw[-3:], ow[-3:], nw[-1:], app[-1:], hi, step * qt + q, r, slots, magic, rem, odd,
                                  want0, w1_step | last_be, top)
        return bad == 0

    @intrinsic
    def _half8(typingctx, f, out, i):
        """out[i:i + 8] = half_lanes(f[i:i + 8]): the kernel's conversion, for tests."""
        def codegen(context, builder, sig, args):
            fty, oty, ity = sig.args
            f8, h8 = ir.VectorType(ir.FloatType(), 8), ir.VectorType(ir.IntType(16), 8)
            pf = builder.bitcast(row_pointer(context, builder, fty, args[0], ity, args[2]), f8.as_pointer())
            po = builder.bitcast(row_pointer(context, builder, oty, args[1], ity, args[2]), h8.as_pointer())
            builder.store(half_lanes(builder, builder.load(pf, align=4)), po, align=2)
            return context.get_dummy_value()
        return types.void(f, out, i), codegen

    @numba.njit(cache=True)
    def _f16_bits8(f, out):
        for i in range(0, len(f), 8):
            _half8(f, out, i)

    def f16_bits(bits: np.ndarray) -> np.ndarray:
        """float32 bit patterns (uint32) -> the fp16 bits the kernel writes for them (uint16)."""
        f = np.zeros(-(-len(bits) // 8) * 8, np.float32)
        f.view(np.uint32)[: len(bits)] = bits
        out = np.empty(len(f), np.uint16)
        _f16_bits8(f, out)
        return out[: len(bits)]


_last_scalars: list = [None, None]  # (cfg, step, lr) -> scalars(), of the last call


def _scalars(cfg: OptimizerConfig, step: int, lr: float | None) -> np.ndarray:
    """scalars(), computed once for the many batches of a step."""
    key = (cfg, step, lr)
    if _last_scalars[0] != key:
        _last_scalars[:] = key, scalars(cfg, step, lr)
    return _last_scalars[1]


def update_records(cfg: OptimizerConfig, src: np.ndarray, dst: np.ndarray, sums: np.ndarray, nworkers,
                   step: int, out: np.ndarray, kernel: str | None = None, lr: float | None = None) -> None:
    """dst = one optimizer step of src with the mean of `sums` over `nworkers` (an int or one count
    per record); out = fp16(dst master). src may be dst. SGD has no v: its records are (master, m),
    or, in a state of format 1, (master, m, v) with v left as created (zero in both copies).
    `kernel`: 'avx2', 'portable' or 'numpy' (default: `selected()`). `lr`: the step's scheduled lr
    (default cfg.lr)."""
    kernel = kernel or selected()
    if kernel == "numpy":
        update_numpy(cfg, src, dst, sums, nworkers, step, out, lr)
        return
    nw = nworkers
    if not (isinstance(nw, np.ndarray) and nw.dtype == np.float64 and nw.flags.c_contiguous and nw.shape == (len(src),)):
        nw = np.empty(len(src), np.float64)
        nw[:] = nworkers
    for name, a, inner in (("src", src, (K * 4, 4)), ("dst", dst, (K * 4, 4)), ("sums", sums, (8,)), ("out", out, (2,))):
        if a.strides[1:] != inner:  # the kernel reads and writes whole rows as vectors
            raise ValueError(f"update_records: {name} must hold whole rows ({a.dtype} records or K elements), "
                             "each contiguous")
    c, decay = _scalars(cfg, step, lr), cfg.weight_decay != 0.0
    if kernel == "portable":
        with jitpool.threads_for(len(src), SERIAL_BELOW):
            portable.update(cfg.kind, src, dst, sums, nw, c, decay, out.view(np.uint16))
    else:
        far = not np.may_share_memory(src, dst)  # else in place: in cache
        # A small batch on the calling thread alone, the threads' count set and given back in
        # compiled code (numba's Python calls for it were a third of a node batch's overhead).
        if len(src) >= SERIAL_BELOW:
            run = _kernel
        else:
            jitpool.start()
            run = _kernel_alone
        run(src, dst, sums, nw, c, decay, out.view(np.uint16), far, cfg.kind == "adamw")


def warm(cfg: OptimizerConfig, kernel: str | None = None) -> None:
    """Compile (or load from numba's cache) the kernels `cfg` uses with `kernel` (default:
    `selected()`) and start the kernel's threads, so that neither the first step waits nor the
    process grows after start-up."""
    kernel = kernel or selected()
    if kernel == "numpy":
        return
    for n in (2, SERIAL_BELOW):  # the calling thread's kernel, and the threads' (from the cache, each loads apart)
        rec = np.zeros((n, 3, K), np.float32)
        update_records(cfg, rec, rec, np.zeros((n, K), np.int64), 1, 0, np.empty((n, K), np.float16), kernel)
    check_sums(codec.header_array(1), 1, 1, 0, 0, 1, 1, K)
    in_order_batch(codec.header_array(1), 1, 1, 0, 0, 1, 1, K, 0, np.zeros(1, np.bool_))
