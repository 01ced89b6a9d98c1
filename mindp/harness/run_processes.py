"""make run's processes as bench/torch_gpt.py samples and pins them: which is which (by its
command line), each one's CPU, wake-ups and page faults from /proc, and pinning them to cores."""
from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass

from mindp import procstat, threadname

#: make run's processes by a word of their command lines (the controller runs in the orchestrator's):
#: Python programs, and BMv2's switch.
ROLES = (("mininet_topos.trainer", "worker"), ("host_agent.node", "node"), ("softswitch", "switch"),
         ("simple_switch_grpc", "switch"), ("mininet_topos.run", "orchestrator"))
BMV2 = "simple_switch_grpc"


def role(pid: int) -> str | None:
    """The role of one of make run's processes ("worker N", N its id), or None (a wrapper such as
    flock or sudo, or a process that ended)."""
    try:
        argv = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        line = " ".join(argv)
        found = next((r for word, r in ROLES if word in line), None)
        if found is None or ("python" not in argv[0] and not argv[0].endswith(BMV2)):
            return None
        return f"worker {argv[argv.index('--worker') + 1]}" if found == "worker" and "--worker" in argv else found
    except (OSError, IndexError, ValueError):
        return None


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` onto `cpus` (threads it starts later inherit their creator's); threads
    that end meanwhile are passed over."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:  # the process ended since it was listed
        return
    for task in tasks:
        try:
            if os.sched_getaffinity(int(task)) != cpus:
                os.sched_setaffinity(int(task), cpus)
        except OSError:
            continue


def parse_cpus(text: str) -> set[int]:
    """'1', '2-3' or '0,2' -> {1}, {2, 3}, {0, 2}."""
    cpus = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def proc_usage(pid: int) -> tuple[str, float, int, dict[str, float], int] | None:
    """(role, CPU seconds, voluntary context switches of all its threads, CPU seconds of its
    threads mindp names, by name, minor page faults) of one of make run's processes; a worker's
    role is "worker N", N its id."""
    who = role(pid)
    if who is None:
        return None
    try:
        stat = procstat.of(pid)
        if stat is None:
            return None
        cpu = procstat.cpu_seconds(stat)
        tasks = list(pathlib.Path(f"/proc/{pid}/task").iterdir())
    except (OSError, IndexError, ValueError):
        return None
    vol, named = 0, {}
    for task in tasks:  # (status counts the main thread's only)
        try:
            status = (task / "status").read_text()
            vol += int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])
            if status.startswith(f"Name:\t{threadname.PREFIX}"):  # a thread mindp named (mindp.threadname)
                name = status.split("\n", 1)[0].split("\t", 1)[1]
                if (stat := procstat.fields(task / "stat")) is not None:
                    named[name] = named.get(name, 0.0) + procstat.cpu_seconds(stat)
        except OSError:  # a thread that ended meanwhile: the process is still sampled
            continue
    return who, cpu, vol, named, int(stat[procstat.MINFLT])


@dataclass(frozen=True)
class Cores:
    """--network-cores: the switch, the node and the orchestrator on `network`, what trains on
    `training`."""
    training: set[int]
    network: set[int]

    def place(self, root: int) -> None:
        """Pin make run's processes under `root` by role."""
        for pid in procstat.tree(root):
            if (who := role(pid)) is not None:
                pin(pid, self.training if who.startswith("worker") else self.network)

    def describe(self) -> str:
        return (f"the switch, node and orchestrator on cores {cpu_list(self.network)}, what trains on "
                f"{cpu_list(self.training)}")


def cpu_list(cpus: set[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))
