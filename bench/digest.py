"""The step digest's cost (host_agent.digest), side by side with what it rides on.

- node: NodeCore.handle over whole steps of a gpt-sized model (1.3M parameters, sums in chunk order
  in the node's receive batches, commits included) with the digest summed as chunks are applied,
  and with it off (Book.add a no-op); rounds alternate, the median of the per-round ratios is printed;
- worker: the digest of a step's parameters (what a worker computes to check them, once a step),
  against the node's whole step without it.

The node's step is a small part of a gpt step through the network (docs/PERFORMANCE.md: about
1.1 steps/s), so each figure's share of that is smaller still. Run: .venv/bin/python bench/digest.py
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

from host_agent import digest, node_core, node_socket, state  # noqa: E402
from host_agent.agent_args import integer  # noqa: E402
from host_agent.optim import OptimizerConfig  # noqa: E402
from host_agent.worker import slot_and_version  # noqa: E402
from mindp import codec  # noqa: E402
from mindp.layout import Layout, TensorSpec  # noqa: E402
from mindp.protocol import K, Kind  # noqa: E402

GPT_PARAMETERS = 1_300_000


def node_step_seconds(core: node_core.NodeCore, layout: Layout, step: int, sums: np.ndarray) -> float:
    n = layout.n_chunks
    chunks = np.arange(n)
    slot, ver = slot_and_version(step, chunks, n, 64)
    hdr = codec.header_array(n, kind=Kind.SUM, job=1, step=step, chunk=chunks, slot=slot, ver=ver,
                             count=[layout.chunk_count(int(c)) for c in chunks], nworkers=2)
    batch = node_socket.RECV_ROWS
    t = time.perf_counter()
    for lo in range(0, n, batch):
        core.handle(hdr[lo : lo + batch], sums[lo : lo + batch])
    elapsed = time.perf_counter() - t
    assert core.committed == step
    return elapsed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=integer(1), default=9, help="rounds of each (median ratio)")
    p.add_argument("--parameters", type=integer(1), default=GPT_PARAMETERS, help="model size (default: the gpt's)")
    args = p.parse_args(argv)
    layout = Layout([TensorSpec("p", (args.parameters,))])
    sums = np.random.default_rng(0).integers(-(1 << 20), 1 << 20, size=(layout.n_chunks, K), dtype=np.int64)
    with tempfile.TemporaryDirectory() as tmp:
        d = pathlib.Path(tmp) / "state"
        state.create(d, layout, state.init_pieces(layout, seed=0), OptimizerConfig(), state.DEFAULT_PAGE_CHUNKS)
        store = state.Store(d, 1 << 30)
        core = node_core.NodeCore(store, 1, 2, 64)
        on_add = core.digests.add
        node_step_seconds(core, layout, 0, sums)  # warm-up: pages touched, kernels compiled
        step, with_, without, ratios = 1, [], [], []
        for r in range(args.rounds):
            pair = {}
            for on in ((True, False) if r % 2 else (False, True)):
                core.digests.add = on_add if on else (lambda chunks, params: None)
                pair[on] = node_step_seconds(core, layout, step, sums)
                step += 1
            with_.append(pair[True])
            without.append(pair[False])
            ratios.append(pair[True] / pair[False])
        flat = np.random.default_rng(1).standard_normal(layout.n_chunks * K).astype(np.float16)
        blocks = digest.Blocks(0, layout.n_chunks - 1)
        worker = []
        for _ in range(args.rounds):
            t = time.perf_counter()
            blocks.of(flat)
            worker.append(time.perf_counter() - t)
        store.close()
    node_off = statistics.median(without)
    print(f"{args.parameters:,} parameters ({layout.n_chunks:,} chunks of K = {K}), {args.rounds} rounds, medians:")
    print(f"  node step: digest on {statistics.median(with_) * 1e3:.2f} ms, off {node_off * 1e3:.2f} ms: "
          f"on / off = {statistics.median(ratios):.3f}")
    print(f"  worker check: {statistics.median(worker) * 1e3:.2f} ms a step = "
          f"{statistics.median(worker) / node_off:.3f} x the node's step without the digest")
    return 0


if __name__ == "__main__":
    sys.exit(main())
