"""Several runs' curves in one chart: `make compare RUNS="20261128-064754 latest"`.

    python -m tools.compare RUN [RUN ...] [--out runs/compare]

Each RUN is a run directory (runs/<ts>) or its name under runs/. From each run's metrics.csv (every
`make run` writes one) and summary.json it draws, one line per run (and job), the training loss, the
test accuracy where the run reports one, the step time, the workers' mean wait for the step's
parameters after backward (metrics.csv's wait_seconds) and the retransmissions per step, with a
legend under each panel naming the run, its model, target, workers and packet loss. Writes
OUT.svg always (the run's own chart code, mininet_topos.svgplot) and OUT.png where matplotlib is
installed (`.venv/bin/pip install matplotlib`; not a dependency of mindp).
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

from mininet_topos import metrics, svgplot


class CompareError(ValueError):
    """A run that cannot be compared; the message names it."""


def run_dir(name: str, runs: pathlib.Path) -> pathlib.Path:
    for d in (pathlib.Path(name), runs / name):
        if d.is_dir():
            return d
    raise CompareError(f"{name}: no such run (a directory, or a name under {runs}/)")


def run_dirs(names: list[str], runs: pathlib.Path) -> list[pathlib.Path]:
    """Each named run's directory, each once: a run given twice (latest and its name, say) would
    draw one line per panel over the other and be counted twice."""
    given: dict[pathlib.Path, str] = {}  # resolved directory -> the name it was given as
    dirs = []
    for name in names:
        d = run_dir(name, runs)
        first = given.get(d.resolve())
        if first is not None:
            raise CompareError(f"run {d.resolve().name} given twice" + (f" (as {first} and {name})" if first != name else ""))
        given[d.resolve()] = name
        dirs.append(d)
    return dirs


def label(d: pathlib.Path) -> str:
    """The run's name (the latest link resolved) and what it ran."""
    name = d.resolve().name
    try:
        s = json.loads((d / "summary.json").read_text())
    except (OSError, ValueError):
        return name
    if not isinstance(s, dict):
        raise CompareError(f"{d / 'summary.json'}: not a JSON object")
    what = s.get("model") or "?"
    loss = s.get("loss_rate")
    if loss is not None and (isinstance(loss, bool) or not isinstance(loss, (int, float))):
        raise CompareError(f"{d / 'summary.json'}: loss_rate {loss!r} is not a number")
    return (f"{name}: {what}, {s.get('target', '?')}, {s.get('workers', '?')} workers"
            + (f", loss {loss:g}" if loss else ""))


def load(d: pathlib.Path) -> list[metrics.StepRow]:
    path = d / "metrics.csv"
    if not path.exists():
        raise CompareError(f"{d}: no metrics.csv (a run of an older mindp, or one that ended before its first step)")
    return metrics.read_csv(path)


def panels(runs: list[tuple[str, list[metrics.StepRow]]]) -> list[svgplot.Panel]:
    """Loss, the workers' batch loss, accuracy and their wait for the parameters (each when any run
    has it), step time and retransmissions per step, then a worker's and the node's CPU a step (when
    any run has them); x: after step s."""
    def series(field: str, scale: float = 1.0) -> dict:
        out = {}
        for name, table in runs:
            jobs = sorted({r.job for r in table})
            for j in jobs:
                rs = [r for r in table if r.job == j]
                key = name if len(jobs) == 1 else f"{name} (job {j})"
                out[key] = ([r.step + 1 for r in rs], [float(getattr(r, field)) * scale for r in rs])
        return out

    acc = series("accuracy", 100.0)
    out = [svgplot.Panel("step", "training loss", series("loss"))]
    batch = series("batch_loss")
    if any(math.isfinite(y) for _, ys in batch.values() for y in ys):
        out.append(svgplot.Panel("step", "loss on the workers' batches", batch))
    if any(math.isfinite(y) for _, ys in acc.values() for y in ys):
        out.append(svgplot.Panel("step", "test accuracy (%)", acc, yhi=100.0))
    out.append(svgplot.Panel("step", "step time (s)", series("step_seconds")))
    wait = series("wait_seconds")
    if any(math.isfinite(y) for _, ys in wait.values() for y in ys):
        out.append(svgplot.Panel("step", "waiting for the parameters (s)", wait))
    out.append(svgplot.Panel("step", "retransmissions per step", series("retransmissions")))
    for field, label in (("worker_cpu_seconds", "a worker's CPU a step (ms)"),
                         ("node_cpu_seconds", "the node's CPU a step (ms)")):
        cpu = series(field, 1000.0)
        if any(math.isfinite(y) for _, ys in cpu.values() for y in ys):
            out.append(svgplot.Panel("step", label, cpu))
    return out


def write_png(path: pathlib.Path, ps: list[svgplot.Panel], title: str) -> bool:
    """The same chart as a PNG with matplotlib; False where it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, len(ps), figsize=(4.4 * len(ps), 4.2), squeeze=False)
    for ax, p in zip(axes[0], ps):
        for i, (name, (xs, ys)) in enumerate(p.series.items()):
            ax.plot(xs, ys, color=svgplot.COLORS[i % len(svgplot.COLORS)], label=name)
        ax.set_xlabel(p.xlabel)
        ax.set_ylabel(p.ylabel)
        ax.set_ylim(bottom=p.ylo, top=p.yhi)
        ax.grid(alpha=0.3)
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.suptitle(title)
    fig.legend(handles, names, loc="lower center", ncol=1, frameon=False)  # below the panels, never over a line
    fig.tight_layout(rect=(0, 0.06 * len(names), 1, 0.95))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="*", help="run directories or names under --runs-dir")
    p.add_argument("--runs-dir", default="runs")
    p.add_argument("--out", default="", help="the chart's path without suffix (default: <runs-dir>/compare)")
    args = p.parse_args(argv)
    if not args.runs:
        print('make compare: name the runs: make compare RUNS="<run> <run> ..." (directories under runs/)',
              file=sys.stderr)
        return 2
    runs_root = pathlib.Path(args.runs_dir)
    try:
        dirs = run_dirs(args.runs, runs_root)
        loaded = [(label(d), load(d)) for d in dirs]
    except (CompareError, ValueError) as exc:
        print(f"make compare: {exc}", file=sys.stderr)
        return 2
    out = pathlib.Path(args.out) if args.out else runs_root / "compare"
    ps = panels(loaded)
    title = f"mindp: {len(dirs)} runs compared"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".svg").write_text(svgplot.chart(ps, title))
        made = [str(out.with_suffix(".svg"))]
        if write_png(out.with_suffix(".png"), ps, title):
            made.append(str(out.with_suffix(".png")))
        else:
            made.append("no PNG: matplotlib is not installed (.venv/bin/pip install matplotlib)")
    except OSError as exc:  # mkdir's FileExistsError: a part of OUT's directory is a file
        why = "not a directory" if isinstance(exc, FileExistsError) else exc.strerror or exc
        print(f"make compare: cannot write {out}: {exc.filename or out}: {why}", file=sys.stderr)
        return 2
    print("make compare: " + "; ".join(made))
    return 0


if __name__ == "__main__":
    sys.exit(main())
