"""Host-agent figures, side by side in one run.

    python bench/agents.py [--only send|ram|ooc ...] [--chunks N] [--elements N ...] [--batch N]
        [--ooc-elements N] [--page-chunks C] [--dir D]

1. Worker send rate (packets/s, encode included) against a bare raw-socket send
   loop of the same frames on the same veth (ratio), and against the worker sending
   frame by frame (sendmmsg) instead of as UDP GSO super-frames (ratio).
2. Optimizer-node update rate in RAM (elements/s: int64 sums in, fp32 master/m/v
   updated, fp16 parameters out) for AdamW and SGD with momentum, against
   torch.optim.AdamW / SGD(foreach=True) on CPU when torch is installed, else
   against the whole-array numpy reference (ratio; the best of 3 each, interleaved);
   beside it the fused kernel alone on the whole state in one call (no per-batch work; the
   AVX2 kernel and the portable one, other CPUs', side by side where the CPU has AVX2),
   a loop that only moves the kernel's bytes (the memory system's ceiling for it), and
   the machine's memory bandwidth (threads copying 512 MiB).
3. Out-of-core update rate with a RAM budget of 1/10 of the state, as state
   bytes moved per second, against the disk's sequential read+write bandwidth
   measured in the same run (probe.disk_median: overwritten and fsynced, read back; ratio).
"""
from __future__ import annotations

import argparse
import functools
import mmap
import os
import pathlib
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.ooc import dir_error  # noqa: E402
from host_agent import (fused, kernelpick, node_core, node_socket, optim, probe, rawsock, residency, state,  # noqa: E402
                        udpgso)
from host_agent.agent_args import integer  # noqa: E402
from host_agent.optim import ConfigError, OptimizerConfig  # noqa: E402
from host_agent.worker import WorkerAgent, WorkerConfig, slot_and_version  # noqa: E402
from mindp import codec  # noqa: E402
from mindp.layout import Layout, TensorSpec  # noqa: E402
from mindp.protocol import K, Kind  # noqa: E402
from mindp.harness.testbed import quiet_veths, sh  # noqa: E402

VETH = ("ha-bench0", "ha-bench1")
#: The figure each option sizes (or, --dir, measures): one given for a figure --only leaves out is refused
FIGURE_OF = {"chunks": "send", "elements": "ram", "batch": "ram", "ooc_elements": "ooc", "page_chunks": "ooc",
             "dir": "ooc"}


# --- 1. worker send rate ------------------------------------------------------------

def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (/proc/stat: softirq work done for a veth's
    peer included, which a process's own figures may miss)."""
    ticks = [int(v) for v in pathlib.Path("/proc/stat").read_text().split(maxsplit=11)[1:11]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def send_rates(chunks: int) -> tuple[list[float], list[float]]:
    """Frames/s of a worker's whole step (encode and send, GSO super-frames), of the same without
    GSO (sendmmsg, frame by frame), and of a bare per-frame send loop, the best of 3 each,
    interleaved; and the machine's busy CPU seconds a frame of each (the mean)."""
    a, b = VETH
    sh("ip", "link", "del", a, check=False)
    sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
    try:
        quiet_veths((a, None), (b, None))  # running: else the first frames meet the noop qdisc, cheap drops
        layout = Layout([TensorSpec("g", (chunks * K,))])
        grads = {"g": np.random.default_rng(0).standard_normal(chunks * K).astype(np.float32) * 0.01}
        # A window as wide as the step: the whole step goes out without waiting for parameters.
        # Without the streaming thread: put() sends each bucket itself, so the time is the sends'.
        cfg = WorkerConfig(1, 0, chunks, "02:00:00:00:00:01", "10.0.0.1", "02:00:00:00:00:02", "10.0.0.2",
                           stream=False)
        socks = [rawsock.open_raw(a), rawsock.open_raw(a)]
        udpgso.detach(socks[1])
        agents = [WorkerAgent(cfg, layout, s) for s in socks]
        frames = codec.encode_tensor(Kind.GRAD, grads["g"], agents[0].addrs, job=1)
        bare = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        bare.bind((a, 0))

        def step(agent: WorkerAgent) -> None:
            h = agent.start_step()
            sent = agent.stats["sent"]
            h.put("g", grads["g"])  # fp16 rounding, encode, and send of every chunk
            assert agent.stats["sent"] - sent == chunks, (agent.stats["sent"] - sent, chunks)
            agent.step += 1

        def bare_loop() -> None:
            for row in frames:
                bare.send(row)

        best, busy = [float("inf")] * 3, [0.0] * 3
        for _ in range(3):
            for i, run in enumerate((lambda: step(agents[0]), lambda: step(agents[1]), bare_loop)):
                t, b0 = time.perf_counter(), machine_busy()
                run()
                best[i] = min(best[i], time.perf_counter() - t)
                busy[i] += machine_busy() - b0
        bare.close()
        for s in socks:
            s.close()
        return [chunks / t for t in best], [b / (3 * chunks) for b in busy]
    finally:
        sh("ip", "link", "del", a, check=False)


# --- 2 and 3. optimizer node --------------------------------------------------------

def sums_for(layout: Layout, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(-(1 << 20), 1 << 20, size=(layout.n_chunks, K), dtype=np.int64)


def node_rate(tmp: pathlib.Path, elements: int, budget: int | None, steps: int = 2, batch: int = node_socket.RECV_ROWS,
              page_chunks: int = state.DEFAULT_PAGE_CHUNKS, kind: str = "adamw") -> float:
    """Elements/s of NodeCore.handle over whole steps (commits included), sums arriving in chunk
    order in batches of the node's receive batch size; after one untimed step (torch's figure also
    follows a warm-up step; out of core the first step reads the whole state cold, once)."""
    layout = Layout([TensorSpec("p", (elements,))])
    cfg = OptimizerConfig(kind=kind)
    d = tmp / f"state-{budget}"
    state.create(d, layout, state.init_pieces(layout, seed=0), cfg, page_chunks)
    state_bytes = 2 * state.padded_records(layout.n_chunks, page_chunks) * state.record(cfg.lanes).itemsize
    store = state.Store(d, budget or 2 * state_bytes, drop_cache=budget is not None)
    core = node_core.NodeCore(store, 1, 2, 64)
    sums = sums_for(layout)
    n = layout.n_chunks
    hdrs = []
    for step in range(steps + 1):
        chunks = np.arange(n)
        slot, ver = slot_and_version(step, chunks, n, 64)
        hdrs.append(codec.header_array(n, kind=Kind.SUM, job=1, step=step, chunk=chunks, slot=slot, ver=ver,
                                       count=[layout.chunk_count(int(c)) for c in chunks], nworkers=2))
    store.prefetch_from(0)
    for step in range(steps + 1):
        if step == 1:
            t = time.perf_counter()
        for lo in range(0, n, batch):
            out, _ = core.handle(hdrs[step][lo : lo + batch], sums[lo : lo + batch])
    elapsed = time.perf_counter() - t
    assert core.committed == steps
    store.close()
    shutil.rmtree(d)
    return steps * elements / elapsed


def state_copies(n: int, lanes: int) -> tuple[np.ndarray, np.ndarray]:
    """Two copies of n records of `lanes` lanes, page-aligned as the node's mapped state is (the
    kernel's non-temporal stores need 32-byte aligned records) and every page touched (no page
    faults in a timed step)."""
    both = np.frombuffer(mmap.mmap(-1, 2 * n * state.record(lanes).itemsize), np.float32).reshape(2, n, lanes, K)
    both[...] = 0.0
    return both[0], both[1]


def kernel_rate(elements: int, kind: str = "adamw", steps: int = 5, kernel: str | None = None) -> float:
    """Elements/s of fused.update_records (`kernel`, default the selected one) over the whole state
    in one call per step (the two copies alternating, as the node's steps do): the node's ceiling
    without per-batch work."""
    n = -(-elements // K)
    rng = np.random.default_rng(0)
    cfg = OptimizerConfig(kind=kind)
    a, b = state_copies(n, cfg.lanes)
    a[:, state.MASTER] = rng.standard_normal((n, K), dtype=np.float32) * np.float32(0.02)
    sums = rng.integers(-(1 << 20), 1 << 20, size=(n, K), dtype=np.int64)
    out = np.empty((n, K), np.float16)
    fused.update_records(cfg, a, b, sums, 2, 0, out, kernel)
    t = time.perf_counter()
    for step in range(1, steps + 1):
        src, dst = (b, a) if step % 2 else (a, b)
        fused.update_records(cfg, src, dst, sums, 2, step, out, kernel)
    return steps * elements / (time.perf_counter() - t)


@functools.cache
def _mover(lanes: int):
    """traffic_rate's loop over records of `lanes` lanes, compiled once per process: the kernel's
    own (its gradients, prefetches, loads and non-temporal stores: fused.record_update) with one
    add per element in place of the optimizer's arithmetic."""
    import numba

    fetch = fused._fetch_record6 if lanes == 3 else fused._fetch_record4
    record = fused.record_update(lambda builder, c, decay, g, p, *rest: (builder.fadd(p, g), *rest), lanes, 0)
    gradients, sfence, block = fused._gradients, fused._sfence, fused.BLOCK

    def move(src, dst, sums, nw, c, decay, out, far):  # fused._kernel's loop, with `record`
        n = src.shape[0]
        for b in numba.prange((n + block - 1) // block):
            lo, hi = b * block, min(b * block + block, n)
            g = np.empty((hi - lo, K), np.float32)
            gradients(sums, nw, lo, hi, g)
            for i in range(lo, hi):
                fetch(src, i + block)
                record(src, dst, i, g, i - lo, out, c, decay, far)
            sfence()
    return numba.njit(parallel=True, nogil=True)(move)


def traffic_rate(elements: int, kind: str = "adamw", steps: int = 5) -> float | None:
    """Elements/s of a compiled loop that moves the bytes the kernel moves, in its pattern (the
    record's lanes read from one copy and written to the other, the int64 sums read, fp16 out
    written; both cores), with one add per element instead of the optimizer's arithmetic: the
    memory system's ceiling for the node's update (_mover). None where the AVX2 kernel, whose
    code the loop is made of, cannot run."""
    if not fused.host_has_avx2():
        return None
    lanes = OptimizerConfig(kind=kind).lanes  # SGD's records have no v
    move = _mover(lanes)
    n = -(-elements // K)
    a, b = state_copies(n, lanes)
    sums = np.random.default_rng(0).integers(-(1 << 20), 1 << 20, size=(n, K), dtype=np.int64)
    nw, c, out = np.full(n, 2.0), np.zeros(1, np.float32), np.empty((n, K), np.uint16)
    move(a, b, sums, nw, c, False, out, True)
    t = time.perf_counter()
    for step in range(1, steps + 1):
        move(*((b, a) if step % 2 else (a, b)), sums, nw, c, False, out, True)
    return steps * elements / (time.perf_counter() - t)


def baseline_rate(elements: int, kind: str = "adamw", steps: int = 5) -> tuple[str, float]:
    """torch's own update of the same element count (AdamW or SGD with momentum, foreach), else
    the numpy reference on whole arrays."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        p = torch.nn.Parameter(torch.randn(elements))
        if kind == "adamw":
            name, opt = "torch.optim.AdamW(foreach=True)", torch.optim.AdamW([p], lr=1e-3, foreach=True)
        else:
            name, opt = "torch.optim.SGD(momentum, foreach=True)", torch.optim.SGD(
                [p], lr=1e-3, momentum=0.9, weight_decay=0.01, foreach=True)
        p.grad = torch.randn(elements)
        opt.step()
        t = time.perf_counter()
        for _ in range(steps):
            opt.step()
        return name, steps * elements / (time.perf_counter() - t)
    rng = np.random.default_rng(0)
    master = rng.standard_normal(elements).astype(np.float32)
    m, v = np.zeros_like(master), np.zeros_like(master)
    g = rng.standard_normal(elements).astype(np.float32)
    cfg = OptimizerConfig(kind=kind)
    t = time.perf_counter()
    for step in range(steps):
        optim.apply(cfg, master, m, v, g, step)
    return f"numpy {kind} (whole arrays; torch not installed)", steps * elements / (time.perf_counter() - t)


def memory_bandwidth(nbytes: int = 512 << 20, threads: int = os.cpu_count() or 1) -> float:
    """Bytes read + written per second by `threads` threads each copying its share of nbytes
    (numpy releases the GIL for a copy); the best of 3."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.zeros_like(src)
    parts = np.array_split(np.arange(len(src)), threads)
    best = float("inf")
    for _ in range(3):
        workers = [threading.Thread(target=np.copyto, args=(dst[p[0] : p[-1] + 1], src[p[0] : p[-1] + 1]))
                   for p in parts]
        t = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - t)
    return 2 * src.nbytes / best


def disk_bandwidth(tmp: pathlib.Path, nbytes: int) -> float:
    """The disk's sequential read+write bandwidth as the state uses it (host_agent/probe.py: a file
    overwritten page by page and fsynced, then read with O_DIRECT; the median of 3 probes): bytes
    read + written per second of the two in turn."""
    read, write, _, _, flush = probe.disk_median(tmp, nbytes)
    return 2 / (1 / read + 1 / write + flush)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Sizes default to None here, so that one given for a figure --only leaves out can be told apart
    defaults = {"chunks": 100_000, "elements": [4_000_000, 8_000_000, 32_000_000], "ooc_elements": 4_000_000,
                "batch": node_socket.RECV_ROWS, "page_chunks": state.page_chunks_for(1 << 16)}
    ap.add_argument("--chunks", type=integer(1), help="chunks per step for the send-rate figure (default 100,000)")
    ap.add_argument("--elements", type=integer(K), nargs="+",
                    help="model sizes for the in-RAM figures (default: one whose torch state half fits this "
                         "machine's 32 MiB L3, twice that, and one 8x larger)")
    ap.add_argument("--ooc-elements", type=integer(K), help="model size for the out-of-core figure (default 4,000,000)")
    ap.add_argument("--batch", type=integer(1),
                    help="sums per NodeCore.handle call in RAM (default and at most the node's receive batch, "
                         "node_socket.RECV_ROWS)")
    ap.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temp dir in /var/tmp)")
    ap.add_argument("--page-chunks", type=integer(1),
                    help="pager page size in chunks (out of core; default: 64Ki elements a page)")
    ap.add_argument("--only", choices=("send", "ram", "ooc"), action="append",
                    help="run only these figures (repeatable; default all); 'ram' needs neither root nor veths")
    args = ap.parse_args()
    only = set(args.only or ("send", "ram", "ooc"))
    left_out = [f"--{name.replace('_', '-')} ({fig})" for name, fig in FIGURE_OF.items()
                if getattr(args, name) is not None and fig not in only]
    if left_out:
        print(f"bench/agents.py: {', '.join(left_out)}: for figures --only leaves out (it runs "
              f"{', '.join(sorted(only))})", file=sys.stderr)
        return 2
    if error := dir_error(args.dir):
        print(f"bench/agents.py: {error}", file=sys.stderr)
        return 2
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if os.geteuid() != 0 and only & {"send", "ooc"}:
        print("bench/agents.py: needs root (raw sockets, veths)", file=sys.stderr)
        return 2
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="mindp-bench-", dir=args.dir or "/var/tmp"))
    try:
        if "send" in only:
            (worker, per_frame, bare), cpu = send_rates(args.chunks)
            print(f"worker send      {worker:12,.0f} pkt/s   bare raw-socket loop {bare:12,.0f} pkt/s   "
                  f"ratio {worker / bare:.2f}")
            print(f"  without GSO    {per_frame:12,.0f} pkt/s (sendmmsg, frame by frame)   GSO / without "
                  f"{worker / per_frame:.2f}; the machine's CPU a frame {cpu[0] * 1e6:.2f} us against "
                  f"{cpu[1] * 1e6:.2f} (without / GSO {cpu[1] / cpu[0]:.2f})")
        shm = pathlib.Path("/dev/shm")
        if "ram" in only:
            print(f"memory bandwidth {memory_bandwidth() / 1e9:.1f} GB/s read+written ({os.cpu_count()} threads "
                  "copying 512 MiB)")
        for elements in args.elements if "ram" in only else ():
            for kind in ("adamw", "sgd"):
                ram_dir = pathlib.Path(tempfile.mkdtemp(prefix="mindp-bench-", dir=shm)) if shm.is_dir() else tmp
                try:  # state on tmpfs: durability costs nothing; the best of 3 each, interleaved with torch's
                    ours, ceiling, theirs = 0.0, 0.0, 0.0
                    kernels = dict.fromkeys(["avx2", "portable"] if fused.host_has_avx2() else [fused.selected()], 0.0)
                    pairs = []  # portable / AVX2, each pair run back to back: the ratio's noise is the pair's
                    for _ in range(3):
                        ours = max(ours, node_rate(ram_dir, elements, None, batch=args.batch, kind=kind))
                        for _ in range(3 if len(kernels) == 2 else 1):
                            rates = {k: kernel_rate(elements, kind, kernel=k) for k in kernels}
                            kernels = {k: max(kernels[k], r) for k, r in rates.items()}
                            if len(rates) == 2:
                                pairs.append(rates["portable"] / rates["avx2"])
                        ceiling = max(ceiling, traffic_rate(elements, kind) or 0.0)
                        name, base = baseline_rate(elements, kind)
                        theirs = max(theirs, base)
                finally:
                    shutil.rmtree(ram_dir, ignore_errors=True)
                moved = f"; moving its bytes alone {ceiling:,.0f} elem/s, ratio {ceiling / theirs:.3f}" if ceiling else ""
                picked = kernelpick.update_kernel(OptimizerConfig(kind=kind))  # the node's (NodeCore's)
                kernel = kernels[picked]
                if len(kernels) == 2:
                    moved += (f"; portable kernel {kernels['portable']:,.0f} elem/s, "
                              f"{statistics.median(pairs):.2f} x the AVX2 one (median of {len(pairs)} pairs)")
                print(f"node in RAM {kind:5} {elements / 1e6:.0f}M elements {ours:12,.0f} elem/s  {name} "
                      f"{theirs:12,.0f} elem/s   ratio {ours / theirs:.3f}  (fused kernel "
                      f"{picked} alone {kernel:,.0f} elem/s, "
                      f"ratio {kernel / theirs:.3f}{moved})")
        if "ooc" not in only:
            return 0
        record_bytes = state.record(OptimizerConfig().lanes).itemsize  # the out-of-core figure runs AdamW
        state_bytes = 2 * (-(-args.ooc_elements // K)) * record_bytes
        budget = state_bytes // 10
        ooc = node_rate(tmp, args.ooc_elements, budget, page_chunks=args.page_chunks)
        moved = ooc * 2 * record_bytes / K  # each element: its record read from one copy, written to the other
        disk = disk_bandwidth(tmp, max(64 << 20, state_bytes))
        print(f"node out of core {ooc:12,.0f} elem/s  ({moved / 2**20:,.0f} MiB/s of state, budget "
              f"{budget / 2**20:.1f} MiB = state/10)   disk seq read+write {disk / 2**20:,.0f} MiB/s   "
              f"ratio {moved / disk:.2f}")
    except (ConfigError, residency.PlanError) as exc:  # sizes the state cannot take
        print(f"bench/agents.py: {exc}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
