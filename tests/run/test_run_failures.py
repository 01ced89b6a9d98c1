"""A `make run` whose switch, optimizer node, worker or controller fails mid-training ends by itself
within 10 s of the failure, with one line naming it, and leaves nothing for `make stop`.

Each failure is real: a process killed (SIGKILL), a switch that stops answering (SIGSTOP: the
controller's probe ends in gRPC DEADLINE_EXCEEDED), a disk that fills up under the run. The run is
waited for with a generous timeout (a hang fails there); the 10 s is measured from the failure to
the orchestrator's exit, with the detection delay the orchestrator documents added for a hung switch.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from mindp import progress
from mininet_topos import star as orchestrator

from .makerun import MakeRun, assert_clean, needs_root

pytestmark = pytest.mark.net
EXIT_WITHIN = 10.0  # seconds on an idle machine; a loaded one scales it (progress.load_factor)


def within(seconds: float) -> float:
    return seconds * progress.load_factor()


def one_failure_line(run: MakeRun) -> str:
    lines = [line for line in run.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("make run: "), run.err
    return lines[0]


def assert_nothing_to_stop(run: MakeRun) -> None:
    stop = run.stop()
    assert stop.returncode == 0 and "nothing to stop" in stop.stdout, stop.stdout


def training_run(tmp_path) -> tuple[MakeRun, object]:
    run = MakeRun(tmp_path, "--target", "embedded", "--workers", "2", "--steps", "500", "--p4", "committed").start()
    return run, run.wait_for(run.training)


@needs_root
@pytest.mark.parametrize("victim, log", [("embedded switch", "switch.log"), ("optimizer-job1", "optimizer-job1.log"),
                                         ("worker-job1-1", "worker-job1-1.log")])
def test_a_crash_ends_the_run_within_10s_in_one_line(tmp_path, victim, log):
    run, recorded = training_run(tmp_path)
    (proc,) = [p for p in recorded.procs if p.name.startswith(victim)]
    os.killpg(proc.pid, signal.SIGKILL)
    failed = time.monotonic()
    assert run.wait() == 1
    took = time.monotonic() - failed
    line = one_failure_line(run)
    print(f"{took:.1f} s: {line}")
    assert log in line and "killed by SIGKILL" in line, line
    assert line in (run.run_dir / "logs" / "run.log").read_text()
    assert took < within(EXIT_WITHIN), f"exited {took:.1f} s after the crash"
    assert_clean(run, recorded)
    assert_nothing_to_stop(run)


@needs_root
def test_a_hung_switch_is_the_controllers_deadline_exceeded_and_the_run_ends(tmp_path):
    """SIGSTOP: the switch process lives but answers nothing; its cleanup must not wait on it."""
    run, recorded = training_run(tmp_path)
    (proc,) = [p for p in recorded.procs if p.name.startswith("embedded switch")]
    os.killpg(proc.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        assert run.wait() == 1
    finally:
        if proc.alive():  # by PID and start time: never another process
            os.killpg(proc.pid, signal.SIGCONT)
    took = time.monotonic() - stopped
    line = one_failure_line(run)
    print(f"{took:.1f} s: {line}")
    assert "controller:" in line and "DEADLINE_EXCEEDED" in line and "controller.log" in line, line
    detect = orchestrator.PROBE_SECONDS + orchestrator.SWITCH_DEADLINE + orchestrator.CRASH_GRACE
    assert took < detect + within(EXIT_WITHIN), f"exited {took:.1f} s after the switch hung"
    assert_clean(run, recorded)
    assert_nothing_to_stop(run)


@pytest.fixture
def small_disk(tmp_path):
    """tmp_path/runs on a 48 MiB tmpfs (a run needs a few MiB), unmounted after the test."""
    runs = tmp_path / "runs"
    runs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(runs)], check=True)
    try:
        yield runs
    finally:
        subprocess.run(["umount", "-l", str(runs)], check=False)


@needs_root
def test_a_full_disk_ends_the_run_within_10s_in_one_line(tmp_path, small_disk):
    run, recorded = training_run(tmp_path)
    filler = small_disk / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=1M"], capture_output=True)  # until ENOSPC
    full = time.monotonic()
    assert run.wait() == 1
    took = time.monotonic() - full
    line = one_failure_line(run)
    print(f"{took:.1f} s: {line}")
    assert "No space left on device" in line or "disk" in line, line
    assert took < within(EXIT_WITHIN), f"exited {took:.1f} s after the disk filled"
    assert_clean(run, recorded)
    assert_nothing_to_stop(run)



class _ClosedStream:
    """The controller as it is when the switch's socket closed: every read fails."""

    def check_switch(self, deadline):
        raise RuntimeError("switch went away during read of counter: Connection reset by peer")


class _Agents:
    def check_alive(self):
        pass


def _probing_run(switch_proc: subprocess.Popen, tmp_path) -> orchestrator.Run:
    from mininet_topos.net import MindpSwitch

    run = object.__new__(orchestrator.Run)  # only what probe_switch reads
    run.switch = object.__new__(MindpSwitch)
    run.switch.process = type("P", (), {"proc": switch_proc})()
    run.ctl, run.agents, run.target, run.logs, run.probed = _ClosedStream(), _Agents(), "embedded", tmp_path, 0.0
    run.ctl_logger = __import__("logging").getLogger("test")
    return run


def test_a_switch_dying_as_its_stream_closes_is_named_as_the_crash(tmp_path):
    """The controller sees the reset before the switch can be reaped: the line names the switch."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    proc.send_signal(signal.SIGKILL)  # dying, maybe not yet reaped: either way the crash is named
    with pytest.raises(orchestrator.RunError) as err:
        _probing_run(proc, tmp_path).probe_switch()
    assert "switch.log" in str(err.value) and "killed by SIGKILL" in str(err.value), err.value


def test_a_live_switch_whose_stream_fails_is_the_controllers_error(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(orchestrator.RunError) as err:
            _probing_run(proc, tmp_path).probe_switch()
        assert "controller:" in str(err.value) and "does not answer" in str(err.value), err.value
    finally:
        proc.kill()
        proc.wait()
