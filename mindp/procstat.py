"""A process's or thread's /proc stat, read one way: the fields after its name, which may hold
spaces and parentheses, so the text is split after the name's last ')'.

Progress waits (mindp.progress), the run's stop of its own processes (mininet_topos.runstate)
and the bench's CPU figures (bench/torch_gpt.py) all read it."""
from __future__ import annotations

import os
import pathlib

#: Indices into fields(): the state letter, the parent's pid, minor page faults (a process's: every
#: thread's), CPU clock ticks (user, system, then the reaped children's user and system) and the
#: start time (ticks since boot).
STATE, PPID, MINFLT, UTIME, STIME, CUTIME, CSTIME, START = 0, 1, 7, 11, 12, 13, 14, 19


def fields(path: str | os.PathLike) -> list[str] | None:
    """The fields of a stat file after the name (fields()[STATE] is the state), or None if the
    process or thread is gone."""
    try:
        text = pathlib.Path(path).read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def of(pid: int, tid: int | None = None) -> list[str] | None:
    """fields() of a process, or of one of its threads."""
    return fields(f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat")


def cpu_ticks(f: list[str], children: bool = False) -> int:
    """User and system clock ticks of fields() (children: with its reaped children's)."""
    return sum(int(v) for v in f[UTIME:(CSTIME if children else STIME) + 1])


def cpu_seconds(f: list[str]) -> float:
    """User and system CPU seconds of fields() (a process's: every thread's)."""
    return cpu_ticks(f) / os.sysconf("SC_CLK_TCK")


def children() -> dict[int, list[int]]:
    """Each live process's children, from one scan of /proc."""
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            f = fields(f"/proc/{entry.name}/stat")
            if f:
                kids.setdefault(int(f[PPID]), []).append(int(entry.name))
    return kids


def tree(pid: int, kids: dict[int, list[int]] | None = None) -> list[int]:
    """`pid` and all its live descendants (`kids`: children(), read once for several trees)."""
    kids, out, todo = children() if kids is None else kids, [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out
