"""Scale-out figures (issue 14.5), side by side in one run.

    python bench/scale.py [--target embedded|bmv2] [--steps 3] [--chunks 128] [--elements 4194304]

1. Packets per training step, each row a real run through real switches (processes, one
   P4Runtime session each, configured by controller.treectl.TreeController) with 4 workers
   (threads, raw sockets in their namespaces) and mindp-optimizer process(es): the SUM frames
   the optimizer node(s) received and the frames the root switch received from its members
   (workers' GRADs on one switch; the leaves' PARTIALs in a leaf-spine), per step and per chunk.
   Next to them the arithmetic for a parameter server without in-network aggregation (every
   worker's gradient reaches the server: workers x chunks).
2. Aggregate optimizer update rate of M = 1, 2, 4 shard processes (NodeCore.handle on their own
   contiguous chunk range of one model, sums in the node's receive batches, state in RAM on
   tmpfs), started together; the ratio to M = 1. On a machine with fewer cores than M the
   processes share them: the figure says so, it does not hide it.

Needs root (namespaces, veths). Prints tables; asserts nothing about speed.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pathlib
import queue
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from host_agent import node_core, node_socket, optim, reference, state  # noqa: E402
from host_agent.agent_args import integer  # noqa: E402
from host_agent.optim import OptimizerConfig  # noqa: E402
from host_agent.window import RtoConfig  # noqa: E402
from host_agent.worker import WorkerAgent, WorkerConfig, slot_and_version  # noqa: E402
from mindp import codec, interrupts  # noqa: E402
from mindp.layout import Layout, TensorSpec, shard_ranges  # noqa: E402
from mindp.protocol import K, Kind  # noqa: E402
from mindp.topology import Topology, leafspine, star  # noqa: E402
from mindp.harness.treebed import TreeBed  # noqa: E402

PREFIX = "bsc"


def rx_packets(iface: str) -> int:
    return int(pathlib.Path(f"/sys/class/net/{iface}/statistics/rx_packets").read_text())


def packets_per_step(topo: Topology, target: str, steps: int, chunks: int, tmp: pathlib.Path) -> dict:
    """One training run through the topology; frames counted per step."""
    layout = Layout([TensorSpec("p", (chunks * K,))])
    init = optim.seed_params(layout, 1)
    np.savez(tmp / "init.npz", **init)
    tree = TreeBed(topo, target, tmp, PREFIX)
    nodes = []
    try:
        topo = tree.topo
        topo.dump(tmp / "topo.json")
        job = topo.jobs[0]
        for i, name in enumerate(job.optimizers):
            args = ["--iface", "eth0", "--topology", str(tmp / "topo.json"), "--job", "1",
                    "--state-dir", str(tmp / f"state{i}"), "--init", str(tmp / "init.npz"), "--steps", str(steps),
                    "--stats", str(tmp / f"stats{i}.json"), "--linger", "1", "--idle-timeout", "60"]
            if job.sharded:
                args += ["--shard", str(i)]
            proc = tree.bed.hosts[name].popen(sys.executable, "-m", "host_agent.node", *args,
                                              stdout=subprocess.PIPE, stderr=open(tmp / f"node{i}.log", "w"), text=True)
            nodes.append(proc)
            if "resuming" not in proc.stdout.readline():
                raise RuntimeError(f"node {name} did not start; see {tmp}/node{i}.log")
        members = tree.root_member_ifaces(1)
        before = sum(rx_packets(i) for i in members)
        errors: list[BaseException] = []

        def work(w: int) -> None:
            try:
                sock = tree.bed.hosts[job.workers[w]].socket()
                cfg = WorkerConfig.from_topology(topo, 1, w, rto=RtoConfig(deadline=30.0))
                agent = WorkerAgent(cfg, layout, sock)
                params = layout.unflatten(layout.flatten(init, dtype=np.float32).astype(np.float16))
                grad = reference.synthetic_grads(3)
                for step in range(steps):
                    params = agent.push(grad(w, step, params))
                sock.close()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(w,)) for w in job.workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        into_root = sum(rx_packets(i) for i in members) - before
        for proc in nodes:
            proc.wait(60)
        if errors:
            raise errors[0]
        stats = [json.loads((tmp / f"stats{i}.json").read_text()) for i in range(len(nodes))]
        return {"workers": job.n_workers, "nodes": len(nodes), "switches": len(topo.switches),
                "node_sums": sum(s.get("sums", 0) for s in stats) / steps,
                "fresh": sum(s.get("applied", 0) for s in stats) / steps,
                "root_in": into_root / steps, "chunks": chunks}
    finally:
        for proc in nodes:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        tree.close()


# --- aggregate update rate of M shard processes ------------------------------------------------

def _shard_worker(d: str, elements: int, lo: int, hi: int, steps: int, barrier, out) -> None:
    layout = Layout([TensorSpec("p", (elements,))])
    n = layout.n_chunks
    state.create(d, layout, state.init_pieces(layout, seed=0), OptimizerConfig(), chunks=(lo, hi))
    store = state.Store(d, 1 << 34)
    core = node_core.NodeCore(store, 1, 2, 64)
    chunks = np.arange(lo, hi + 1)
    sums = np.random.default_rng(lo).integers(-(1 << 20), 1 << 20, size=(len(chunks), K), dtype=np.int64)
    hdrs = []
    for step in range(steps):
        slot, ver = slot_and_version(step, chunks, n, 64)
        hdrs.append(codec.header_array(len(chunks), kind=Kind.SUM, job=1, step=step, chunk=chunks, slot=slot,
                                       ver=ver, count=[layout.chunk_count(int(c)) for c in chunks], nworkers=2))
    barrier.wait()
    t, cpu = time.perf_counter(), time.process_time()
    for step in range(steps):
        for i in range(0, len(chunks), node_socket.RECV_ROWS):
            core.handle(hdrs[step][i : i + node_socket.RECV_ROWS], sums[i : i + node_socket.RECV_ROWS])
    elapsed, cpu = time.perf_counter() - t, time.process_time() - cpu
    assert core.committed == steps - 1
    store.close()
    out.put((elapsed, cpu))


def update_rate(m: int, elements: int, steps: int, tmp: pathlib.Path) -> tuple[float, float]:
    """Elements/s of the whole model with M shard processes working at once (slowest shard's wall
    time), and elements per CPU-second summed over the shards (the work itself, whatever the cores)."""
    n = -(-elements // K)
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(m), ctx.Queue()
    procs = [ctx.Process(target=_shard_worker, args=(str(tmp / f"m{m}-{i}"), elements, lo, hi, steps, barrier, out))
             for i, (lo, hi) in enumerate(shard_ranges(n, m))]
    for p in procs:
        p.start()
    times = []
    while len(times) < m:  # a shard that dies leaves the others at the barrier: end them, say so
        try:
            times.append(out.get(timeout=1))
        except queue.Empty:
            failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if failed:
                for p in procs:
                    p.kill()
                raise SystemExit(f"bench/scale.py: a shard process of the M={m} run failed (exit {failed[0]})")
    for p in procs:
        p.join()
    return steps * elements / max(t for t, _ in times), steps * elements / sum(c for _, c in times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="embedded", choices=["embedded", "bmv2"])
    ap.add_argument("--steps", type=integer(1), default=3)
    ap.add_argument("--chunks", type=integer(2), default=128,
                    help="model size of the packet runs, in chunks (2 shards)")
    ap.add_argument("--elements", type=integer(4 * K), default=1 << 22,
                    help="model size of the update-rate runs (up to 4 shards of a chunk or more)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/scale.py: needs root (network namespaces)", file=sys.stderr)
        return 2
    print(f"1. packets per step through real {args.target} switches ({args.chunks} chunks, {args.steps} steps, "
          "retransmissions included)")
    runs = [("one switch, 4 workers", star([4], slots=64)),
            ("leaf-spine 2x2 workers", leafspine(2, 2, 1, slots=64)),
            ("leaf-spine 2x2, 2 shards", leafspine(2, 2, 2, chunks=args.chunks, slots=64))]
    t0 = time.monotonic()
    print(f"   {'topology':26} {'switches':>8} {'nodes':>5} {'into node(s)':>12} {'per chunk':>9} {'fresh':>6} "
          f"{'into root switch':>16} {'per chunk':>9} {'param server':>12}")
    for label, topo in runs:
        with tempfile.TemporaryDirectory(prefix="mindp-scale-") as tmp:
            r = packets_per_step(topo, args.target, args.steps, args.chunks, pathlib.Path(tmp))
        c = r["chunks"]
        print(f"   {label:26} {r['switches']:>8} {r['nodes']:>5} {r['node_sums']:>12.0f} {r['node_sums'] / c:>9.2f} "
              f"{r['fresh'] / c:>6.2f} {r['root_in']:>16.0f} {r['root_in'] / c:>9.2f} {r['workers'] * c:>12}")
    print("   fresh: sums applied per chunk (the rest are resent sums answering retransmitted gradients);\n"
          "   param server: what a server without in-network aggregation receives per step, workers x chunks"
          f"\n   ({time.monotonic() - t0:.0f} s)")
    print(f"\n2. aggregate update rate, {args.elements} elements, {args.steps} steps, M shard processes "
          f"on {os.cpu_count()} cores (state on tmpfs)")
    base = None
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mindp-scale-", dir="/dev/shm") as tmp:
        for m in (1, 2, 4):
            rate, per_cpu = update_rate(m, args.elements, args.steps, pathlib.Path(tmp))
            base = base or rate
            print(f"   M={m}: {rate / 1e6:7.1f} M elements/s wall   ratio to M=1: {rate / base:.2f}   "
                  f"{per_cpu / 1e6:6.1f} M elements per CPU-second   load average {os.getloadavg()[0]:.1f}")
    print(f"   ({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    interrupts.exit_with(main, "bench/scale.py")
