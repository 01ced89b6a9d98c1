"""Per-job statistics from the switch's P4 counters, and rates between two reads.

Pure logic over counter cells {counter name: {index: (packets, bytes)}}; the
controller reads those over P4Runtime (BMv2 cannot read registers there).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from . import p4info_names as n

COUNTERS = (*n.JOB_COUNTERS, n.DROPS)
_ROW_NAME = {n.NO_JOB_ROW: "no job"}


@dataclass
class JobCounters:
    job_id: int
    grad_packets: int = 0
    grad_bytes: int = 0
    completions: int = 0
    duplicates: int = 0
    resent_sums: int = 0
    param_packets: int = 0
    param_bytes: int = 0
    rewrite_misses: int = 0
    drops: dict[str, int] = field(default_factory=dict)  # reason name -> packets (nonzero only)

    @property
    def dropped(self) -> int:
        return sum(self.drops.values())

    def values(self) -> dict[str, int]:
        """Every scalar counter plus `dropped` and `drop.<REASON>`."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("job_id", "drops")}
        out["dropped"] = self.dropped
        out.update({f"drop.{r}": v for r, v in sorted(self.drops.items())})
        return out

    def to_dict(self) -> dict:
        return {"job_id": self.job_id, **{k: v for k, v in self.values().items() if not k.startswith("drop.")},
                "drops": dict(self.drops)}


@dataclass
class Snapshot:
    time: float
    jobs: dict[int, JobCounters]
    no_job: JobCounters  # drops of packets without a valid job id (and ordinary frames: NO_ROUTE)
    digests: dict[int, dict] = field(default_factory=dict)  # a run's step-digest counters (controller.digests)
    run_dir: str = ""

    def to_dict(self) -> dict:
        return {"time": self.time, "jobs": {str(j): c.to_dict() for j, c in sorted(self.jobs.items())},
                "no_job": {"drops": dict(self.no_job.drops), "dropped": self.no_job.dropped},
                **({"digests": {str(j): c for j, c in self.digests.items()}, "run": self.run_dir}
                   if self.digests else {})}


def _cell(cells: dict[int, tuple[int, int]], index: int) -> tuple[int, int]:
    return cells.get(index, (0, 0))


def snapshot(cells: dict[str, dict[int, tuple[int, int]]], time: float, job_ids) -> Snapshot:
    """Counters of `job_ids` (and of the no-job row) from raw counter cells."""
    def job(row: int) -> JobCounters:
        c = JobCounters(row)
        if row < n.MAX_JOBS:
            c.grad_packets, c.grad_bytes = _cell(cells.get(n.GRAD_PACKETS, {}), row)
            c.completions = _cell(cells.get(n.COMPLETIONS, {}), row)[0]
            c.duplicates = _cell(cells.get(n.DUPLICATES, {}), row)[0]
            c.resent_sums = _cell(cells.get(n.RESENT_SUMS, {}), row)[0]
            c.param_packets, c.param_bytes = _cell(cells.get(n.PARAM_PACKETS, {}), row)
            c.rewrite_misses = _cell(cells.get(n.REWRITE_MISSES, {}), row)[0]
        c.drops = row_drops(cells.get(n.DROPS, {}), row)
        return c

    return Snapshot(time, {j: job(j) for j in sorted(job_ids)}, job(n.NO_JOB_ROW))


def row_drops(drop_cells: dict[int, tuple[int, int]], row: int) -> dict[str, int]:
    """One row's (a job's, or the no-job row's) drops by reason name, nonzero only, from the DROPS counter's cells."""
    out = {}
    for reason in n.DropReason:
        v = _cell(drop_cells, n.drop_cell(row, reason))[0]
        if v:
            out[reason.name] = v
    return out


def job_drops(per_switch: list[dict[int, tuple[int, int]]], job_ids) -> dict[int, dict[str, int]]:
    """Each job's drops by reason summed over switches (the DROPS counter's cells of each): what a
    run reads after each step (one counter read a switch)."""
    out: dict[int, dict[str, int]] = {}
    for j in sorted(job_ids):
        total: dict[str, int] = {}
        for cells in per_switch:
            for reason, v in row_drops(cells, j).items():
                total[reason] = total.get(reason, 0) + v
        out[j] = total
    return out


def rates(before: Snapshot, after: Snapshot) -> dict[int, dict[str, float]]:
    """Per job, every counter's increase per second between two snapshots."""
    dt = after.time - before.time
    if dt <= 0:
        raise ValueError("snapshots must be taken in order, at different times")
    out = {}
    for j, now in after.jobs.items():
        then = before.jobs.get(j, JobCounters(j)).values()
        out[j] = {k: (v - then.get(k, 0)) / dt for k, v in now.values().items()}
    return out
