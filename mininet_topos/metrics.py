"""Per-step metrics of a run: runs/<ts>/metrics.csv for every run, TensorBoard event files where
TensorBoard is installed (`.venv/bin/pip install tensorboard`; it is not a dependency).

One row per job and step, from the run's own records (mininet_topos.progress.Progress): the step's
loss and accuracy (where evaluated), the workers' mean loss on their own batches, its time on the
workers' clocks (the last worker to finish it against the last to finish the step before), the
gradient frames, retransmissions and rejected frames of the job's hosts during it, the optimizer
node's update rate in it (elements it updated per second spent updating them: kernel and state
paging, on its clock; shards' rates summed), the seconds its commit took to make the step durable
(write-back and fsync; the slowest shard's: a disk that stalls shows here, and the workers'
retransmissions while the node waited on it), the CPU seconds of the workers' and node(s)' processes
in it (their lines say it), and the job's drops on its switch(es) by reason: the
counters are read once a step has finished, at most once a second, and after the last step, so a
read that spans several steps counts them in the row of the last and leaves the rows between empty.
"""
from __future__ import annotations

import csv
import math
import pathlib
from dataclasses import dataclass, fields

from mindp.switch_constants import DropReason

from .progress import Progress, mean_said

NAN = float("nan")
#: The drop reasons' columns, one per P4 drop reason (docs/P4.md), in the program's order.
DROP_COLUMNS = [f"drop_{r.name.lower()}" for r in DropReason]


@dataclass(frozen=True)
class StepRow:
    job: int
    step: int  # 0-based; the curves' "after step s"
    loss: float
    accuracy: float  # a fraction; nan where not reported
    step_seconds: float
    grad_frames: int  # gradient frames the job's workers sent in this step (first sends)
    retransmissions: int  # and resent
    host_rejected: int = 0  # frames the job's workers and node(s) received and rejected (every reason)
    node_elements_per_s: float = NAN  # nan where the node reported no commit of the step
    node_commit_seconds: float = NAN  # its durable commit's seconds (the slowest shard's); nan: not reported
    compute_seconds: float = NAN  # the workers' mean forward and backward seconds; nan: not reported
    wait_seconds: float = NAN  # their mean wait for the step's parameters after backward; nan: not reported
    batch_loss: float = NAN  # the workers' mean loss on their own batches in the step; nan: not reported
    worker_cpu_seconds: float = NAN  # a worker's process's CPU in the step (every thread), mean of the job's
    node_cpu_seconds: float = NAN  # the job's optimizer node processes' CPU in the step, shards summed
    switch_drops: dict[str, int] | None = None  # reason name -> drops (nonzero); None: not read at this step

    @property
    def steps_per_second(self) -> float:
        return 1.0 / self.step_seconds if self.step_seconds > 0 else NAN

    @property
    def dropped(self) -> int | None:
        return None if self.switch_drops is None else sum(self.switch_drops.values())


SCALARS = [f.name for f in fields(StepRow) if f.name != "switch_drops"]
COLUMNS = [*SCALARS, "switch_drops", *DROP_COLUMNS]


def _node(progress: Progress, job: int, s: int) -> tuple[float, float, int, float]:
    """(elements updated per second, the slowest commit's seconds, frames the node(s) rejected, their
    CPU seconds: nan unless every shard said it at s and s - 1) in step s, from their commit lines."""
    now = progress.commits.get((job, s))
    if not now:
        return NAN, NAN, 0, NAN
    before = progress.commits.get((job, s - 1), {})
    rate = sum(c[0] / c[1] for c in now.values() if c[1] > 0) if any(c[1] > 0 for c in now.values()) else NAN
    commits = [c[3] for c in now.values() if not math.isnan(c[3])]
    cpu = sum(c[4] - before[shard][4] for shard, c in now.items()) if before.keys() == now.keys() else NAN
    return (rate, max(commits) if commits else NAN,
            sum(c[2] - (before[shard][2] if shard in before else 0) for shard, c in now.items()), cpu)


def _drops(progress: Progress, job: int, s: int) -> dict[str, int] | None:
    """The job's switch drops between the read after step s and the read before it; None when
    no read followed step s."""
    now = progress.drops.get((job, s))
    if now is None:
        return None
    earlier = [k for (j, k) in progress.drops if j == job and k < s]
    before = progress.drops[(job, max(earlier))] if earlier else {}
    delta = {r: v - before.get(r, 0) for r, v in now.items()}
    return {r: v for r, v in delta.items() if v}


def rows(progress: Progress) -> list[StepRow]:
    """Every step that all of a job's workers finished, in order."""
    out = []
    for job, curve in sorted(progress.curves.items()):
        n = sum(1 for (j, _) in progress.workers if j == job)
        loss = {s: (x, a) for s, x, a in zip(curve.steps, curve.loss, curve.acc)}
        done = sorted(s for (j, s), m in progress.marks.items() if j == job and len(m) == n)
        for s in done:
            if s < 0 or (job, s - 1) not in progress.marks or len(progress.marks[(job, s - 1)]) != n:
                continue
            now, before = progress.marks[(job, s)].values(), progress.marks[(job, s - 1)].values()

            def delta(i: int) -> int:
                return sum(m[i] for m in now) - sum(m[i] for m in before)

            x, a = loss.get(s, (NAN, NAN))
            rate, commit, node_rejected, node_cpu = _node(progress, job, s)
            out.append(StepRow(job, s, x, a, max(m[0] for m in now) - max(m[0] for m in before), delta(1), delta(2),
                               delta(3) + node_rejected, rate, commit, mean_said(m[4] for m in now),
                               mean_said(m[5] for m in now), mean_said(m[6] for m in now),
                               sum(m[7] for m in now) / n - sum(m[7] for m in before) / n, node_cpu,
                               _drops(progress, job, s)))
    return out


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if not math.isfinite(v) else f"{v:.6g}"
    return str(v)


def write_csv(path: pathlib.Path, table: list[StepRow]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in table:
            drops = r.switch_drops
            w.writerow([_cell(getattr(r, c)) for c in SCALARS] + [_cell(r.dropped)] +
                       ["" if drops is None else str(drops.get(r_.name, 0)) for r_ in DropReason])


def _row(r: dict) -> StepRow:
    num = {c: float(r.get(c) or "nan")
           for c in ("loss", "accuracy", "step_seconds", "node_elements_per_s", "node_commit_seconds",
                     "compute_seconds", "wait_seconds", "batch_loss", "worker_cpu_seconds", "node_cpu_seconds")}
    drops = None
    if r.get("switch_drops"):
        drops = {reason.name: int(r[c]) for reason, c in zip(DropReason, DROP_COLUMNS) if r.get(c) and int(r[c])}
    return StepRow(int(r["job"]), int(r["step"]), num["loss"], num["accuracy"], num["step_seconds"],
                   int(r["grad_frames"]), int(r["retransmissions"]), int(r.get("host_rejected") or 0),
                   num["node_elements_per_s"], num["node_commit_seconds"], num["compute_seconds"],
                   num["wait_seconds"], num["batch_loss"], num["worker_cpu_seconds"], num["node_cpu_seconds"], drops)


def read_csv(path: pathlib.Path) -> list[StepRow]:
    """metrics.csv back (empty cells: nan, or no read); an older run's file without the host, node
    and drop columns reads with them empty; a bad file raises ValueError naming it."""
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None or reader.fieldnames[:7] != COLUMNS[:7]:
                raise ValueError(f"not a mindp metrics.csv (columns {reader.fieldnames})")
            return [_row(r) for r in reader]
    except (OSError, KeyError, TypeError, ValueError, csv.Error) as exc:
        raise ValueError(f"{path}: {exc}") from None


def write_tensorboard(logdir: pathlib.Path, table: list[StepRow]) -> bool:
    """Scalars per job (loss, accuracy, batch loss, step time, frames, retransmissions, rejected
    frames, the node's update rate, switch drops) with TensorBoard's own writer; False (nothing
    written) where TensorBoard is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # torch absent, or tensorboard absent (torch's writer imports it)
        return False
    writers = {}
    try:
        for r in table:
            w = writers.get(r.job) or writers.setdefault(r.job, SummaryWriter(str(logdir / f"job{r.job}")))
            for name in [*SCALARS[2:], "dropped"]:
                v = getattr(r, name)
                if v is not None and not (isinstance(v, float) and not math.isfinite(v)):
                    w.add_scalar(name, v, r.step)
    finally:
        for w in writers.values():
            w.close()
    return True


def timing(table: list[StepRow]) -> dict[str, float]:
    """summary.json's account of where the steps went, over the steps whose workers timed theirs:
    their mean compute and wait seconds a step, and compute's share of those steps' time ({}: none)."""
    said = [r for r in table if math.isfinite(r.compute_seconds) and math.isfinite(r.wait_seconds)
            and r.step_seconds > 0]
    if not said:
        return {}
    compute = sum(r.compute_seconds for r in said)
    return {"mean_compute_seconds": round(compute / len(said), 6),
            "mean_wait_seconds": round(sum(r.wait_seconds for r in said) / len(said), 6),
            "compute_share": round(compute / sum(r.step_seconds for r in said), 4)}


def cpu(progress: Progress) -> dict[str, float]:
    """summary.json's CPU seconds a step by role, means over jobs, from the run's first trained step
    (the step after the workers' ready records; it warms up: torch's first backward, the node's first
    pages) to its last: a worker's process (every thread: its pump, worker 0's evaluation; a script's
    rank), the job's optimizer nodes together, and every switch together (read by the run when it
    sees a step finished: over the steps between its first and last read). A role whose processes
    did not say, or that has fewer than two steps to measure, is left out ({}: none)."""
    if not progress.marks:
        return {}
    start = progress.started

    def per_step(at: dict[int, float]) -> float:  # CPU so far at each step -> seconds a step between the ends
        steps = sorted(s for s in at if s >= start)
        return (at[steps[-1]] - at[steps[0]]) / (steps[-1] - steps[0]) if len(steps) > 1 else NAN

    workers, nodes = [], []
    for job in progress.curves:
        mine = {(j, s): m for (j, s), m in progress.marks.items() if j == job}
        ids = {w for m in mine.values() for w in m}
        each = [per_step({s: m[w][7] for (_, s), m in mine.items() if w in m}) for w in ids]
        workers.append(sum(each) / len(each) if each else NAN)
        commits = {s: c for (j, s), c in progress.commits.items() if j == job}
        shards = set().union(*commits.values()) if commits else set()
        nodes.append(sum(per_step({s: c[k][4] for s, c in commits.items() if c.keys() == shards}) for k in shards)
                     if shards else NAN)
    out = {"worker_cpu_seconds_a_step": mean_said(workers), "node_cpu_seconds_a_step": mean_said(nodes),
           "switch_cpu_seconds_a_step": per_step(progress.switch_cpu)}
    return {k: round(v, 6) for k, v in out.items() if math.isfinite(v)}


def write(run_dir: pathlib.Path, progress: Progress) -> list[StepRow]:
    """metrics.csv (always) and tensorboard/ (where installed) of a run."""
    table = rows(progress)
    write_csv(run_dir / "metrics.csv", table)
    write_tensorboard(run_dir / "tensorboard", table)
    return table
