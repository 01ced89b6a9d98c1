"""The workers' step-digest counters of a make run, for `mindp-ctl stats --run DIR`.

The switch does not see digests (they go between the workers and the optimizer node over UDP), so
the counters come from the run's worker logs (DIR/logs/worker-job<J>-<W>.log, what summary.json
sums too): a worker that finished wrote a `done` record with its digest_checks and
digest_mismatches; one still running is counted by the one line it prints at each mismatch
(its checks are known once it is done). A SCRIPT= run's torchrun ranks write their `done` record to
DIR/logs/ranks/rank<r>.jsonl as they exit (their mismatch lines go to torchrun's log: a running rank
counts none).
"""
from __future__ import annotations

import json
import pathlib
from dataclasses import asdict, dataclass

from host_agent.digest import MISMATCH_LINE



@dataclass
class DigestCounts:
    checks: int = 0  # steps checked by the workers that are done
    mismatches: int = 0  # steps whose parameters differed (and were taken again from the node)
    workers_done: int = 0
    workers: int = 0


def worker_counts(lines: list[str]) -> tuple[int, int, bool]:
    """(checks, mismatches, done) from one worker's log lines: its last `done` record's counters,
    else its mismatch lines so far."""
    for line in reversed(lines):
        if line.startswith("{") and '"done"' in line:
            try:
                rec = json.loads(line)
                stats = rec["stats"] if rec.get("ev") == "done" else None
                if isinstance(stats, dict):
                    return int(stats.get("digest_checks", 0)), int(stats.get("digest_mismatches", 0)), True
            except (ValueError, KeyError, TypeError):
                continue
    return 0, sum(MISMATCH_LINE in line for line in lines), False


def read_run(run_dir: str | pathlib.Path, job_ids) -> dict[int, DigestCounts]:
    """Each job's counters from the run directory's worker logs (a job without logs: all zero)."""
    logs = pathlib.Path(run_dir) / "logs"
    if not logs.is_dir():
        raise FileNotFoundError(f"{run_dir}: not a make run directory (no logs/ in it)")
    ranks: dict[int, list[list[str]]] = {}  # a SCRIPT= run's torchrun ranks, by the job their records name
    for path in sorted((logs / "ranks").glob("rank*.jsonl")):
        lines = path.read_text(errors="replace").splitlines()
        ranks.setdefault(record_job(lines), []).append(lines)
    out = {}
    for j in sorted(job_ids):
        c = DigestCounts()
        workers = [p.read_text(errors="replace").splitlines() for p in sorted(logs.glob(f"worker-job{j}-*.log"))]
        for lines in workers + ranks.get(j, []):
            checks, mismatches, done = worker_counts(lines)
            c.checks, c.mismatches = c.checks + checks, c.mismatches + mismatches
            c.workers_done, c.workers = c.workers_done + done, c.workers + 1
        out[j] = c
    return out


def record_job(lines: list[str]) -> int | None:
    """The job a rank's figures (logs/ranks/rank<r>.jsonl, mindp.torch) belong to: its first record's."""
    for line in lines:
        try:
            return int(json.loads(line)["job"])
        except (ValueError, KeyError, TypeError):
            continue
    return None


def attach(snap, run_dir: str | None):
    """The stats snapshot with the run's digest counters of its jobs (unchanged without a run)."""
    if run_dir:
        snap.digests = {j: asdict(c) for j, c in read_run(run_dir, snap.jobs).items()}
        snap.run_dir = str(run_dir)
    return snap


def text(snap) -> str:
    """Lines for stats' table: each job's checks and mismatches ('' without a run)."""
    if not snap.digests:
        return ""
    rows = [f"job {j}: {c['checks']} checked, {c['mismatches']} mismatched "
            f"({c['workers_done']} of {c['workers']} workers done)" for j, c in snap.digests.items()]
    return f"\nstep digests (workers' logs in {snap.run_dir}): " + "; ".join(rows)
