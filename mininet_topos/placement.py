"""PIN: which core each of make run's processes runs on (pure, but for reading this process's cores).

Worker N runs on the N-th of the cores make run may use (its own affinity: `taskset -c 2-5 make
run` gives it 2-5), round-robin; then each switch, then each optimizer node, on the next cores. A
process's threads and children inherit its core. The Mininet orchestrator (make run's own process)
stays unpinned: it mostly waits, and the bit-exact check after training uses every core.

Why: where each worker has a core but the switch and the node do not, the kernel's scheduler puts the
network's processes beside one worker more often than beside the other, and the other worker's core
idles while it waits for the slower one at every step (bench/torch_gpt.py prints each side's idle
core time a step). Where workers outnumber the cores they share cores either way, and the kernel's
freedom to move each worker's packet thread to a free core measured as good or better (PIN=auto
leaves them unpinned then).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

PIN_MODES = ("auto", "0", "1")  # auto: plan() says when


@dataclass(frozen=True)
class Placement:
    cpus: tuple[int, ...]  # the cores in order
    workers: int  # of all jobs, numbered in the order they start
    switches: int
    nodes: int

    def _at(self, index: int) -> int:
        return self.cpus[index % len(self.cpus)]

    def worker(self, n: int) -> int:
        return self._at(n)

    def switch(self, i: int) -> int:
        return self._at(self.workers + i)

    def node(self, i: int) -> int:
        return self._at(self.workers + self.switches + i)

    def describe(self) -> str:
        """Which cores, e.g. 'workers on cores 0,1,0,1; the switch on core 0; the node on core 1'."""
        def cores(one: str, many: str, n: int, at) -> str:
            where = ",".join(str(at(i)) for i in range(n))
            return f"{many} on cores {where}" if n > 1 else f"the {one} on core {where}"
        return "; ".join((cores("worker", "workers", self.workers, self.worker),
                          cores("switch", "switches", self.switches, self.switch),
                          cores("node", "nodes", self.nodes, self.node)))


def plan(mode: str, cpus: set[int] | tuple[int, ...], workers: int, switches: int, nodes: int) -> Placement | None:
    """The placement PIN=`mode` gives a run of these processes on `cpus`, or None: the kernel places them.
    auto pins where every worker has a core of its own but the switches and nodes must share them."""
    if mode == "0" or (mode == "auto" and not workers <= len(cpus) < workers + switches + nodes):
        return None
    return Placement(tuple(sorted(cpus)), workers, switches, nodes)


def own_cpus() -> set[int]:
    return os.sched_getaffinity(0)


def taskset(cpu: int | None) -> list[str]:
    """The command prefix that runs a program on `cpu` (nothing for None)."""
    return [] if cpu is None else ["taskset", "-c", str(cpu)]
