"""PIN: which core each of make run's processes runs on, from the plan to the running processes."""
from __future__ import annotations

import os
import pathlib
import shlex
import subprocess
import sys

import pytest

from mindp.torch import launch
from mininet_topos import config, placement
from mininet_topos.own_torchrun import commands

from .makerun import REPO, MakeRun, assert_clean, needs_root


def test_workers_take_the_cores_in_turn_then_the_switches_then_the_nodes():
    p = placement.plan("1", {6, 4}, workers=4, switches=1, nodes=1)
    assert [p.worker(n) for n in range(4)] + [p.switch(0), p.node(0)] == [4, 6, 4, 6, 4, 6]
    tree = placement.plan("1", (0, 1, 2), workers=2, switches=3, nodes=2)
    assert [tree.worker(0), tree.worker(1), *(tree.switch(i) for i in range(3)), tree.node(0), tree.node(1)] == \
        [0, 1, 2, 0, 1, 2, 0]
    assert tree.describe() == "workers on cores 0,1; switches on cores 2,0,1; nodes on cores 2,0"
    assert p.describe() == "workers on cores 4,6,4,6; the switch on core 4; the node on core 6"


def test_auto_pins_only_where_each_worker_has_a_core_and_the_network_does_not():
    assert placement.plan("auto", {0, 1}, 2, 1, 1) is not None
    assert placement.plan("auto", {0, 1, 2, 3}, 2, 1, 1) is None  # a core each: the kernel's placement
    assert placement.plan("auto", {0, 1}, 4, 1, 1) is None  # workers share cores either way
    assert placement.plan("auto", {0}, 1, 1, 1) is not None
    assert placement.plan("0", {0}, 4, 1, 1) is None
    assert placement.plan("1", {0, 1, 2, 3}, 1, 1, 1).worker(0) == 0
    assert placement.taskset(None) == [] and placement.taskset(3) == ["taskset", "-c", "3"]


@pytest.mark.parametrize("pin", ["2", "yes", ""])
def test_a_bad_pin_is_one_line(pin):
    with pytest.raises(config.RunConfigError, match=r"^PIN must be auto, 0 or 1, got "):
        config.parse(pin=pin)
    assert config.parse(pin=" 1 ").pin == "1" and config.parse().pin == "auto"


def test_up_prints_each_rank_s_command_on_its_core():
    lines = commands("/w/train.py", [], {0: "w1_0", 1: "w1_1"}, {"w1_0": 101, "w1_1": 102}, "10.0.1.1", {},
                     "/v/bin/python", pathlib.Path("/r/logs"), cores={0: 1, 1: 0})
    assert [shlex.split(c)[:6] for c in lines] == [["taskset", "-c", "1", "mnexec", "-a", "101"],
                                                   ["taskset", "-c", "0", "mnexec", "-a", "102"]]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_torchrun_rank_runs_on_the_core_make_run_gives_it(tmp_path):
    """mindp.torch.launch pins itself before it becomes the rank's program (the same process):
    rank 1 of '0,<last>' on the last core; a list without the rank's core is one line, exit 2."""
    last = max(os.sched_getaffinity(0))
    probe = "import os; print(sorted(os.sched_getaffinity(0)))"
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2", launch.PIN_CPUS_ENV: f"0,{last}"}
    script = tmp_path / "probe.py"
    script.write_text(probe)
    ran = subprocess.run([sys.executable, "-m", "mindp.torch.launch", "--script", str(script)], env=env,
                         capture_output=True, text=True, cwd=REPO)
    short = subprocess.run([sys.executable, "-m", "mindp.torch.launch", "--script", str(script)],
                           env={**env, launch.PIN_CPUS_ENV: "0"}, capture_output=True, text=True, cwd=REPO)
    assert ran.stdout.strip().splitlines()[-1] == f"[{last}]", ran.stderr
    assert short.returncode == 2 and short.stderr.strip().splitlines() == [
        f"mindp.torch.launch: {launch.PIN_CPUS_ENV}='0' gives rank 1 no core: list index out of range"]


def cores_of(pid: int) -> set[frozenset[int]]:
    """The core sets of every thread of `pid`."""
    return {frozenset(os.sched_getaffinity(int(t))) for t in os.listdir(f"/proc/{pid}/task")}


@needs_root
@pytest.mark.parametrize("pin", ["1", "0"])
def test_make_run_runs_each_process_where_pin_says(tmp_path, pin):
    """Two jobs of two workers: 7 processes. PIN=1: worker N (in start order) on core N, the switch
    next, then each job's node, every thread of each; PIN=0: each on every core make run may use."""
    run = MakeRun(tmp_path, "--target", "embedded", "--workers", "2", "--jobs", "2", "--steps", "100000",
                  "--p4", "committed", "--pin", pin).start()
    recorded = run.wait_for(run.training)
    mine = os.sched_getaffinity(0)
    plan = placement.plan("1", mine, 4, 1, 2)
    want = {"worker-job1-0": plan.worker(0), "worker-job1-1": plan.worker(1), "worker-job2-0": plan.worker(2),
            "worker-job2-1": plan.worker(3), "embedded switch": plan.switch(0), "optimizer-job1 ": plan.node(0),
            "optimizer-job2 ": plan.node(1)}
    seen = {}
    for proc in recorded.procs:
        name = next((n for n in want if (proc.name + " ").startswith(n)), None)
        if name is not None:
            seen[name] = cores_of(proc.pid)
    assert sorted(seen) == sorted(want)
    assert seen == {n: {frozenset({c} if pin == "1" else mine)} for n, c in want.items()}
    stop = run.stop()
    assert "asked the running make run to stop" in stop.stdout
    assert run.wait() == 130
    said = run.out + run.err + (run.run_dir / "logs" / "run.log").read_text()
    assert ("pinned (PIN=1): workers on cores" in said) == (pin == "1")
    assert_clean(run, recorded)
