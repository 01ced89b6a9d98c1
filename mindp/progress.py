"""Waits that follow progress, not the clock.

A wait fails when its progress measure (steps done, bytes written, CPU time used beyond an idle
poller's...) stays the same for `stall` seconds; slow progress never fails it, so a loaded machine
slows a test down but does not fail it. `cap` bounds the whole wait only as a hang guard (something busy forever).
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Callable, Hashable

from mindp import procstat

#: Seconds without any progress after which a wait fails, unless the caller knows better.
STALL = 60.0
#: Default hang guard: far beyond any test's or start-up's duration on a loaded machine.
CAP = 1800.0
#: Longest time between two looks at a progress measure (they scan /proc: every live process's stat
#: file for a process tree); a wait looks ten times per `stall` at most, so a stall is seen late by
#: a tenth at most.
MEASURE_EVERY = 2.0
#: Share of one core below which a process tree's CPU use is idling, not progress (busy()): loops
#: that only poll cost well under 1 % (wake-ups every 50 ms, a /proc scan a second), real work
#: (packets, training, start-up) far more even on a loaded machine.
IDLE_SHARE = 0.02
#: A stalled process's teardown after SIGTERM, in stall times, at most (end()).
TEARDOWN_TURNS = 5


def look_every(stall: float) -> float:
    return min(MEASURE_EVERY, stall / 10)


class Stalled(TimeoutError):
    """No progress for the stall time (or the hang guard ran out); the message says what."""


def load_factor() -> float:
    """How many times over its cores the machine is wanted now (1-minute load average per core, at
    least 1): a check whose requirement is itself a time ("exits within 10 s") scales by it."""
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def wait(done: Callable[[], bool], progress: Callable[[], Hashable], *, stall: float, what: str,
         cap: float = CAP, poll: float = 0.02) -> None:
    """Return once done(); raise Stalled once progress() kept one value for `stall` s, or after `cap` s."""
    start = last_change = next_look = time.monotonic()
    seen = progress()
    while not done():
        now = time.monotonic()
        if now >= next_look:  # progress measures may scan /proc: not at every poll
            next_look = now + look_every(stall)
            value = progress()
            if value != seen:
                seen, last_change = value, now
            elif now - last_change > stall:
                raise Stalled(f"{what}: no progress for {stall:g} s")
        if now - start > cap:
            raise Stalled(f"{what}: still running after {cap:g} s (hang guard)")
        time.sleep(poll)


class StallWatch:
    """The stall check of a loop that does other work between looks (a run's main loop): look()
    takes the loop's own progress (extra: the steps done) at every call, and samples busy() (a
    /proc scan) only once that progress has kept still for `every` s, at most every `every` s;
    stalled() says whether neither moved for `stall` s. A run whose steps advance never scans."""

    def __init__(self, busy: Callable[[], Hashable], stall: float, every: float = 1.0,
                 clock: Callable[[], float] = time.monotonic):
        self.busy, self.stall, self.every, self.clock = busy, stall, every, clock
        self.extra: tuple | None = None
        self.seen: Hashable = None
        self.last_change = clock()
        self.last_look = -float("inf")

    def look(self, *extra: Hashable) -> None:
        now = self.clock()
        if extra != self.extra:
            self.extra, self.last_change = extra, now
        elif now - max(self.last_look, self.last_change) >= self.every:
            self.last_look, value = now, self.busy()
            if value != self.seen:
                self.seen, self.last_change = value, now

    def stalled(self) -> bool:
        return self.clock() - self.last_change > self.stall


def cpu_ticks(pids) -> int:
    """CPU time (clock ticks) used by these processes and their reaped children."""
    return sum(procstat.cpu_ticks(f, children=True) for f in map(procstat.of, pids) if f)


def activity(*pids: int, share: float = IDLE_SHARE) -> Callable[[], int]:
    """A progress measure: the CPU time used by these processes' trees (default: this process's,
    without the calling thread, which only polls), beyond an idle process's (busy(); share 0:
    every tick)."""
    if pids:
        def of_pids() -> int:
            kids = procstat.children()  # one scan of /proc for every tree: each reads every process's stat
            return cpu_ticks(p for pid in pids for p in procstat.tree(pid, kids))
        return busy(of_pids, share)

    me, tid = os.getpid(), threading.get_native_id()

    def measure() -> int:
        caller = procstat.of(me, tid)
        return cpu_ticks(procstat.tree(me)) - (procstat.cpu_ticks(caller) if caller else 0)

    return busy(measure, share)


def busy(ticks: Callable[[], int], share: float = IDLE_SHARE,
         clock: Callable[[], float] = time.monotonic) -> Callable[[], int]:
    """A measure of CPU clock ticks that moves only while they grow faster than `share` of one core,
    averaged since it last moved: a process that only polls (a worker waiting out a step that can
    never complete, a switch without frames, a stream close that never returns) stalls a wait, as
    one that sleeps does. It never moves back (a process leaving a tree takes its ticks along)."""
    hz, start = os.sysconf("SC_CLK_TCK"), clock()
    best: list[int] = []

    def measure() -> int:
        level = int(ticks() - share * hz * (clock() - start))
        if not best or level > best[0]:
            best[:] = [level]
        return best[0]

    return measure


def file_sizes(*paths) -> Callable[[], tuple]:
    """A progress measure: the sizes of these files (absent: -1), e.g. logs a process writes."""
    def measure() -> tuple:
        out = []
        for p in paths:
            try:
                out.append(os.stat(p).st_size)
            except OSError:
                out.append(-1)
        return tuple(out)

    return measure


def both(*measures: Callable[[], Hashable]) -> Callable[[], tuple]:
    return lambda: tuple(m() for m in measures)


def wait_process(proc: subprocess.Popen, *, stall: float = STALL, progress: Callable[[], Hashable] | None = None,
                 what: str | None = None, cap: float = CAP) -> int:
    """proc's exit code once it exits; Stalled if it (and `progress`, if given) made no progress for
    `stall` s. The default measure is the CPU time of proc's process tree (activity())."""
    measure = activity(proc.pid)
    if progress is not None:
        measure = both(measure, progress)
    wait(lambda: proc.poll() is not None, measure, stall=stall, cap=cap,
         what=what or f"process {proc.pid} ({' '.join(map(str, proc.args[:4]))} ...)")
    return proc.returncode


def communicate(proc: subprocess.Popen, input: str | bytes | None = None, *, stall: float = STALL,
                progress: Callable[[], Hashable] | None = None, cap: float = CAP) -> tuple:
    """proc.communicate(input), but ending proc (end()) and raising Stalled once its process tree
    idled (activity()) and `progress`, if given, stayed the same for `stall` s."""
    measure = activity(proc.pid)
    if progress is not None:
        measure = both(measure, progress)
    start = time.monotonic()
    done = _communicate_while_progressing(proc, input, measure, stall, cap)
    if done is not None:
        return done
    why = f"no progress for {stall:g} s" if time.monotonic() - start <= cap else f"still running after {cap:g} s"
    end(proc, stall=stall)
    raise Stalled(f"{' '.join(map(str, proc.args[:4]))} ...: {why}")


def end(proc: subprocess.Popen, *, stall: float = STALL) -> None:
    """End a process that stalled, and what it started: SIGTERM first (make run tears down its
    network, switch and agents on it), waited for while its tree makes progress; then SIGKILL to
    the process and every process of its tree at the start still alive (a SIGKILL to the process
    alone left them running, reparented, in the way of the runs after it). A tree busy through
    its SIGTERM (what the hang guard ends) gets TEARDOWN_TURNS times `stall` at most."""
    members = _members(proc.pid)
    proc.terminate()
    _communicate_while_progressing(proc, None, activity(proc.pid), stall, TEARDOWN_TURNS * stall)
    for pid, started in members + (_members(proc.pid) if proc.poll() is None else []):
        f = procstat.of(pid)
        if f and f[procstat.START] == started:  # the same process, not a pid reused since
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    proc.communicate()


def _communicate_while_progressing(proc: subprocess.Popen, input, measure: Callable[[], Hashable], stall: float,
                                   limit: float) -> tuple | None:
    """proc.communicate(input) once proc exits; None once `measure` kept one value for `stall` s
    or `limit` s passed."""
    start = last_change = time.monotonic()
    seen, pending = measure(), input
    while True:
        try:
            return proc.communicate(pending, timeout=look_every(stall))
        except subprocess.TimeoutExpired:
            pending = None  # given once: communicate() goes on feeding it
        now, value = time.monotonic(), measure()
        if value != seen:
            seen, last_change = value, now
        if now - last_change > stall or now - start > limit:
            return None


def _members(pid: int) -> list[tuple[int, str]]:
    """(pid, start time) of `pid` and its live descendants."""
    out = []
    for p in procstat.tree(pid):
        f = procstat.of(p)
        if f:
            out.append((p, f[procstat.START]))
    return out


def run(cmd: list[str], *, stall: float = STALL, input: str | bytes | None = None, cap: float = CAP,
        **kw) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, ...), but the process is killed and Stalled raised only once its process
    tree idled (activity()) for `stall` s (a slow machine makes it slower, never a failure)."""
    if kw.pop("capture_output", False):
        kw["stdout"] = kw["stderr"] = subprocess.PIPE
    check = kw.pop("check", False)
    if input is not None:
        kw["stdin"] = subprocess.PIPE
    with subprocess.Popen(cmd, **kw) as proc:
        out, err = communicate(proc, input, stall=stall, cap=cap)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done
