"""make stress's makerun family: `make run` itself (mininet_topos.run under the machine's one
Mininet lock), exact when its summary.json says its result equals the reference bit for bit and no
worker's step digest differed."""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys

from tools.stress_config import BUSY_LOOP, SCENARIO_CAP, Config

#: Exit code of flock when make run's lock stayed busy (the scenario is skipped).
LOCK_BUSY = 75
#: Seconds a makerun scenario waits for the machine's Mininet lock before it is skipped: a replay
#: waits long; the stress loop briefly, and runs its other families meanwhile (the lock may be
#: held by long runs of other users).
LOCK_WAIT, LOOP_LOCK_WAIT = 600, 60
REPO = pathlib.Path(__file__).resolve().parent.parent


def command(c: Config, work: pathlib.Path, lock_wait: int = LOCK_WAIT) -> list[str]:
    """make run's command line for the configuration (SCRIPT=: the example's own steps and gpt)."""
    what = ["--script", str(REPO / c.script),
            "--args", f"--steps {c.steps}" + (f" --gpt {shlex.quote(c.gpt)}" if c.gpt else "")] if c.script else \
        ["--model", c.model, "--steps", str(c.steps), *(["--gpt", c.gpt] if c.gpt else [])]
    return ["flock", "-w", str(lock_wait), "-E", str(LOCK_BUSY), "/tmp/mindp-run.lock", sys.executable, "-m",
            "mininet_topos.run", "--target", c.target, *(["--k", str(c.k)] if c.k else []), *what,
            "--workers", str(c.workers), "--loss", str(c.agent_loss), "--jobs", str(c.jobs),
            *(["--seed", str(c.seed % 1000)] if not c.script or c.agent_loss else []),  # (a script's run seeds only loss)
            "--pcap", "1", "--cli", "0", "--topo", c.topo, "--optimizers", str(c.optimizers),
            *(["--leaves", "2"] if c.topo == "leafspine" else []),
            "--runs-dir", str(work / "runs"), "--state-file", str(work / "runstate.json")]


def verdict(code: int, summary: dict | None, lock_wait: int = LOCK_WAIT) -> dict:
    """The scenario's verdict from make run's exit code and summary.json (None: it wrote none)."""
    out: dict = {"codes": {"make run": code}, "faults": [], "differs": [], "digest_mismatches": {}}
    if code == LOCK_BUSY:
        out["result"], out["reason"] = "skipped", f"make run's lock stayed busy {lock_wait} s"
        return out
    if summary is None:
        out["result"] = "failed"
        return out
    out["summary"] = {k: v for k, v in summary.items() if not isinstance(v, (list, dict))}
    diff = summary.get("max_abs_param_diff_vs_reference")  # absent: the run ended before comparing
    if diff is not None and diff != 0.0:
        out["differs"].append(f"max_abs_param_diff_vs_reference {diff}")
    if summary.get("digest_mismatches"):
        out["digest_mismatches"]["workers"] = summary["digest_mismatches"]
    out["result"] = "diverged" if out["differs"] or out["digest_mismatches"] else \
        "exact" if code == 0 and diff is not None else "failed"
    return out


def make_run(c: Config, work: pathlib.Path, lock_wait: int = LOCK_WAIT) -> dict:
    """`make run` with the configuration's variables beside its busy loops; its summary's verdict."""
    busy = [subprocess.Popen(BUSY_LOOP) for _ in range(c.busy_loops)]
    run = None
    try:
        with open(work / "make-run.log", "wb") as log:
            # its own process group: stopped by SIGTERM as a whole (make run cleans up), flock and all
            run = subprocess.Popen(command(c, work, lock_wait), stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                   start_new_session=True)
        try:
            code = run.wait(timeout=SCENARIO_CAP)
        except subprocess.TimeoutExpired:
            code = -1
    finally:
        if run is not None and run.poll() is None:
            stop(run)
        for p in busy:
            p.terminate()
            p.wait()
    summaries = sorted((work / "runs").glob("*/summary.json"))
    return verdict(code, json.loads(summaries[-1].read_text()) if summaries else None, lock_wait)


def stop(run: subprocess.Popen) -> None:
    """SIGTERM to make run's group (it cleans up), SIGKILL if it has not ended a minute later."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(run.pid, signal.SIGTERM)
    try:
        run.wait(timeout=60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        run.wait()
