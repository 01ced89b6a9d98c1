"""`make clean`: remove build output and old runs, keeping the newest run unless told otherwise.

    python -m mininet_topos.clean [--all] [--runs-dir runs]

Runs are the timestamped directories `make run` makes under runs/; `runs/latest`
points at the newest. Only those directories and that link are removed: nothing
else under runs/ is touched.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import re
import shutil
import sys

LATEST = "latest"
RUN_NAME = re.compile(r"\d{8}-\d{6}(-\d+)?")  # mininet_topos.run's run directory names


def runs(runs_dir: pathlib.Path) -> list[pathlib.Path]:
    """The run directories under `runs_dir`, oldest first."""
    if not runs_dir.is_dir():
        return []
    found = [p for p in runs_dir.iterdir() if p.is_dir() and not p.is_symlink() and RUN_NAME.fullmatch(p.name)]

    def order(p: pathlib.Path) -> tuple[str, int]:  # 20261123-040508-2 after 20261123-040508-1
        n = p.name[16:]
        return p.name[:15], int(n or 0)

    return sorted(found, key=order)


def point_latest(runs_dir: pathlib.Path, run_dir: pathlib.Path) -> None:
    """runs/latest -> run_dir (relative, replaced atomically)."""
    link = runs_dir / LATEST
    tmp = runs_dir / f".{LATEST}.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(run_dir.name)
    os.replace(tmp, link)


def _point_at_newest(runs_dir: pathlib.Path) -> list[pathlib.Path]:
    """runs/latest -> the newest run (none: no link); returns the runs."""
    kept = runs(runs_dir)
    if kept:
        point_latest(runs_dir, kept[-1])
    elif (runs_dir / LATEST).is_symlink():
        (runs_dir / LATEST).unlink()
    return kept


def withdraw(run_dir: pathlib.Path) -> None:
    """Remove a run refused before its network came up (RESUME= of a script since changed): no
    directory is left of it, and runs/latest names the run it named before."""
    shutil.rmtree(run_dir, ignore_errors=True)
    _point_at_newest(run_dir.parent)


def to_remove(runs_dir: pathlib.Path, keep_latest: bool = True) -> list[pathlib.Path]:
    all_runs = runs(runs_dir)
    return all_runs[:-1] if keep_latest else all_runs


def clean(runs_dir: pathlib.Path, keep_latest: bool = True) -> str:
    """Remove old runs (every run with keep_latest False); returns one line saying what was removed."""
    gone = to_remove(runs_dir, keep_latest)
    for d in gone:
        shutil.rmtree(d)
    kept = _point_at_newest(runs_dir)
    with_latest = f"; kept {runs_dir / kept[-1].name}" if kept else ""
    return f"removed {len(gone)} run(s) from {runs_dir}/{with_latest}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mininet_topos.clean", description=__doc__.split("\n\n")[0])
    p.add_argument("--all", action="store_true", help="remove the newest run too")
    p.add_argument("--runs-dir", default="runs")
    args = p.parse_args(argv)
    try:
        print(f"make clean: {clean(pathlib.Path(args.runs_dir), keep_latest=not args.all)}")
    except OSError as exc:
        print(f"make clean: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
