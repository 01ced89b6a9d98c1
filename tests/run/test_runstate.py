"""The run-state file: make stop ends exactly the recorded processes and interfaces."""
import dataclasses
import os
import pathlib
import subprocess
import time

import pytest

from mindp.harness import testbed
from mininet_topos import stop
from mininet_topos.runstate import RunState, start_time


@pytest.fixture
def sleeper():
    procs = []

    def start(group=True):
        p = subprocess.Popen(["sleep", "60"], start_new_session=group)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_teardown_ends_recorded_processes_and_removes_the_file(tmp_path, sleeper):
    path = tmp_path / "state.json"
    a, b = sleeper(), sleeper(group=False)
    st = RunState(path)
    st.add_proc(a.pid, "a", True)
    st.add_proc(b.pid, "b", False)
    loaded = RunState.load(path)
    assert [p.pid for p in loaded.live_procs()] == [a.pid, b.pid]
    ended, _ = loaded.teardown(grace=2)
    assert {p.pid for p in ended} == {a.pid, b.pid}
    assert a.wait(5) is not None and b.wait(5) is not None
    assert not path.exists()


def test_a_recycled_pid_is_never_signalled(tmp_path, sleeper):
    victim = sleeper()
    st = RunState(tmp_path / "state.json")
    st.add_proc(victim.pid, "old", True)
    st.procs[0] = dataclasses.replace(st.procs[0], start=st.procs[0].start - 1)  # same PID, other process
    st.save()
    ended, _ = RunState.load(st.path).teardown(grace=0.2)
    assert ended == []
    time.sleep(0.1)
    assert victim.poll() is None


@pytest.mark.net
def test_only_recorded_interfaces_are_deleted(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to make interfaces")
    pre = testbed.tagged("rst-")  # not a make run prefix: the make run tests check theirs are all gone
    mine, other = f"{pre}tst0", f"{pre}tst1"
    for name in (mine, other):
        subprocess.run(["ip", "link", "del", name], capture_output=True)
        subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", name + "b"], check=True)
    try:
        st = RunState(tmp_path / "state.json")
        st.add_interfaces([mine, f"{pre}absent"])
        _, deleted = RunState.load(st.path).teardown()
        assert deleted == [mine]
        assert not pathlib.Path(f"/sys/class/net/{mine}").exists()
        assert pathlib.Path(f"/sys/class/net/{other}").exists()
    finally:
        for name in (mine, other):
            subprocess.run(["ip", "link", "del", name], capture_output=True)


def test_stop_is_safe_twice_and_on_a_corrupt_file(tmp_path, sleeper):
    path = tmp_path / "state.json"
    p = sleeper()
    st = RunState(path, run_dir="runs/x")
    st.add_proc(p.pid, "worker", True)
    assert "ended 1 process(es)" in stop.stop(path)
    assert stop.stop(path) == "nothing to stop"
    path.write_text("{garbage")
    assert "ended 0 process(es), removed 0 interface(s)" in stop.stop(path)
    assert not path.exists()


def test_start_time_of_missing_process_is_none():
    assert start_time(os.getpid()) is not None
    assert start_time(2**22 + 12345) is None
