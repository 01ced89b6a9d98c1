"""What a run started, on disk, so `make stop` can undo exactly that, even after a crash.

The state file (build/run-state.json) lists every process the run started (PID
with its kernel start time, so a recycled PID is never hit) and every
root-namespace interface it made. It is rewritten atomically at each addition,
before the next thing starts, and removed once everything is gone.
Nothing is found by name or pattern: only what is listed is touched.
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import time
from dataclasses import dataclass, field

from mindp import procstat

DEFAULT_PATH = pathlib.Path("build/run-state.json")


def start_time(pid: int) -> int | None:
    """The kernel start time of `pid` (clock ticks since boot), or None if no such process."""
    f = procstat.of(pid)
    return int(f[procstat.START]) if f else None


@dataclass
class Proc:
    pid: int
    start: int
    name: str
    group: bool  # a session leader: signal its whole process group

    def alive(self) -> bool:
        f = procstat.of(self.pid)
        return f is not None and int(f[procstat.START]) == self.start and f[procstat.STATE] != "Z"

    def signal(self, sig: int) -> None:
        if not self.alive():
            return
        try:
            if self.group:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


@dataclass
class RunState:
    path: pathlib.Path
    run_dir: str = ""
    procs: list[Proc] = field(default_factory=list)
    interfaces: list[str] = field(default_factory=list)

    # --- recording ---------------------------------------------------------

    def add_proc(self, pid: int, name: str, group: bool) -> None:
        st = start_time(pid)
        if st is None:
            return  # already gone
        self.procs.append(Proc(pid, st, name, group))
        self.save()

    def add_interfaces(self, names: list[str]) -> None:
        self.interfaces.extend(n for n in names if n not in self.interfaces)
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        data = {"run_dir": self.run_dir, "procs": [vars(p) for p in self.procs], "interfaces": self.interfaces}
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, self.path)

    @classmethod
    def load(cls, path: pathlib.Path = DEFAULT_PATH) -> RunState | None:
        """The recorded state, or None when there is none; a corrupt file reads as empty."""
        try:
            data = json.loads(pathlib.Path(path).read_text())
            procs = [Proc(int(p["pid"]), int(p["start"]), str(p["name"]), bool(p["group"])) for p in data["procs"]]
            return cls(pathlib.Path(path), str(data.get("run_dir", "")), procs, [str(i) for i in data["interfaces"]])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return cls(pathlib.Path(path))

    # --- undoing -----------------------------------------------------------

    def live_procs(self) -> list[Proc]:
        return [p for p in self.procs if p.alive()]

    def existing_interfaces(self) -> list[str]:
        return [i for i in self.interfaces if pathlib.Path(f"/sys/class/net/{i}").exists()]

    def teardown(self, grace: float = 3.0) -> tuple[list[Proc], list[str]]:
        """Stop every listed process (SIGTERM, then SIGKILL after `grace` s), delete every
        listed interface still present, remove the file. Returns what was stopped and deleted.
        The calling process (the orchestrator cleaning up after itself) is left alone."""
        live = [p for p in self.live_procs() if p.pid != os.getpid()]
        for p in live:
            p.signal(signal.SIGTERM)
            p.signal(signal.SIGCONT)  # a stopped process handles SIGTERM only once continued
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(p.alive() for p in live):
            time.sleep(0.05)
        for p in live:
            p.signal(signal.SIGKILL)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(p.alive() for p in live):
            time.sleep(0.05)
        # A killed host shell takes its namespace and its veth ends with it; delete what is left.
        deleted = []
        for name in self.existing_interfaces():
            subprocess.run(["ip", "link", "del", name], capture_output=True)
            deleted.append(name)
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        return live, deleted
