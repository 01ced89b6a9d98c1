"""The optimizer node driven by synthetic sums, without a network: a state of any size created
piece by piece, whole steps fed in chunk order, a kill -9 mid-step, a resume, and a checksum of the
final state — the scale check of issue 12.4 (bench/ooc.py; tests/host_agent/test_scale.py).

    python -m host_agent.synthetic run --dir D --steps 3 --budget 1G   # one process; prints progress

The sums are a hash of (seed, step, element), so every run (and every resumed process) feeds the
same ones; `run` skips chunks already applied, as workers resend only chunks whose parameters they
lack.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

from mindp import codec, schedule
from mindp.layout import Layout, TensorSpec
from mindp.protocol import K, Kind

from . import fused, node_core, node_socket, state
from .optim import OptimizerConfig

TENSOR = 1 << 22  # elements per tensor of the synthetic model: the initial state is made 16 MB at a time
SLOTS = 64
JOB = 1
NWORKERS = 4


def sums(seed: int, step: int, n: int, lo: int = 0) -> np.ndarray:
    """Deterministic int64 sums (scale 2^24, |mean| < 2^-4) of chunks lo..lo+n-1 of one step:
    a multiplicative hash of (seed, step, element), cheap enough for a billion elements."""
    e = np.arange(lo * K, (lo + n) * K, dtype=np.uint64).reshape(n, K)
    h = (e + np.uint64((seed * 1000003 + step) * 0x9E3779B97F4A7C15 % (1 << 64))) * np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(31)
    return (h >> np.uint64(43)).astype(np.int64) - (1 << 20)


def headers(step: int, chunks: np.ndarray, last_count: int, n_chunks: int, slots: int = SLOTS,
            nworkers: int = NWORKERS) -> np.ndarray:
    """SUM headers of `chunks` as the switch makes them (vectorised)."""
    slot, ver = schedule.slots_and_versions(step, chunks, n_chunks, slots)
    count = np.where(chunks == n_chunks - 1, last_count, K)
    return codec.header_array(len(chunks), kind=Kind.SUM, job=JOB, step=step, chunk=chunks, slot=slot, ver=ver,
                              count=count, nworkers=nworkers)


def layout_for(params: int) -> Layout:
    return Layout([TensorSpec(f"t{i}", (min(TENSOR, params - lo),)) for i, lo in enumerate(range(0, params, TENSOR))])


def create(d: pathlib.Path, params: int, page_chunks: int) -> None:
    lay = layout_for(params)
    state.create(d, lay, state.init_pieces(lay, seed=0), OptimizerConfig(), page_chunks)


def status_kb(field: str, pid: str = "self") -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def run(d: pathlib.Path, steps: int, budget: int, batch: int | None = None, seed: int = 0, log=None) -> dict:
    """Feed whole steps until `steps` are committed (resuming where the state is), in batches of
    `batch` sums (default: the node's receive batch); per-step times, RSS before the state is
    opened (the fixed overhead) and peak RSS."""
    batch = batch or node_socket.RECV_ROWS
    fused.warm(OptimizerConfig())
    try:  # peak RSS from here on (a test runs this inside a process that may have peaked before)
        pathlib.Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    rss_base = status_kb("VmRSS")
    store = state.Store(d, budget, window=SLOTS)
    core = node_core.NodeCore(store, JOB, NWORKERS, SLOTS)
    n = store.n_chunks
    last_count = store.layout.chunk_count(n - 1)
    times = []
    store.prefetch_from(0)
    while core.committed < steps - 1:
        step = store.current
        t = time.perf_counter()
        for lo in range(0, n, batch):
            chunks = lo + np.flatnonzero(~store.applied[lo : lo + batch])
            if not len(chunks):
                continue
            if chunks[-1] - chunks[0] == len(chunks) - 1:
                s = sums(seed, step, len(chunks), int(chunks[0]))
            else:
                s = np.concatenate([sums(seed, step, 1, int(c)) for c in chunks])
            hdr, _ = core.handle(headers(step, chunks, last_count, n), s)
            if len(hdr) != len(chunks):
                raise RuntimeError(f"step {step}: {len(chunks)} sums, {len(hdr)} answers")
            if log:
                print(f"step {step} chunk {int(chunks[-1]) + 1} of {n}", file=log, flush=True)
        times.append(time.perf_counter() - t)
    out = {"times": times, "rss_base_kb": rss_base, "vm_hwm_kb": status_kb("VmHWM"), "committed": core.committed,
           "resumed_chunks": int(core.stats["resumed_chunks"]), "peak_pages": store.pages.peak_pages,
           "page_bytes": store.pages.page_bytes, "elements": store.layout.total}
    store.close()
    return out


def checksum(d: pathlib.Path) -> str:
    """blake2b of the committed copy's records (master, m, v of every chunk), read with large I/O."""
    meta = state.read_meta(d)
    commit = state.read_commit(d)
    n = state.optim.layout_from_json(meta["layout"]).n_chunks
    nbytes = n * state.record(state.record_lanes(meta)).itemsize
    h = hashlib.blake2b(digest_size=16)
    path = d / f"state{int(commit['updates']) % 2}.bin"
    with open(path, "rb", buffering=0) as f:
        done = 0
        while done < nbytes:
            block = f.read(min(64 << 20, nbytes - done))
            if not block:
                raise RuntimeError(f"{path}: short read")
            h.update(block)
            done += len(block)
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return f"step {commit['step']} updates {commit['updates']} {h.hexdigest()}"


def run_killed(d: pathlib.Path, steps: int, budget: int, kill_step: int, kill_fraction: float = 0.5) -> dict:
    """`run` in a child process, killed with SIGKILL once step `kill_step` is `kill_fraction`
    applied; then `run` again in another (the restarted node). Returns the second's figures and
    the killed one's peak RSS."""
    cmd = [sys.executable, "-m", "host_agent.synthetic", "run", "--dir", str(d), "--steps", str(steps),
           "--budget", str(budget)]
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).resolve().parent.parent)}
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    killed_hwm = 0
    for line in child.stdout:
        parts = line.split()
        if parts[:1] == ["step"] and int(parts[1]) == kill_step and int(parts[3]) >= kill_fraction * int(parts[5]):
            killed_hwm = status_kb("VmHWM", str(child.pid))
            child.send_signal(signal.SIGKILL)
            break
    child.stdout.close()
    if child.wait() != -signal.SIGKILL:
        raise RuntimeError(f"the node to kill exited with {child.returncode} before step {kill_step}")
    done = subprocess.run(cmd + ["--json"], capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"the resumed node failed: {done.stderr.strip()[-500:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["killed_vm_hwm_kb"] = killed_hwm
    return out


def bench(tmp: pathlib.Path, params: int, budget: int, steps: int = 3, page_elements: int = 1 << 16) -> None:
    """The 1B-parameter figure of bench/ooc.py: uninterrupted, then killed mid-step and resumed
    (pages of `page_elements`: 768 KiB of records at any K)."""
    page_chunks = state.page_chunks_for(page_elements)
    per_copy = -(-params // K) * state.record(OptimizerConfig().lanes).itemsize
    free = shutil.disk_usage(tmp).free
    print(f"scale: {params:,} parameters, {per_copy / 1e9:.1f} GB per copy ({2 * per_copy / 1e9:.1f} GB on disk), "
          f"budget {budget / 2**20:,.0f} MiB; {free / 1e9:.0f} GB free", flush=True)
    if free < 2 * per_copy + (1 << 30):
        print("scale: not enough free disk; skipped", flush=True)
        return
    d = tmp / "scale"
    sums_seen = []
    for killed in (False, True):
        t = time.perf_counter()
        create(d, params, page_chunks)
        made = time.perf_counter() - t
        if killed:
            out = run_killed(d, steps, budget, kill_step=steps - 2)
        else:
            out = run(d, steps, budget)
        t = time.perf_counter()
        sums_seen.append(checksum(d))
        summed = time.perf_counter() - t
        shutil.rmtree(d)
        rate = out["elements"] / (sum(out["times"][1:]) / max(1, len(out["times"][1:]))) if len(out["times"]) > 1 else 0
        what = "killed mid-step and resumed" if killed else "uninterrupted"
        print(f"scale {what}: created in {made:.0f} s; step times {', '.join(f'{x:.1f}' for x in out['times'])} s"
              + (f" ({rate / 1e6:.1f} M elem/s)" if rate else f" (resumed {out['resumed_chunks']:,} chunks applied)")
              + f"; peak RSS {out['vm_hwm_kb'] / 1024:,.0f} MiB = budget {budget / 2**20:,.0f} MiB + "
              f"{(out['vm_hwm_kb'] - budget // 1024) / 1024:,.0f} MiB (process before the state: "
              f"{out['rss_base_kb'] / 1024:,.0f} MiB)"
              + (f"; killed process peak {out['killed_vm_hwm_kb'] / 1024:,.0f} MiB" if killed else "")
              + f"; state checksum in {summed:.0f} s: {sums_seen[-1]}", flush=True)
    print(f"scale: final state {'bit-identical' if sums_seen[0] == sums_seen[1] else 'DIFFERENT'} "
          "between the uninterrupted and the killed-and-resumed run", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m host_agent.synthetic")
    ap.add_argument("what", choices=["run"])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--budget", type=int, required=True, help="bytes")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON at the end, no progress")
    args = ap.parse_args(argv)
    out = run(pathlib.Path(args.dir), args.steps, args.budget, log=None if args.json else sys.stdout)
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
