"""mindp.progress: waits fail after a stretch without progress, never because progress is slow."""
import os
import subprocess
import sys
import time

import pytest

from mindp import procstat, progress

BUSY = [sys.executable, "-c", "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\n"
        "print('done')"]


def test_slow_progress_never_fails_a_wait():
    start = time.monotonic()
    state = {"n": 0}

    def advance():  # one step every 0.2 s, done after 1.2 s: far more than `stall` in all
        if time.monotonic() - start > 0.2 * (state["n"] + 1):
            state["n"] += 1
        return state["n"] >= 6

    progress.wait(advance, lambda: state["n"], stall=0.6, what="slow")
    assert state["n"] == 6


def test_no_progress_fails_after_the_stall_time_naming_what():
    start = time.monotonic()
    with pytest.raises(progress.Stalled, match="frames: no progress for 0.5 s"):
        progress.wait(lambda: False, lambda: 7, stall=0.5, what="frames")
    assert time.monotonic() - start >= 0.5


def test_the_hang_guard_ends_progress_that_never_finishes():
    n = iter(range(10**9))
    with pytest.raises(progress.Stalled, match="hang guard"):
        progress.wait(lambda: False, lambda: next(n), stall=10, cap=0.5, what="spinning")


def test_run_lets_a_busy_process_finish_and_kills_an_idle_one():
    done = progress.run(BUSY, stall=3, capture_output=True, text=True, check=True)
    assert done.stdout == "done\n"
    with pytest.raises(progress.Stalled, match="no progress"):  # before `sleep 30` could end by itself
        progress.run(["sleep", "30"], stall=1)


# Wakes every 50 ms and works 0.5 ms (of its own CPU time) each time: 1 % of a core, a tick a second.
POLLER = [sys.executable, "-c", "import select, time\nwhile True:\n    select.select([], [], [], 0.05)\n"
          "    end = time.thread_time() + 0.0005\n    while time.thread_time() < end: pass"]


def test_a_process_that_only_polls_stalls_as_a_sleeping_one_does():
    """A worker waiting out a step that can never complete wakes every 50 ms: its CPU ticks grow
    forever, and a wait that took any tick for progress hung until its hang guard (30 min)."""
    with pytest.raises(progress.Stalled, match="no progress for 2 s"):
        progress.run(POLLER, stall=2, cap=60)


STARTER = """
import pathlib, signal, subprocess, sys, time
out = pathlib.Path(sys.argv[1])
child = subprocess.Popen(["sleep", "600"])
(out / "child").write_text(str(child.pid))
def torn_down(*_):
    (out / "torn-down").write_text("yes")
    if sys.argv[2] == "tears-down":
        child.kill()
        sys.exit(0)
signal.signal(signal.SIGTERM, torn_down)
while True:
    time.sleep(0.05)
"""


@pytest.mark.parametrize("mode", ["tears-down", "ignores"])
def test_a_stalled_process_is_told_to_end_then_killed_with_what_it_started(tmp_path, mode):
    """A stalled make run gets SIGTERM (it tears down its network, switch and agents), and what is
    still alive of its tree after that idles too is killed: never left running for the next run."""
    with pytest.raises(progress.Stalled, match="no progress for 2 s"):
        progress.run([sys.executable, "-c", STARTER, str(tmp_path), mode], stall=2, cap=120)
    assert (tmp_path / "torn-down").read_text() == "yes"  # SIGTERM came first, and was waited for
    child = int((tmp_path / "child").read_text())

    def gone() -> bool:  # (or a zombie of its killed parent, about to be reaped)
        f = procstat.of(child)
        return f is None or f[procstat.STATE] in "ZX"
    progress.wait(gone, lambda: 0, stall=progress.STALL, what="the child's end")  # a killed process ends at once


def test_a_process_busy_through_its_sigterm_is_killed_after_the_teardown_bound():
    """The hang guard ends a process busy forever; one that then spins on through SIGTERM gets
    TEARDOWN_TURNS stall times to end by itself, not forever."""
    spinner = [sys.executable, "-c", "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: pass"]
    with pytest.raises(progress.Stalled, match="still running after 1 s"):
        progress.run(spinner, stall=1, cap=1)


def test_busy_moves_only_above_an_idle_share_and_never_back():
    now, ticks = [0.0], [0]
    measure = progress.busy(lambda: ticks[0], share=0.02, clock=lambda: now[0])
    hz = os.sysconf("SC_CLK_TCK")
    first = measure()
    for _ in range(100):  # 1 % of a core for 100 s: idling
        now[0] += 1.0
        ticks[0] += hz // 100
        assert measure() == first
    ticks[0] -= 5 * hz  # a process left the tree with its ticks
    assert measure() == first
    ticks[0] += 12 * hz  # then 7 s of CPU in a second: back above the allowance (2 s by now)
    now[0] += 1.0
    assert measure() > first


def test_run_feeds_input_and_checks_like_subprocess_run():
    assert progress.run(["cat"], input="abc", capture_output=True, text=True).stdout == "abc"
    with pytest.raises(subprocess.CalledProcessError):
        progress.run(["false"], check=True)


ACTIVITY = """
import threading, time
from mindp import progress
measure = progress.activity()
before = measure()
time.sleep(0.3)  # the caller sleeping: no CPU
idle = measure()
def spin():  # 0.1 s of this thread's CPU, on any machine (a fixed amount of work was 1 tick on a fast one)
    end = time.thread_time() + 0.1
    while time.thread_time() < end:
        pass
t = threading.Thread(target=spin)
t.start()
t.join()  # a finished thread's time still counts
print(before, idle, measure())
"""


def test_activity_sees_other_threads_and_children_not_the_caller():
    # In a process of its own: here, other tests' processes come and go in this one's tree.
    before, idle, busy = map(int, progress.run([sys.executable, "-c", ACTIVITY], capture_output=True, text=True,
                                               check=True).stdout.split())
    assert idle - before <= 1 < busy - idle  # within a tick: the process total is summed apart
    with subprocess.Popen(BUSY, stdout=subprocess.DEVNULL) as p:
        assert progress.wait_process(p, stall=3) == 0


def test_stall_watch_follows_steps_or_cpu_and_samples_once_a_second():
    """make run's main loop: a stall is neither a step nor CPU for the stall time (a fake clock);
    the CPU (a /proc scan) is sampled only once the steps have kept still for a second."""
    now, cpu, samples = [0.0], [0], []

    def busy():
        samples.append(now[0])
        return cpu[0]

    watch = progress.StallWatch(busy, stall=60.0, clock=lambda: now[0])
    for t, step, used in [(0.5, 0, 0), (1.2, 1, 0), (1.9, 2, 0), (30.0, 3, 0), (80.0, 3, 5), (139.0, 3, 5)]:
        now[0], cpu[0] = t, used
        watch.look(step)
        watch.look(step)  # a second look within the second does not sample again
        assert not watch.stalled(), t
    assert samples == [80.0, 139.0]  # none while the steps advanced
    now[0] = 140.5
    watch.look(3)
    assert watch.stalled()  # nothing changed since 80 s
