"""Progress of a run from the JSON lines the workers print (pure: no processes, no terminal).

`Progress.feed(line)` takes one line of a worker's log; `bar()` renders one line
of status: step, loss, accuracy, steps/s, the workers' gradient packets/s and retransmissions
(summary.json adds the optimizer nodes' parameter frames and resends). `marks` keeps each
worker's clock and counters at each step, `commits` each node's update figures per step (its
"commit" lines, host_agent.node --step-lines), `drops` the switches' drop counters read after each
step (`drops_due`, `feed_drops`): metrics.csv. Workers, ranks and nodes state their process's CPU
seconds in those lines; `switch_cpu` keeps the switches', read by the run (`feed_switch_cpu`). A
"log" record (a script's mindp.torch.log) gives a step's loss (and acc) apart from its "step"
record; so does a JSON line {"loss": x, ...} of a script's rank 0 (`feed_output`). The curves are
worker 0's (the built-in workers' evaluating one, a script's rank 0).
"""
from __future__ import annotations

import json
import math
import os
import pathlib
from dataclasses import dataclass, field


@dataclass
class Curve:
    """Loss and accuracy of one job's model after each step (step -1: initial)."""

    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    acc: list[float] = field(default_factory=list)


@dataclass
class WorkerProgress:
    step: int = -1  # last completed step
    sent: int = 0
    retx: int = 0
    done: dict | None = None  # the final "done" record
    ready_t: float | None = None  # wall clock of its first record (initial model, before step 0)
    ready_step: int | None = None  # the step of that record: the one before the first this run trains


class Progress:
    def __init__(self, jobs: dict[int, int], steps: int, first: int = 0):
        """jobs: job id -> worker count; first: the steps a resumed run's earlier run did."""
        self.steps = steps
        self.first = first
        self.last_t = 0.0  # latest worker clock seen: rates use the workers' time, not when we read
        self.workers = {(j, w): WorkerProgress(step=first - 1) for j, n in jobs.items() for w in range(n)}
        self.curves = {j: Curve() for j in jobs}
        self.samples: list[tuple[float, int, int]] = []  # (time, steps done, packets), for rates
        # (job, step) -> worker -> (its clock, gradient frames sent, retransmitted, frames rejected) when
        # it finished the step, its seconds computing and then waiting for the parameters, its loss
        # on its own batch, and its process's CPU seconds so far (nan: not said)
        self.marks: dict[tuple[int, int], dict[int, tuple[float, int, int, int, float, float, float, float]]] = {}
        # (job, step) -> shard -> (elements updated in the step, seconds spent on them, frames rejected so
        # far, seconds its commit took to make the step durable, its process's CPU seconds so far: nan
        # from a node that did not say)
        self.commits: dict[tuple[int, int], dict[int, tuple[int, float, int, float, float]]] = {}
        # step -> every switch's CPU seconds so far, read at the first look after every worker of
        # every job finished the step (feed_switch_cpu)
        self.switch_cpu: dict[int, float] = {}
        # (job, step) -> the job's drops by reason on its switches (cumulative), read after the step
        self.drops: dict[tuple[int, int], dict[str, int]] = {}
        self._drops_at: dict[int, int] = {}  # job -> the step of its latest read
        self.bad_lines = 0

    def feed(self, line: str) -> None:
        line = line.strip()
        if not line.startswith("{"):
            return
        try:
            rec = json.loads(line)
            if isinstance(rec, dict) and rec.get("ev") == "commit":  # an optimizer node's step
                self.commits.setdefault((int(rec["job"]), int(rec["step"])), {})[int(rec["shard"])] = (
                    int(rec["elements"]), float(rec["seconds"]), int(rec.get("rejected", 0)),
                    float(rec.get("commit_seconds", "nan")), float(rec.get("cpu", "nan")))
                return
            key = (int(rec["job"]), int(rec["worker"]))
            wp = self.workers[key]
        except (ValueError, KeyError, TypeError):
            self.bad_lines += 1
            return
        if "t" in rec:
            self.last_t = max(self.last_t, float(rec["t"]))
        if rec.get("ev") == "step":
            if wp.ready_t is None and "t" in rec:
                wp.ready_t, wp.ready_step = float(rec["t"]), int(rec["step"])
            wp.step = max(wp.step, int(rec["step"]))
            wp.sent, wp.retx = int(rec.get("sent", 0)), int(rec.get("retx", 0))
            if "t" in rec:
                self.marks.setdefault((key[0], int(rec["step"])), {})[key[1]] = (
                    float(rec["t"]), wp.sent, wp.retx, int(rec.get("rej", 0)),
                    float(rec.get("compute", "nan")), float(rec.get("wait", "nan")),
                    float(rec.get("batch_loss", "nan")), float(rec.get("cpu", "nan")))
        if rec.get("ev") in ("step", "log") and "loss" in rec and key[1] == 0:  # the curve is worker 0's
            try:
                point = int(rec["step"]), float(rec["loss"]), float(rec.get("acc", "nan"))
            except (TypeError, ValueError):
                self.bad_lines += 1
                return
            c = self.curves[key[0]]
            if c.steps and c.steps[-1] == point[0]:  # the same step reported twice (log() and a JSON line)
                c.steps.pop(), c.loss.pop(), c.acc.pop()
            c.steps.append(point[0])
            c.loss.append(point[1])
            c.acc.append(point[2])
        elif rec.get("ev") == "done":
            wp.done = rec
            stats = rec.get("stats", {})
            wp.sent, wp.retx = int(stats.get("sent", wp.sent)), int(stats.get("retransmitted", wp.retx))

    def feed_output(self, text: str, job: int = 1) -> bool:
        """A line a script's rank 0 printed: a JSON object with a numeric "loss" (and "acc", "step":
        else the step the rank finished last) is a loss sample, as mindp.torch.log(loss=...) is.
        False for any other line (to be shown as it is)."""
        try:
            rec = json.loads(text)
            if not isinstance(rec, dict) or "loss" not in rec:
                return False
            step = int(rec["step"]) if "step" in rec else self.workers[(job, 0)].step
            point = {"loss": float(rec["loss"]), **({"acc": float(rec["acc"])} if "acc" in rec else {})}
        except (ValueError, TypeError, KeyError):
            return False
        self.feed(json.dumps({"ev": "log", "job": job, "worker": 0, "step": step, **point}))
        return True

    def job_step(self, job: int) -> int:
        """The last step every worker of `job` finished (-1: none)."""
        return min(wp.step for (j, _), wp in self.workers.items() if j == job)

    def drops_due(self) -> bool:
        """A job finished a step since its switches' drops were last read."""
        return any(self.job_step(j) > self._drops_at.get(j, -2) for j in self.curves)

    def feed_drops(self, by_job: dict[int, dict[str, int]]) -> None:
        """The switches' drops by reason per job (cumulative), read now: kept at each job's last
        finished step, the first read after it."""
        for j, drops in by_job.items():
            s = self.job_step(j) if j in self.curves else None
            if s is not None and s > self._drops_at.get(j, -2):
                self.drops[(j, s)] = dict(drops)
                self._drops_at[j] = s

    def switch_cpu_due(self) -> bool:
        """Every worker finished a step since the switches' CPU was last kept."""
        return self.step - 1 >= self.first and self.step - 1 not in self.switch_cpu

    def feed_switch_cpu(self, seconds: float) -> None:
        """The switches' CPU seconds so far, read now: kept at the last step every worker finished."""
        if self.switch_cpu_due():
            self.switch_cpu[self.step - 1] = seconds

    @property
    def step(self) -> int:
        """Steps completed by every worker of every job."""
        return min(wp.step for wp in self.workers.values()) + 1

    @property
    def packets(self) -> int:
        return sum(wp.sent + wp.retx for wp in self.workers.values())

    @property
    def retransmissions(self) -> int:
        return sum(wp.retx for wp in self.workers.values())

    def training_seconds(self) -> float | None:
        """From the last worker ready to the last worker done (workers' own clocks: process
        start-up is not training), or None before every worker is done."""
        ws = self.workers.values()
        if not self.all_done() or any(w.ready_t is None or "t" not in w.done for w in ws):
            return None
        return max(float(w.done["t"]) for w in ws) - max(w.ready_t for w in ws)

    def span(self) -> float | None:
        """From the last worker ready to the latest record, on the workers' clocks (a script's ranks
        send no "done" record), or None before every worker is ready."""
        ready = [w.ready_t for w in self.workers.values()]
        if not self.last_t or any(r is None for r in ready):
            return None
        return self.last_t - max(ready)

    @property
    def started(self) -> int:
        """The first step this run trained: after the workers' ready records (a resumed script's
        ranks say where they start; `first` otherwise)."""
        return min((w.ready_step for w in self.workers.values() if w.ready_step is not None),
                   default=self.first - 1) + 1

    def all_done(self) -> bool:
        return all(wp.done is not None for wp in self.workers.values())

    def rates(self, window: float = 3.0) -> tuple[float, float] | None:
        """(steps/s, packets/s) over the last `window` seconds of the workers' clocks; None until
        two records of different times have been seen."""
        now = self.last_t
        if not now:  # no timestamped record yet: a sample at clock 0 would average over the epoch
            return None
        self.samples.append((now, self.step, self.packets))
        while len(self.samples) > 2 and now - self.samples[1][0] >= window:
            self.samples.pop(0)
        t, s, p = self.samples[0]
        dt = now - t
        return ((self.step - s) / dt, (self.packets - p) / dt) if dt > 0 else None

    def latest(self) -> tuple[float | None, float | None]:
        """Mean over jobs of the latest loss and accuracy."""
        last = [(c.loss[-1], c.acc[-1]) for c in self.curves.values() if c.loss]
        if not last:
            return None, None
        accs = [a for _, a in last if math.isfinite(a)]
        return sum(x for x, _ in last) / len(last), (sum(accs) / len(accs) if accs else None)

    def batch_loss(self) -> float | None:
        """Mean over jobs of the workers' mean loss on their own batches in the latest step every
        worker of the job finished (None: not reported)."""
        x = mean_said(mean_said(m[6] for m in self.marks.get((j, self.job_step(j)), {}).values())
                      for j in self.curves)
        return None if math.isnan(x) else x

    def bar(self, width: int = 24) -> str:
        total = self.training_seconds()
        rates = ((self.step - self.started) / total, self.packets / total) if total else self.rates()
        speed = f"{three_digits(rates[0])} steps/s  {rates[1]:,.0f} grad pkt/s" if rates else "- steps/s  - grad pkt/s"
        done = self.step
        loss, acc = self.latest()
        loss_s = f"{loss:.4f}" if loss is not None else "-"
        seen = min((c.steps[-1] for c in self.curves.values() if c.steps), default=None)
        if loss is not None and seen is not None and seen + 1 < done:  # EVAL= every few steps, or only the ends
            batch = self.batch_loss()
            loss_s += f" at step {seen + 1}" + (f", batches {batch:.4f}" if batch is not None else "")
        acc_s = f"{acc * 100:5.1f}%" if acc is not None else "-"
        if not self.steps:  # a script's own step count is not known ahead
            return f"steps done {done}  loss {loss_s}  acc {acc_s}  {speed}  grad retx {self.retransmissions}"
        filled = int(width * done / self.steps)
        return (f"[{'#' * filled}{'.' * (width - filled)}] step {done}/{self.steps}  loss {loss_s}  acc {acc_s}  "
                f"{speed}  grad retx {self.retransmissions}")


def mean_said(values) -> float:
    """The mean of the figures that were reported (nan: none was)."""
    said = [v for v in values if not math.isnan(v)]
    return sum(said) / len(said) if said else math.nan


def three_digits(x: float) -> str:
    """A rate or a duration with three significant digits, one decimal from 100 (BMv2 trains a gpt
    at 0.0345 steps/s, an mlp at 200; a tiny script's 4 steps take 0.0338 s)."""
    return f"{x:.1f}" if x >= 100 else f"{x:.3g}"


class LogTail:
    """Reads whole new lines appended to a file since the last call."""

    def __init__(self, path: str | pathlib.Path):
        self.path = pathlib.Path(path)
        self.pos = 0
        self.partial = ""

    def lines(self) -> list[str]:
        try:
            with open(self.path, "r", errors="replace") as f:
                if os.fstat(f.fileno()).st_size < self.pos:  # written anew (torchrun's attempt directory)
                    self.pos, self.partial = 0, ""
                f.seek(self.pos)
                data = f.read()
                self.pos = f.tell()
        except FileNotFoundError:
            return []
        data = self.partial + data
        *full, self.partial = data.split("\n")
        return full
