"""Per-step metrics of a run: runs/<ts>/metrics.csv for every run, TensorBoard event files where
TensorBoard is installed (`.venv/bin/pip install tensorboard`; it is not a dependency).

One row per job and step, from the workers' own records (mininet_topos.progress.Progress.marks and
its curves): the step's loss and accuracy (where reported), its time on the workers' clocks (the last
worker to finish it against the last to finish the step before), and the gradient frames and
retransmissions the job's workers sent during it. Per-reason drops and the node's update rate are
counted once, over the run (summary.json: switch_counters, optimizer_stats).
"""
from __future__ import annotations

import csv
import math
import pathlib
from dataclasses import asdict, dataclass, fields

from .progress import Progress

NAN = float("nan")


@dataclass(frozen=True)
class StepRow:
    job: int
    step: int  # 0-based; the curves' "after step s"
    loss: float
    accuracy: float  # a fraction; nan where not reported
    step_seconds: float
    grad_frames: int  # gradient frames the job's workers sent in this step (first sends)
    retransmissions: int  # and resent

    @property
    def steps_per_second(self) -> float:
        return 1.0 / self.step_seconds if self.step_seconds > 0 else NAN


COLUMNS = [f.name for f in fields(StepRow)]


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
            x, a = loss.get(s, (NAN, NAN))
            out.append(StepRow(job, s, x, a, max(t for t, _, _ in now) - max(t for t, _, _ in before),
                               sum(f for _, f, _ in now) - sum(f for _, f, _ in before),
                               sum(r for _, _, r in now) - sum(r for _, _, r in before)))
    return out


def _cell(v) -> str:
    if isinstance(v, float):
        return "" if not math.isfinite(v) else f"{v:.6g}"
    return str(v)


def write_csv(path: pathlib.Path, table: list[StepRow]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in table:
            w.writerow([_cell(v) for v in asdict(r).values()])


def read_csv(path: pathlib.Path) -> list[StepRow]:
    """metrics.csv back (empty cells: nan); a bad file raises ValueError naming it."""
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames != COLUMNS:
                raise ValueError(f"{path}: not a mindp metrics.csv (columns {reader.fieldnames})")
            return [StepRow(int(r["job"]), int(r["step"]), *(float(r[c] or "nan") for c in COLUMNS[2:5]),
                            int(r["grad_frames"]), int(r["retransmissions"])) for r in reader]
    except (OSError, KeyError, TypeError, csv.Error) as exc:
        raise ValueError(f"{path}: {exc}") from None


def write_tensorboard(logdir: pathlib.Path, table: list[StepRow]) -> bool:
    """Scalars per job (loss, accuracy, step time, frames, retransmissions) with TensorBoard's own
    writer; False (nothing written) where TensorBoard is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # torch absent, or tensorboard absent (torch's writer imports it)
        return False
    writers = {}
    try:
        for r in table:
            w = writers.get(r.job) or writers.setdefault(r.job, SummaryWriter(str(logdir / f"job{r.job}")))
            for name in ("loss", "accuracy", "step_seconds", "grad_frames", "retransmissions"):
                v = getattr(r, name)
                if not (isinstance(v, float) and not math.isfinite(v)):
                    w.add_scalar(name, v, r.step)
    finally:
        for w in writers.values():
            w.close()
    return True


def write(run_dir: pathlib.Path, progress: Progress) -> list[StepRow]:
    """metrics.csv (always) and tensorboard/ (where installed) of a run."""
    table = rows(progress)
    write_csv(run_dir / "metrics.csv", table)
    write_tensorboard(run_dir / "tensorboard", table)
    return table
