"""The worker's PARAM receive (host_agent.param_rx), compiled against numpy, side by side, without
the network: a step's PARAM frames of 1 or PARAM_CHUNKS_MAX chunks taken in batches of a few frames
(a gpt worker's ~8 a receive) to many (a burst), checks, window and copy into the parameters.

K is the process's (MINDP_K). .venv/bin/python bench/param_rx.py [--rounds N]
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

from host_agent import fused, param_rx  # noqa: E402
from host_agent.agent_args import integer  # noqa: E402
from host_agent.window import RtoConfig, RttEstimator, Window  # noqa: E402
from mindp import codec  # noqa: E402
from mindp.protocol import PARAM_CHUNKS_MAX, K, Kind, param_frame_len  # noqa: E402

CHUNKS = 4096  # chunks a step
JOB, NODE = 1, ("02:00:00:00:00:fe", "10.0.0.254")


def step_frames(chunks_a_frame: int) -> tuple[np.ndarray, np.ndarray]:
    """A step's PARAM frames (rows of the widest frame) and their lengths, as the node sends them."""
    hdr = codec.header_array(CHUNKS, job=JOB, chunk=np.arange(CHUNKS))
    vals = np.random.default_rng(0).standard_normal((CHUNKS, K)).astype(np.float16)
    addrs = codec.Addresses(NODE[0], "ff:ff:ff:ff:ff:ff", NODE[1], "255.255.255.255")
    if chunks_a_frame == 1:
        f = codec.encode(Kind.PARAM, hdr, vals, addrs)
        lens = np.full(len(f), f.shape[1], np.int64)
    else:
        pf = codec.param_frames(hdr, vals, addrs)
        f, lens = pf.frames, pf.lens.astype(np.int64)
    rows = np.zeros((len(f), param_frame_len(PARAM_CHUNKS_MAX)), np.uint8)
    rows[:, : f.shape[1]] = f
    return rows, lens


def one_step(rx: param_rx.ParamReceiver, rows: np.ndarray, lens: np.ndarray, batch: int, params: np.ndarray) -> float:
    """Seconds to take a step's frames in batches of `batch` rows."""
    w = Window(0, CHUNKS, CHUNKS, RttEstimator(RtoConfig()), 0.0)
    w.attempts[:] = 1
    stats: collections.Counter = collections.Counter()
    t = time.perf_counter()
    for at in range(0, len(rows), batch):
        rx.receive(rows[at : at + batch], lens[at : at + batch], w, params, stats)
    took = time.perf_counter() - t
    assert w.complete and stats["params_received"] == CHUNKS, stats
    return took


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=integer(1), default=5, help="steps timed per case (default 5)")
    args = ap.parse_args(argv)
    if fused.NUMPY_ONLY:  # (make bench goes on to the next script)
        print("bench/param_rx.py: skipped: numba is off (MINDP_NO_NUMBA=1 or not installed): nothing to compare")
        return 0
    counts = np.full(CHUNKS, K, np.uint16)
    rx = {c: param_rx.ParamReceiver(JOB, counts, *NODE, None, CHUNKS) for c in (True, False)}
    rx[False].compiled = False
    params = np.zeros(CHUNKS * K, np.float16)
    print(f"K = {K}, {CHUNKS} chunks a step, {args.rounds} steps a case")
    print(f"{'chunks a frame, frames a batch':32s} {'compiled us':>12s} {'numpy us':>10s} {'ratio':>6s}   (a batch)")
    for chunks_a_frame in (1, PARAM_CHUNKS_MAX):
        rows, lens = step_frames(chunks_a_frame)
        for batch in (8, 64, 1024):
            took = dict.fromkeys(rx, 0.0)
            for r in range(args.rounds + 1):  # round 0 warms up untimed
                for c in (rx if r % 2 else reversed(list(rx))):
                    t = one_step(rx[c], rows, lens, batch, params)
                    took[c] += t if r else 0.0
            per = {c: took[c] / args.rounds / -(-len(rows) // batch) * 1e6 for c in rx}
            print(f"{f'{chunks_a_frame}, {batch}':32s} {per[True]:12.1f} {per[False]:10.1f} "
                  f"{per[False] / per[True]:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
