"""The cost of the network for PyTorch (issue 13.5), side by side in one run: steps/s of
`make run MODEL=gpt` (2 workers in Mininet hosts, gradients through the switch, AdamW on the
optimizer node) through the embedded switch and through BMv2 (when installed), against the same
model and global batch trained by one process with torch.optim.AdamW.

    sudo .venv/bin/python bench/torch_gpt.py [--steps 2] [--workers 2]

A switch run's steps/s is make run's own (summary.json: steps over the time from the last worker
ready to the last worker done, so start-up is not counted); the run must also end bit-exact.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
REPO = pathlib.Path(__file__).resolve().parent.parent

try:
    import torch
except ImportError:
    torch = None

from mindp import targets, workload  # noqa: E402
from mininet_topos import config  # noqa: E402
from p4src import artifacts  # noqa: E402


def single_process(wl: workload.WorkloadConfig, steps: int) -> float:
    """Steps/s of one process: every worker's batch in one forward/backward, torch.optim.AdamW."""
    from mindp.torch import models, tasks

    net = tasks.model(wl)
    torch.set_num_threads(os.cpu_count() or 1)  # the whole machine, as the switch run has it
    opt = torch.optim.AdamW(net.parameters(), lr=config.DEFAULT_LR["gpt"], weight_decay=0.01)
    batches = [tasks.batch(wl, w, s) for s in range(steps + 1) for w in range(wl.n_workers)]

    def step(s: int) -> None:
        xs, ys = zip(*batches[s * wl.n_workers:(s + 1) * wl.n_workers])
        opt.zero_grad(set_to_none=True)
        models.loss_of("gpt", net, torch.cat(xs), torch.cat(ys)).backward()
        opt.step()

    step(0)  # warm-up, as a run's first step is not timed apart either way
    t = time.perf_counter()
    for s in range(1, steps + 1):
        step(s)
    return steps / (time.perf_counter() - t)


def switch_run(target: str, workers: int, steps: int, tmp: pathlib.Path) -> tuple[float, str]:
    """(steps/s, '' or why it failed) of make run's orchestrator, MODEL=gpt, on `target`."""
    runs = tmp / target
    p4 = "committed" if artifacts.staleness() is None else "auto"
    cmd = [sys.executable, "-m", "mininet_topos.run", "--target", target, "--model", "gpt",
           "--workers", str(workers), "--steps", str(steps), "--cli", "0", "--p4", p4,
           "--runs-dir", str(runs), "--state-file", str(tmp / f"{target}-state.json"),
           "--grpc-port", str(targets.free_port()), "--thrift-port", str(targets.free_port()),
           "--if-prefix", "mnb-"]
    p = subprocess.run(cmd, cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    try:
        s = json.loads(next(runs.glob("2*/summary.json")).read_text())
    except (StopIteration, OSError, ValueError):
        return 0.0, (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
    if s["max_abs_param_diff_vs_reference"] != 0.0:
        return 0.0, f"not bit-exact ({s['max_abs_param_diff_vs_reference']})"
    return float(s["steps_per_second"]), ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    if torch is None:
        print("torch_gpt: skipped: torch is not installed (pip install -e '.[torch]')")
        return 0
    wl = workload.WorkloadConfig(n_workers=args.workers, model="gpt")
    init = workload.init_params(wl)
    print(f"{workload.describe(wl, init)}, {args.workers} workers x {wl.batch} windows, AdamW lr "
          f"{config.DEFAULT_LR['gpt']}, {args.steps} steps")
    base = single_process(wl, args.steps)
    print(f"  {'one process, torch.optim.AdamW':<34} {base:8.3f} steps/s  (torch threads {torch.get_num_threads()})")
    if os.geteuid() != 0:
        print("  through the switches: skipped (make run needs root)")
        return 0
    with tempfile.TemporaryDirectory(prefix="mindp-bench-gpt-") as tmp:
        for target in ("embedded", "bmv2"):
            label = f"make run MODEL=gpt TARGET={target}"
            if target == "bmv2" and targets.find_bmv2() is None:
                print(f"  {label:<34} skipped: BMv2 simple_switch_grpc not installed")
                continue
            rate, err = switch_run(target, args.workers, args.steps, pathlib.Path(tmp))
            if err:
                print(f"  {label:<34} failed: {err}")
                return 1
            print(f"  {label:<34} {rate:8.3f} steps/s  ratio {rate / base:.3f} of one process (bit-exact)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
