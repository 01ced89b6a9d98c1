"""Out-of-core optimizer node: the pipeline against the disk, the residency model against the
pipeline, and a 1-billion-parameter state killed mid-step and resumed (minutes; 2 x 12 GB on disk,
said and skipped when the disk has less free).

    python bench/ooc.py [--elements N] [--dir D] [--page-chunks C] [--params 1000000000] [--budget 1G]
    python bench/ooc.py --no-scale                 # the budget figures only (so does MINDP_BENCH_SCALE=0)

1. The machine as the model sees it (host_agent/probe.py): disk sequential read and write (and
   both at once), the CPU they cost, the node's update rate streamed with a free disk (tmpfs),
   the cores we get; the disk's sequential read+write bandwidth is the baseline (bytes read +
   written over the time to write then read them).
2. For RAM budgets of 1/2, 1/10 and 1/50 of the state (both copies): the step time the residency
   model predicts (host_agent/residency.py) from the machine's figures against the measured one
   (NodeCore.handle fed sums in chunk order in the node's receive batches, node_socket.RECV_ROWS) over five
   rounds of (probe, 8 steps at each budget, the budgets in turn), so that others' load on a shared
   machine disturbs probes and budgets alike: the prediction from each machine figure's median over
   the rounds against the median step after each round's first (typical against typical: the
   fastest step is often one that met a fast stretch of a shared disk); and the state moved per
   second (each element's record read from one copy and written to the other) against the baseline.
3. Scale: host_agent/synthetic.py at --params (default 1e9: fp32 master, m, v = 12 GB per copy)
   with --budget (default 1 GiB): 3 steps uninterrupted, then 3 steps with the node killed
   (SIGKILL) half-way through the second and restarted, one after the other (one state on disk at
   a time), compared by a checksum of the final state; elements/s and peak RSS.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from host_agent import node_core, node_socket, probe, residency, state, synthetic  # noqa: E402
from host_agent.agent_args import integer, parse_size  # noqa: E402
from host_agent.optim import ConfigError, OptimizerConfig  # noqa: E402
from mindp.layout import Layout, TensorSpec  # noqa: E402
from mindp.protocol import K  # noqa: E402

BUDGETS = (2, 10, 50)
SLOTS = 64
SCALE_ENV = "MINDP_BENCH_SCALE"  # make bench's switch for the scale run; read here only
SCALE_PARAMS, SCALE_BUDGET = 1_000_000_000, "1G"


def scale_from_env() -> bool:
    """MINDP_BENCH_SCALE: 1 (or unset, or empty) runs the scale run, 0 leaves it out; anything else
    is refused ('false' and 'no' ran it)."""
    value = os.environ.get(SCALE_ENV) or "1"
    if value not in ("0", "1"):
        raise ValueError(f"{SCALE_ENV} must be 0 or 1, not {value!r}")
    return value == "1"


def dir_error(path: str | None) -> str | None:
    """Why --dir cannot take the bench's temporary directory (None: it can), to say before any work
    (tempfile.mkdtemp's own error is a traceback); bench/agents.py's --dir too."""
    if path is None:
        return None
    if not os.path.isdir(path):
        return f"--dir {path}: {'not a directory' if os.path.exists(path) else 'no such directory'}"
    return None if os.access(path, os.W_OK | os.X_OK) else f"--dir {path}: not writable"


def measure(tmp: pathlib.Path, elements: int, budget: int, page_chunks: int, steps: int = 3,
            batch: int = node_socket.RECV_ROWS) -> tuple[list[float], state.Store]:
    """Per-step wall times of NodeCore.handle over whole steps, commits included."""
    layout = Layout([TensorSpec("p", (elements,))])
    cfg = OptimizerConfig()
    d = tmp / f"state-{budget}"
    state.create(d, layout, state.init_pieces(layout, seed=0), cfg, page_chunks)
    store = state.Store(d, budget, window=SLOTS)
    core = node_core.NodeCore(store, 1, 2, SLOTS)
    n = layout.n_chunks
    sums = synthetic.sums(0, 0, n)
    chunks = np.arange(n)
    times = []
    store.prefetch_from(0)
    for step in range(steps):
        hdr = synthetic.headers(step, chunks, layout.chunk_count(n - 1), n, SLOTS)
        t = time.perf_counter()
        for lo in range(0, n, batch):
            core.handle(hdr[lo : lo + batch], sums[lo : lo + batch])
        times.append(time.perf_counter() - t)
    assert core.committed == steps - 1
    return times, store


def median_machine(ms: list[residency.Machine]) -> residency.Machine:
    """Each figure the median over the rounds' probes (each itself the median of three passes)."""
    def med(name):
        vals = [getattr(m, name) for m in ms if getattr(m, name) is not None]
        return float(np.median(vals)) if vals else None
    return residency.Machine(**{f.name: med(f.name) for f in dataclasses.fields(residency.Machine)})


def budgets(tmp: pathlib.Path, elements: int, page_chunks: int, steps: int = 8, rounds: int = 5) -> None:
    n_chunks = -(-elements // K)
    w = residency.Workload(n_chunks, page_chunks, window=SLOTS)
    state_bytes = 2 * w.copy_bytes
    print(f"state: {elements:,} elements, {state_bytes / 2**20:,.0f} MiB (two copies), pages of "
          f"{w.page_bytes // 1024} KiB; {rounds} rounds of (machine probe, {steps} steps at each budget, the budgets "
          "in turn); each prediction from the probes' medians against the median step after each round's first",
          flush=True)
    machines, warm, plans, peaks = [], {div: [] for div in BUDGETS}, {}, {}
    for r in range(rounds):
        machines.append(probe.machine(tmp))
        for div in BUDGETS[r % len(BUDGETS):] + BUDGETS[: r % len(BUDGETS)]:  # each budget first in turn
            budget = state_bytes // div
            times, store = measure(tmp, elements, budget, page_chunks, steps)
            warm[div] += times[1:]
            plans[div], peaks[div] = store.pages.plan, max(peaks.get(div, 0), store.pages.peak_pages)
            store.close()
            shutil.rmtree(tmp / f"state-{budget}")
    m = median_machine(machines)
    seq = 2 / (1 / m.disk_read + 1 / m.durable_write)
    print(f"  machine (medians of {rounds} probes): disk read {m.disk_read / 2**20:,.0f} MiB/s, write "
          f"{m.durable_write / 2**20:,.0f} MiB/s fsynced ({m.disk_write / 2**20:,.0f} MiB/s written back, then "
          f"{m.flush * 2**30:.2f} s/GiB of fsync) (sequential read+write {seq / 2**20:,.0f} MiB/s; both at once "
          f"{m.disk_mixed / 2**20:,.0f} MiB/s); node update {m.update / 1e6:,.1f} M elem/s (streamed on tmpfs); "
          f"I/O {m.io_cpu * 2**30:.2f} CPU s/GiB; {m.cores:.1f} cores free; commit sync {m.sync * 1e3:.1f} ms")
    for div in BUDGETS:
        budget, plan, times = state_bytes // div, plans[div], warm[div]
        step = float(np.median(times))
        pred = residency.predict(plan, w, m)
        moved = 2 * w.copy_bytes / step
        err = (pred.step_time - step) / step
        print(f"budget 1/{div:<3} {budget / 2**20:7.1f} MiB: {plan.mode}, {len(plan.resident)} of {w.n_pages} pages "
              f"resident, {plan.ahead} ahead | step predicted {pred.step_time:.3f} s ({pred.bound}-bound) measured "
              f"{step:.3f} s (steps {min(times):.3f}-{max(times):.3f} s), error {err:+.0%} | "
              f"{elements / step / 1e6:,.1f} M elem/s, {moved / 2**20:,.0f} MiB/s of state = "
              f"{moved / seq:.2f}x disk seq read+write (peak {peaks[div]} pages)", flush=True)


def usage_error(why: str) -> int:
    print(f"bench/ooc.py: {why}", file=sys.stderr)
    return 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=integer(K), default=16_000_000, help="model size for the budget figures")
    ap.add_argument("--page-chunks", type=integer(1), default=state.page_chunks_for(1 << 16),
                    help="chunks per page (default: 64Ki elements, 768 KiB of AdamW records, at any K)")
    ap.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temp dir in /var/tmp)")
    ap.add_argument("--scale", action=argparse.BooleanOptionalAction,
                    help=f"the 1-billion-parameter run (minutes; needs 2 x 12 GB free; default on unless "
                         f"{SCALE_ENV}=0)")
    ap.add_argument("--params", type=integer(K), help=f"parameters of the scale run (default {SCALE_PARAMS:,})")
    ap.add_argument("--budget", type=parse_size, help=f"RAM budget of the scale run (default {SCALE_BUDGET})")
    args = ap.parse_args()
    try:  # refused under --[no-]scale too: it is set for all of make bench's scripts
        env_scale = scale_from_env()
    except ValueError as exc:
        return usage_error(str(exc))
    scale = env_scale if args.scale is None else args.scale
    sizes = [name for name, v in (("--params", args.params), ("--budget", args.budget)) if v is not None]
    if sizes and not scale:
        off = "--no-scale" if args.scale is False else f"{SCALE_ENV}=0"
        return usage_error(f"{' and '.join(sizes)}: for the scale run, which {off} leaves out")
    args.params = SCALE_PARAMS if args.params is None else args.params
    args.budget = parse_size(SCALE_BUDGET) if args.budget is None else args.budget
    if error := dir_error(args.dir):
        return usage_error(error)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="mindp-ooc-", dir=args.dir or "/var/tmp"))
    try:
        budgets(tmp, args.elements, args.page_chunks)
        if scale:
            synthetic.bench(tmp, args.params, args.budget)
    except (ConfigError, residency.PlanError) as exc:  # sizes the state cannot take
        return usage_error(str(exc))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
