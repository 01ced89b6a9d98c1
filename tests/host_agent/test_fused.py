"""The fused node kernel against the reference composition (mean_gradient, apply, astype): same bits."""
import json
import os
import pathlib
import sys

import numpy as np
import pytest

from host_agent import fused
from host_agent.optim import OptimizerConfig
from mindp import progress
from mindp.protocol import K

needs_numba = pytest.mark.skipif(fused.NUMPY_ONLY, reason="numba not installed: only the numpy path exists")
# Both kernels on a CPU with AVX2 and F16C (the portable one forced, as on any other CPU).
KERNELS = ["avx2", "portable"] if fused.host_has_avx2() else ["portable"]


def hard_records(rng, n):
    """Records with ordinary, subnormal, near-fp16-overflow, huge, zero, infinite and NaN values
    (a signalling NaN among them: the fp16 conversion keeps its payload, as numpy does)."""
    src = np.empty((n, 3, K), np.float32)
    src[:, 0] = rng.standard_normal((n, K)).astype(np.float32) * np.float32(1e-2)
    src[:, 1] = rng.standard_normal((n, K)).astype(np.float32) * np.float32(1e-5)
    src[:, 2] = np.abs(rng.standard_normal((n, K))).astype(np.float32) * np.float32(1e-9)
    flat = src.reshape(-1)
    flat[::97] = np.float32(1e-40)   # float32 subnormal
    flat[::89] = np.float32(65519.0)  # rounds to the largest fp16
    flat[::83] = np.float32(6.1e-5)   # near the smallest normal fp16
    flat[::101] = np.float32(3e38)
    flat[::103] = 0.0
    flat[::107] = np.inf
    flat[::109] = np.nan
    flat.view(np.uint32)[::113] = 0x7F800001  # signalling
    return src


def same_records(got, want):
    """float32 records bit for bit, but where two NaNs meet in one operation: IEEE 754 leaves whose
    payload the result carries to the implementation, and numpy's loops choose by version and
    alignment. Such a result must still be a NaN; the fp16 parameters the workers see are compared
    bit for bit apart from this."""
    g, w = got.view(np.uint32), want.view(np.uint32)
    nan = np.isnan(want)
    return bool(np.array_equal(g[~nan], w[~nan]) and np.isnan(got[nan]).all())


@needs_numba
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
@pytest.mark.parametrize("wd", [0.0, 0.05])
@pytest.mark.parametrize("n", [1, 5, 300])
@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_equals_the_numpy_composition_bit_for_bit(kernel, kind, wd, n):
    rng = np.random.default_rng(n)
    cfg = OptimizerConfig(kind=kind, lr=3e-3, weight_decay=wd)
    src = hard_records(rng, n)
    sums = rng.integers(-(1 << 40), 1 << 40, size=(n, K))
    sums[:, ::7] = rng.integers(-8, 8, size=sums[:, ::7].shape)  # means far below fp16's range
    nworkers = rng.integers(1, 6, size=n)
    for step in (0, 9):
        got, want = np.empty_like(src), np.empty_like(src)
        got_p, want_p = np.empty((n, K), np.float16), np.empty((n, K), np.float16)
        got[:, 2] = src[:, 2]  # SGD's kernel leaves v as it is; in the node both copies hold the same
        fused.update_records(cfg, src, got, sums, nworkers, step, got_p, kernel)
        with np.errstate(all="ignore"):
            fused.update_numpy(cfg, src, want, sums, nworkers, step, want_p)
        assert same_records(got, want)
        assert np.array_equal(got_p.view(np.uint16), want_p.view(np.uint16))
        assert not np.array_equal(got, src)


@needs_numba
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_a_batch_on_the_kernels_threads_equals_it_in_small_batches_on_one(kernel, kind):
    import numba

    n = fused.SERIAL_BELOW + 37  # one call on the threads; below, slices of it on the calling thread
    rng = np.random.default_rng(3)
    cfg = OptimizerConfig(kind=kind, lr=3e-3, weight_decay=0.05)
    src = hard_records(rng, n)
    sums = rng.integers(-(1 << 40), 1 << 40, size=(n, K))
    nworkers = rng.integers(1, 6, size=n).astype(np.float64)
    whole, parts = src.copy(), src.copy()
    whole_p, parts_p = np.empty((n, K), np.float16), np.empty((n, K), np.float16)
    threads = numba.get_num_threads()
    fused.update_records(cfg, src, whole, sums, nworkers, 3, whole_p, kernel)
    for lo in range(0, n, 1000):
        hi = min(lo + 1000, n)
        fused.update_records(cfg, src[lo:hi], parts[lo:hi], sums[lo:hi], nworkers[lo:hi], 3, parts_p[lo:hi], kernel)
    assert numba.get_num_threads() == threads  # a small batch gives the threads back
    assert np.array_equal(whole.view(np.uint32), parts.view(np.uint32))
    assert np.array_equal(whole_p.view(np.uint16), parts_p.view(np.uint16))
    assert not np.array_equal(whole, src)


@needs_numba
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_narrow_and_wide_rows_mixed_in_a_block_equal_the_numpy_composition(kernel, kind):
    """Rows of sums within int32 averaged over a power-of-two count take the kernel's float32
    conversion; a row with one sum just past int32, or a count of 3, 5 or 6, the float64 one."""
    rng = np.random.default_rng(11)
    n = 200  # three blocks of the parallel loop, each with rows of every kind
    cfg = OptimizerConfig(kind=kind, lr=3e-3, weight_decay=0.05)
    src = hard_records(rng, n)
    sums = rng.integers(-(1 << 31), 1 << 31, size=(n, K))
    sums[::6, 3] = 1 << 31
    sums[1::6, 7] = -(1 << 31) - 1
    sums[2::6, 0], sums[2::6, 31] = -(1 << 31), (1 << 31) - 1  # the extremes that fit
    sums[3::6] = rng.integers(-3, 4, size=sums[3::6].shape)  # zeros and means far below fp16's range
    sums[4::6, ::2] = rng.integers(-(1 << 24), 1 << 24, size=sums[4::6, ::2].shape) * 97  # odd, above 2**24
    nworkers = rng.choice([1, 2, 3, 4, 5, 6, 8, 16, 32], size=n)
    got, want = np.empty_like(src), np.empty_like(src)
    got[:, 2] = src[:, 2]
    got_p, want_p = np.empty((n, K), np.float16), np.empty((n, K), np.float16)
    fused.update_records(cfg, src, got, sums, nworkers, 3, got_p, kernel)
    with np.errstate(all="ignore"):
        fused.update_numpy(cfg, src, want, sums, nworkers, 3, want_p)
    assert same_records(got, want)
    assert np.array_equal(got_p.view(np.uint16), want_p.view(np.uint16))


@needs_numba
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
@pytest.mark.parametrize("offset", [0, 4, 16])
@pytest.mark.parametrize("kernel", KERNELS)
def test_records_stream_out_alike_at_any_alignment_and_in_place(kernel, kind, offset):
    """A 32-byte aligned destination takes the non-temporal stores, any other the plain ones; a
    source that is its destination is read whole before it is written."""
    rng = np.random.default_rng(offset)
    cfg = OptimizerConfig(kind=kind, weight_decay=0.05)
    n = 70  # past one block of the parallel loop
    src = hard_records(rng, n)
    sums = rng.integers(-(1 << 40), 1 << 40, size=(n, K))
    want, want_p = src.copy(), np.empty((n, K), np.float16)
    with np.errstate(all="ignore"):
        fused.update_numpy(cfg, src, want, sums, 3, 4, want_p)
    buf = np.zeros(n * 3 * K * 4 + 64, np.uint8)
    base = (-buf.ctypes.data) % 32 + offset
    dst = buf[base : base + n * 3 * K * 4].view(np.float32).reshape(n, 3, K)
    assert dst.ctypes.data % 32 == offset
    dst[:, 2] = src[:, 2]
    got_p = np.empty((n, K), np.float16)
    fused.update_records(cfg, src, dst, sums, 3, 4, got_p, kernel)
    assert same_records(dst, want)
    assert np.array_equal(got_p.view(np.uint16), want_p.view(np.uint16))
    dst[:] = src
    fused.update_records(cfg, dst, dst, sums, 3, 4, got_p, kernel)
    assert same_records(dst, want)


@needs_numba
def test_update_records_refuses_records_that_are_not_contiguous():
    cfg = OptimizerConfig()
    src = np.zeros((4, 3, K), np.float32)
    strided = np.zeros((4, 3, 2 * K), np.float32)[:, :, ::2]
    with pytest.raises(ValueError, match="contiguous"):
        fused.update_records(cfg, src, strided, np.zeros((4, K), np.int64), 1, 0, np.empty((4, K), np.float16))


def fp16_ties():
    """float32 bits exactly halfway between two fp16 values, rounding down (even) and up (odd),
    normal and subnormal, of both signs, and their neighbours one ulp either side."""
    ties = [0x33000000]  # 2**-25: half the smallest subnormal
    for exp in range(103, 143):  # .. 2**15
        shift = 13 if exp >= 113 else 126 - exp  # float32 bits below the fp16 result's last
        for mantissa in (0, 1 << shift, 3 << shift, 0x7FFFFF >> shift << shift):
            ties.append((exp << 23) | (mantissa & 0x7FFFFF) | (1 << (shift - 1)))
    ties = np.array(ties, np.uint32)
    ties = np.concatenate([ties, ties - np.uint32(1), ties + np.uint32(1)])
    return np.concatenate([ties, ties | np.uint32(1 << 31)])


@needs_numba
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_rounding_ties_and_special_masters_reach_fp16_as_numpy_rounds_them(kernel, kind):
    """Masters a step leaves unchanged (zero gradient, moments and decay; a NaN comes out quiet):
    the kernel's fp16 out of ties, subnormals, infinities and NaNs equals the numpy composition's."""
    bits = np.concatenate([fp16_ties(), np.array([0x7F800001, 0xFF800001, 0x7FC00000, 0x7F800000, 0xFF800000,
                                                  0x00000001, 0x80400000, 0x477FF000, 0x477FEFFF], np.uint32)])
    bits = np.resize(bits, -(-len(bits) // K) * K)
    n = len(bits) // K
    cfg, sums = OptimizerConfig(kind=kind, weight_decay=0.0), np.zeros((n, K), np.int64)
    src = np.zeros((n, 3, K), np.float32)
    src[:, 0] = bits.view(np.float32).reshape(n, K)
    got, want = np.zeros_like(src), np.zeros_like(src)
    got_p, want_p = np.empty((n, K), np.float16), np.empty((n, K), np.float16)
    fused.update_records(cfg, src, got, sums, 2, 0, got_p, kernel)
    with np.errstate(all="ignore"):
        fused.update_numpy(cfg, src, want, sums, 2, 0, want_p)
    kept = ~np.isnan(src[:, 0])
    assert np.array_equal(got[:, 0][kept].view(np.uint32), src[:, 0][kept].view(np.uint32))
    assert same_records(got, want)
    assert np.array_equal(got_p.view(np.uint16), want_p.view(np.uint16))


@needs_numba
@pytest.mark.parametrize("kernel", KERNELS)
def test_fp16_conversion_matches_numpy_on_every_class_of_float32(kernel):
    rng = np.random.default_rng(2)
    bits = rng.integers(0, 1 << 32, size=1 << 20, dtype=np.uint64).astype(np.uint32)
    # exponents around fp16's range (subnormal, normal, overflow) and NaN payloads, densely
    edge = (np.arange(101, 144, dtype=np.uint32)[:, None] << 23) | rng.integers(0, 1 << 23, (43, 4096), dtype=np.uint32)
    nan = np.uint32(0x7F800000) | rng.integers(1, 1 << 23, 4096, dtype=np.uint32)
    bits = np.concatenate([bits, edge.reshape(-1), edge.reshape(-1) | np.uint32(1 << 31), nan,
                           np.array([0x7F800001, 0x7F801FFF, 0x7F800000, 0x477FEFFF, 0x477FF000], np.uint32),
                           fp16_ties()])
    with np.errstate(all="ignore"):
        want = bits.view(np.float32).astype(np.float16).view(np.uint16)
    assert np.array_equal((fused.f16_bits if kernel == "avx2" else fused.portable.f16_bits)(bits), want)


def test_numpy_path_updates_in_place_like_a_copy():
    rng = np.random.default_rng(3)
    cfg = OptimizerConfig()
    src = hard_records(rng, 4)
    sums = rng.integers(-(1 << 30), 1 << 30, size=(4, K))
    a, pa, pb = src.copy(), np.empty((4, K), np.float16), np.empty((4, K), np.float16)
    b = np.empty_like(src)
    with np.errstate(all="ignore"):
        fused.update_numpy(cfg, a, a, sums, 3, 0, pa)
        fused.update_numpy(cfg, src, b, sums, 3, 0, pb)
    assert same_records(a, b) and np.array_equal(pa.view(np.uint16), pb.view(np.uint16))


@needs_numba
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_the_kernels_warm_compiles_are_the_only_ones_the_node_runs(monkeypatch, kernel, kind):
    """Any other argument type would compile a new specialisation mid-run (time and memory)."""
    monkeypatch.setenv("MINDP_KERNEL", kernel)
    assert fused.selected() == kernel
    compiled = [fused._kernel, fused._kernel_alone] if kernel == "avx2" else [fused.portable.KERNELS[kind]]
    cfg = OptimizerConfig(kind=kind)
    fused.warm(cfg)
    before = [len(c.signatures) for c in compiled]
    rng = np.random.default_rng(4)
    for n in (1, 300, fused.SERIAL_BELOW):  # both sides of the one-thread threshold at any K
        src = hard_records(rng, n)
        dst = np.empty_like(src)
        sums = rng.integers(-(1 << 30), 1 << 30, size=(n, K))
        out = np.empty((n, K), np.float16)
        for nworkers in (2, rng.integers(1, 4, size=n), rng.integers(1, 4, size=n).astype(np.uint16)):
            fused.update_records(cfg, src, dst, sums, nworkers, 1, out)
            fused.update_records(cfg, dst, dst, sums, nworkers, 1, out)
    assert [len(c.signatures) for c in compiled] == before == [1] * len(compiled)


WARM_AND_COUNT = """
import json, sys
from host_agent import fused, portable
from host_agent.optim import OptimizerConfig
fused.warm(OptimizerConfig(kind=sys.argv[1]))
jitted = [fused._kernel, fused._kernel_alone, fused._check, fused._in_order] if fused.selected() == "avx2" \
    else [portable.KERNELS[sys.argv[1]]]
print(json.dumps([sum(f.stats.cache_misses.values()) for f in jitted]))
"""


@needs_numba
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_a_second_node_loads_the_kernels_from_numbas_disk_cache(kernel, kind):
    """A node's start compiles nothing that an earlier start compiled (else 3 s of CPU each start,
    and a cache file more each time)."""
    env = {**os.environ, "MINDP_KERNEL": kernel, "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[2])}
    for _ in ("first start", "second start"):
        proc = progress.run([sys.executable, "-c", WARM_AND_COUNT, kind], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [0] * len(json.loads(proc.stdout)), f"the second start compiled: {proc.stdout}"


WARM_ONE = """
import json
from host_agent import fused, portable
from host_agent.optim import OptimizerConfig
fused.warm(OptimizerConfig(), "portable")
print(json.dumps([len(fused._kernel.signatures), len(portable.KERNELS["adamw"].signatures)]))
"""


@needs_numba
def test_warm_compiles_the_kernel_it_is_given_not_the_selected_one():
    """The node warms the kernel kernelpick chose; where that is the portable one, the AVX2 kernel
    (selected() on a CPU with AVX2) is neither compiled nor loaded."""
    env = {**os.environ, "MINDP_KERNEL": "auto", "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[2])}
    proc = progress.run([sys.executable, "-c", WARM_ONE], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [0, 1]


@needs_numba
@pytest.mark.parametrize("lo,hi,n_total", [(0, 999, 1000), (300, 612, 1000)])
def test_sum_checks_one_pass_equal_the_numpy_checks(lo, hi, n_total):
    """Rows broken in one or several fields: the same rows pass, and each failed row is counted
    under its first failed check, by both implementations."""
    from mindp import codec, schedule

    rng = np.random.default_rng(lo)
    n, slots = 4000, 64
    chunk = rng.integers(lo, hi + 1, n)
    step = rng.integers(0, 1 << 31, n)
    slot, ver = schedule.slots_and_versions(step, chunk, n_total, slots)
    h = codec.header_array(n, job=7, chunk=chunk, step=step, slot=slot, ver=ver, nworkers=rng.integers(1, 5, n),
                           count=np.where(chunk == hi, 5, K))
    for field, values in (("job", [6, 8, 0xFFFF]), ("nworkers", [0, 5, 40000]), ("chunk", [lo - 1, hi + 1, 2**32 - 1]),
                          ("count", [0, 5, K + 1]), ("slot", [1, 63, 64]), ("ver", [0, 1]), ("step", [0, 2**32 - 1])):
        rows = rng.choice(n, 300, replace=False)
        h[field][rows] = rng.choice(values, 300)
    args = (7, 4, lo, hi, n_total, slots, 5)
    ok, bad = fused.check_sums(h, *args)
    want_ok, want_bad = fused.check_sums_numpy(h, *args)
    assert np.array_equal(ok, want_ok) and np.array_equal(bad, want_bad)
    assert 0 < ok.sum() < n and (bad > 0).all() and bad.sum() == n - ok.sum()


@needs_numba
def test_in_order_batch_answers_a_clean_run_and_refuses_any_deviation():
    """Each way one row can spoil a run sends the batch to the general path (None), the row among
    the first use of each slot, at each of the four places of a group of later uses (checked
    against the use before), or among the last rows; a clean run is answered with PARAM headers
    (RETRANSMIT kept, worker and nworkers cleared) and its counts."""
    from mindp import codec, schedule
    from mindp.protocol import Flag, Kind

    n_total, slots, step, lo, hi = 100, 8, 5, 10, 99
    chunks = np.arange(60, 100)
    slot, ver = schedule.slots_and_versions(step, chunks, n_total, slots)
    clean = codec.header_array(len(chunks), kind=Kind.SUM, job=3, step=step, chunk=chunks, slot=slot, ver=ver,
                               count=np.where(chunks == hi, 7, K), nworkers=np.arange(len(chunks)) % 4 + 1, worker=9)
    clean["flags"][::3] = Flag.RETRANSMIT
    clean["version"] = 0xA5
    clean["more"] = 0xBEEF
    applied = np.zeros(hi - lo + 1, np.bool_)
    args = (3, 4, lo, hi, n_total, slots, 7, step)
    out, nw = fused.in_order_batch(clean, *args, applied)
    assert (out["kind"] == Kind.PARAM).all() and not out["nworkers"].any() and not out["worker"].any()
    assert np.array_equal(out["flags"], clean["flags"]) and np.array_equal(nw, clean["nworkers"])
    for field in ("chunk", "step", "slot", "ver", "count", "job", "version", "more"):
        assert np.array_equal(out[field], clean[field])
    # Headers in native byte order (np.concatenate makes them), or not 8-byte aligned (a view into
    # received rows), are read as the same fields.
    assert fused.in_order_batch(np.concatenate([clean[:5], clean[5:]]), *args, applied) is not None
    raw = np.zeros(len(clean) * 24 + 3, np.uint8)
    unaligned = raw[3:].view(clean.dtype)
    unaligned[:] = clean
    again, _ = fused.in_order_batch(unaligned, *args, applied)
    assert np.array_equal(again.view(np.uint8), out.view(np.uint8))
    spoilers = [("job", 4), ("nworkers", 0), ("nworkers", 5), ("chunk", 59), ("step", step + 1),
                ("flags", Flag.NONFINITE), ("count", K - 1), ("slot", 9), ("ver", None)]
    for row in (7, 8, 13, 22, 35, 37):  # slot 7's first use; later uses at each place of a group; the tail
        for field, value in spoilers:
            bad = clean.copy()
            bad[field][row] = value if field != "ver" else 1 - ver[row]
            assert fused.in_order_batch(bad, *args, applied) is None, (field, row)
        done = applied.copy()
        done[60 + row - lo] = True
        assert fused.in_order_batch(clean, *args, done) is None, row
    assert fused.in_order_batch(clean, 3, 4, 61, hi, n_total, slots, 7, step, applied) is None  # chunk 60 < lo
    short = clean[-1:].copy()
    short["count"] = K
    assert fused.in_order_batch(short, *args, applied) is None  # the last chunk holds 7


@needs_numba
@pytest.mark.parametrize("n_total, slots, c0, n", [(1000, 3, 5, 990), (1000, 7, 3, 997),
                                                   (800_000, 48, 99_999, (1 << 19) + 77_000),
                                                   (300_000, 1 << 16, 150_000, 150_000)],
                         ids=["3-slots", "7-slots", "48-slots-long-run", "65536-slots"])
def test_in_order_batch_finds_every_rows_slot_and_version(n_total, slots, c0, n):
    """Slots and versions as mindp.schedule gives them, for slot counts that are no power of two
    (3: fewer than the four rows the later uses are checked in at once) and the largest a header
    holds, in runs of many wraps of the slots (one of over 2**19 rows):
    the run passes; one row's version or slot spoiled (at a wrap, at the slots' `rem` boundary,
    at row 2**19, the last) refuses it."""
    from mindp import codec, schedule
    from mindp.protocol import Kind

    step, lo, hi = 3, c0 - 2, n_total - 1
    chunks = np.arange(c0, c0 + n)
    slot, ver = schedule.slots_and_versions(step, chunks, n_total, slots)
    nworkers = np.random.default_rng(n).integers(1, 5, n)
    clean = codec.header_array(n, kind=Kind.SUM, job=1, step=step, chunk=chunks, slot=slot, ver=ver,
                               count=np.where(chunks == hi, 7, K), nworkers=nworkers)
    args = (1, 4, lo, hi, n_total, slots, 7, step, np.zeros(hi - lo + 1, np.bool_))
    assert fused.check_sums_numpy(clean, *args[:7])[0].all()
    answer = fused.in_order_batch(clean, *args)
    assert answer is not None and np.array_equal(answer[1], nworkers)
    assert np.array_equal(answer[0]["slot"], slot) and np.array_equal(answer[0]["ver"], ver)
    wrap = int(np.flatnonzero(slot == 0)[1])
    rem_edge = int(np.flatnonzero(slot == n_total % slots)[0])
    for row in {wrap, wrap - 1, rem_edge, rem_edge - 1, min(1 << 19, n - 1), n - 1}:
        for field, value in (("ver", 1 - ver[row]), ("slot", (slot[row] + 1) % slots)):
            bad = clean.copy()
            bad[field][row] = value
            assert fused.in_order_batch(bad, *args) is None, (field, row)


def test_the_kernel_follows_the_cpu_unless_mindp_kernel_says_otherwise():
    assert fused.choose("auto", True) == "avx2" and fused.choose("auto", False) == "portable"
    assert fused.choose("portable", True) == "portable" and fused.choose("avx2", True) == "avx2"
    with pytest.raises(fused.KernelError, match="lacks AVX2 or F16C"):
        fused.choose("avx2", False)
    with pytest.raises(fused.KernelError, match="one of auto|avx2|portable, got 'sse'"):
        fused.choose("sse", True)


# Run with numba compiling for a baseline CPU (NUMBA_CPU_NAME=generic: on x86-64 SSE2, no AVX, no F16C).
_GENERIC_CPU = """
import numpy as np
from host_agent import fused, portable
from host_agent.optim import OptimizerConfig
from mindp.protocol import K
from tests.host_agent.test_fused import hard_records, same_records

assert not fused.host_has_avx2() and fused.selected() == "portable", fused.selected()
rng = np.random.default_rng(5)
for kind in ("adamw", "sgd"):
    cfg = OptimizerConfig(kind=kind, lr=3e-3, weight_decay=0.05)
    fused.warm(cfg)  # also the header passes (generic vector code, no x86 intrinsic)
    src, nworkers = hard_records(rng, 300), rng.integers(1, 6, 300)
    sums = rng.integers(-(1 << 40), 1 << 40, size=(300, K))
    got, want = src.copy(), src.copy()
    got_p, want_p = np.empty((300, K), np.float16), np.empty((300, K), np.float16)
    fused.update_records(cfg, src, got, sums, nworkers, 2, got_p)
    with np.errstate(all="ignore"):
        fused.update_numpy(cfg, src, want, sums, nworkers, 2, want_p)
    assert same_records(got, want), kind
    assert np.array_equal(got_p.view(np.uint16), want_p.view(np.uint16)), kind
    compiled = portable.KERNELS[kind]
    asm = compiled.inspect_asm(compiled.signatures[0])
    assert "sqrt" in asm or kind == "sgd"
    assert "ymm" not in asm and "vcvtps2ph" not in asm, kind
print("portable ok")
"""


@needs_numba
def test_a_cpu_without_avx2_runs_the_portable_kernel_and_refuses_the_avx2_one(tmp_path):
    """numba compiling for a CPU without AVX2 and F16C: MINDP_KERNEL=auto picks the portable kernel,
    whose code holds no AVX instruction and gives the numpy composition's bits on hard records;
    MINDP_KERNEL=avx2 stops the node with one line before it touches anything."""
    root = pathlib.Path(__file__).resolve().parents[2]
    env = {**os.environ, "NUMBA_CPU_NAME": "generic", "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
           "MINDP_KERNEL": "auto"}
    p = progress.run([sys.executable, "-c", _GENERIC_CPU], cwd=root, env=env, capture_output=True, text=True)
    assert p.returncode == 0 and "portable ok" in p.stdout, p.stderr
    p = progress.run([sys.executable, "-m", "host_agent.node", "--state-dir", str(tmp_path / "state"), "--workers",
                        "2", "--slots", "8", "--mac", "02:00:00:00:00:09", "--ip", "10.0.0.9", "--init", "seed:0"],
                       cwd=root, env={**env, "MINDP_KERNEL": "avx2"}, capture_output=True, text=True)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert lines[0].startswith("mindp-optimizer: MINDP_KERNEL=avx2, but this CPU lacks AVX2 or F16C")
    assert not (tmp_path / "state").exists()
