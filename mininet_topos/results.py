"""A run's results: comparison with the reference trainer, summary.json, table, curve.svg."""
from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

import numpy as np

from host_agent import reference
from mindp import listed

from . import svgplot
from .progress import Curve

TABLE_FIELDS = ("model", "target", "workers", "steps", "jobs", "initial_loss", "final_loss", "final_accuracy",
                "max_abs_param_diff_vs_reference", "packets_sent", "retransmissions", "wall_seconds",
                "steps_per_second")
TABLE_IF_SAID = ("compute_share",)  # printed after TABLE_FIELDS when the summary has it (metrics.timing)
#: summary.json's not_compared of a run made with CHECK=0.
NOT_CHECKED = "CHECK=0: the run's bits were not compared with the reference"


@dataclass
class JobResult:
    job_id: int
    initial_loss: float
    final_loss: float
    final_accuracy: float
    reference_final_loss: float | None  # None: not compared (CHECK=0)
    max_abs_param_diff_vs_reference: float | None  # over workers' fp16 params and the node's fp32 master
    packets_sent: int
    retransmissions: int
    switch_counters: dict | None = None  # the job's P4 counters, read by the controller after the run
    digest_checks: int = 0  # steps the workers checked against the node's step digest (host_agent.digest)
    digest_mismatches: int = 0  # of those, steps a worker's parameters differed (repaired from the node)


DIGEST_FIELDS = ("digest_checks", "digest_mismatches")


def digest_counts(done: list[dict | None]) -> dict[str, int]:
    """The workers' step-digest counters, summed over their final 'done' records' stats."""
    stats = [d.get("stats") or {} for d in done if d]
    return {k: sum(int(s.get(k, 0)) for s in stats) for k in DIGEST_FIELDS}


def digest_warning(summ: dict, logs) -> str | None:
    """The line a run ends with when a worker's parameters differed from the node's in some step: the
    check fetched them again, so the run can still end bit-exact, but a divergence is a mindp bug and
    never passes silently."""
    n = summ.get("digest_mismatches") or 0
    if not n:
        return None
    return (f"  WARNING: {n} of {summ.get('digest_checks', 0)} step digest check(s) found a worker's parameters "
            f"differing from the optimizer node's; they were fetched again (the workers' logs in {logs} name the "
            f"steps and chunks: please report it)")


def skipped_steps(node_stats: dict) -> list[int]:
    """The steps the optimizer node skipped for a non-finite gradient (its stats' (step, chunk) list)."""
    return sorted({int(step) for step, _ in node_stats.get("nonfinite", [])})


def skipped_line(steps: list[int]) -> str | None:
    """What a run says of its skipped steps: never silent, since DDP would have trained on the Inf/NaN."""
    if not steps:
        return None
    return (f"  {len(steps)} step(s) skipped by the optimizer node, a gradient not finite (Inf or NaN): {listed(steps, 8)} "
            "(the parameters kept, as torch's GradScaler skips a step)")


def max_abs_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    """Largest |a - b| over all named arrays (inf when names or shapes differ, or a value is non-finite)."""
    if a.keys() != b.keys():
        return float("inf")
    worst = 0.0
    for name in a:
        x, y = np.asarray(a[name], dtype=np.float64), np.asarray(b[name], dtype=np.float64)
        if x.shape != y.shape:
            return float("inf")
        if x.size:
            d = np.abs(x - y)
            worst = max(worst, float(d.max()) if np.isfinite(d).all() else float("inf"))
    return worst


def n_params(params: dict[str, np.ndarray]) -> int:
    return sum(int(a.size) for a in params.values())


def compare(ref: reference.Result, workers_fp16: list[dict[str, np.ndarray]], master: dict[str, np.ndarray]) -> float:
    diffs = [max_abs_diff(ref.master, master)] + [max_abs_diff(ref.params, p) for p in workers_fp16]
    return max(diffs)


def faults(loss: float, seed: int) -> dict:
    """The packet loss a run injected and the seed of its draws, as every run's summary.json states
    them (tools.compare names the loss in its legend)."""
    return {"loss_rate": float(loss), "seed": int(seed)}


def summary(cfg: dict, jobs: list[JobResult], wall_seconds: float, setup_seconds: float, model: str,
            parameters: int) -> dict:
    """The run's summary.json: the figures of the run as a whole, then each job's.
    model: mindp.workload.describe (name and parameter count); parameters: the exact count."""
    n = len(jobs)
    steps = int(cfg["steps"])
    diffs = [j.max_abs_param_diff_vs_reference for j in jobs]
    compared = {"max_abs_param_diff_vs_reference": max(diffs)} if None not in diffs else {"not_compared": NOT_CHECKED}
    return {
        "model": model,
        "parameters": int(parameters),
        "target": cfg["target"],
        "k": int(cfg.get("k", 0)),  # elements a frame
        "workers": int(cfg["workers"]),
        "steps": steps,
        "jobs": n,
        **faults(cfg["loss"], cfg["seed"]),
        "initial_loss": sum(j.initial_loss for j in jobs) / n,
        "final_loss": sum(j.final_loss for j in jobs) / n,
        "final_accuracy": sum(j.final_accuracy for j in jobs) / n,
        **compared,
        "packets_sent": sum(j.packets_sent for j in jobs),
        "retransmissions": sum(j.retransmissions for j in jobs),
        **{k: sum(getattr(j, k) for j in jobs) for k in DIGEST_FIELDS},
        "wall_seconds": round(wall_seconds, 3),
        "steps_per_second": round(steps / wall_seconds, 3) if wall_seconds > 0 else 0.0,
        "setup_seconds": round(setup_seconds, 3),
        "per_job": [vars(j) for j in jobs],
    }


def table(s: dict) -> str:
    rows = []
    for k in TABLE_FIELDS + tuple(k for k in TABLE_IF_SAID if k in s):
        if k not in s:  # (the comparison of a run made with CHECK=0)
            continue
        v = s[k]
        if k == "max_abs_param_diff_vs_reference":
            v = repr(float(v))  # 0.0 exactly when bit-exact
        elif isinstance(v, float) and k not in ("wall_seconds", "steps_per_second"):
            v = f"{v:.6g}"
        rows.append((k, str(v)))
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{w}}  {v}" for k, v in rows)


def cpu_line(s: dict) -> str:
    """The summary's CPU a step by role as a line of the run's report ('' when none was measured)."""
    said = [(who, s[f"{role}_cpu_seconds_a_step"]) for role, who in
            (("worker", "a worker"), ("node", "the node(s)"), ("switch", "the switch(es)"))
            if f"{role}_cpu_seconds_a_step" in s]
    return ("  CPU a step: " + ", ".join(f"{who} {v * 1000:.1f} ms" for who, v in said)) if said else ""


def write_summary(path: pathlib.Path, s: dict) -> None:
    path.write_text(json.dumps(s, indent=1, default=float) + "\n")


def curve_title(model: str, target: str, jobs: int, workers: int, loss_rate: float) -> str:
    """model: mindp.workload.describe's text; packet loss is named only when there is some."""
    loss = f", packet loss {loss_rate:g}" if loss_rate else ""
    return f"mindp: {model}, {target}, {jobs} job(s) x {workers} workers{loss}"


def accuracy_label(model: str) -> str:
    """What the accuracy axis measures: a digit's class, or the gpt's next byte."""
    return "test accuracy, next byte (%)" if model == "gpt" else "test accuracy (%)"


def plot(path: pathlib.Path, curves: dict[int, Curve], title: str, accuracy: str = "test accuracy (%)") -> None:
    """Training loss and test accuracy per step, one line per job, as an SVG chart."""
    jobs = [(f"job {j}", [s + 1 for s in c.steps], c) for j, c in sorted(curves.items())]  # x: after step s
    loss = svgplot.Panel("step", "training loss (cross-entropy)", {name: (x, list(c.loss)) for name, x, c in jobs})
    acc = svgplot.Panel("step", accuracy, {name: (x, [a * 100 for a in c.acc]) for name, x, c in jobs}, yhi=100.0)
    path.write_text(svgplot.chart([loss, acc], title))
