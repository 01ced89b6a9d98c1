"""The job survives what operators and failures do to it mid-run, through the real switch (the
embedded switch always, BMv2 where installed) configured by the real controller: workers added
and removed between steps, a switch restarted mid-step; training ends bit-identical to the
reference run that does the same."""
import dataclasses
import time

import pytest

from host_agent import reference
from host_agent.optim import OptimizerConfig
from host_agent.worker import RtoConfig

from tests.conftest import TARGET_PARAMS

from .harness import Fabric, NodeProcess, Workers, check_against, job_bed, run_files
from .helpers import small_model

pytestmark = pytest.mark.net


@pytest.fixture(scope="module")
def bed():
    yield from job_bed("hrc-", 4)


def first_three(topo):
    """The topology's job with workers 0..2 only (worker 3's host stays free to be added)."""
    job = topo.jobs[0]
    return dataclasses.replace(job, workers={w: h for w, h in job.workers.items() if w < 3})


@pytest.mark.parametrize("target", TARGET_PARAMS)
def test_workers_added_and_removed_between_steps(bed, tmp_path, target):
    """Steps 0-1 with workers 0-2, `workers add 3`, step 2 with 0-3, `workers remove 0`, steps 3-4
    with 1-3: the node follows the count the switch's sums carry, each mean divided by it."""
    b, topo = bed
    init = small_model()
    gf = reference.synthetic_grads(31)
    phases = [([0, 1, 2], 0, 2), ([0, 1, 2, 3], 2, 3), ([1, 2, 3], 3, 5)]
    members = {s: ids for ids, lo, hi in phases for s in range(lo, hi)}
    ref = reference.train(init, gf, 3, 5, OptimizerConfig(), members=members.__getitem__)
    args = run_files(tmp_path, topo, init, 5)
    with Fabric(target, bed, tmp_path, job=first_three(topo)) as fab:
        node = NodeProcess(b.hosts["opt1"], args, tmp_path / "node.log").start()
        try:
            params = None
            for ids, lo, hi in phases:
                if lo == 2:
                    assert sorted(fab.ctl.add_worker(1, 3, topo.jobs[0].workers[3]).workers) == [0, 1, 2, 3]
                if lo == 3:
                    assert sorted(fab.ctl.remove_worker(1, 0).workers) == [1, 2, 3]
                workers = Workers(b, topo, init, gf, hi, ids=ids, first_step=lo, params=params).start()
                workers.join(120)
                assert sorted(workers.results) == ids
                params = workers.results[ids[-1]]
            assert node.wait(60) == 0
        finally:
            node.stop()
    stats = check_against(ref, workers, tmp_path)
    assert stats.get("rejected_nworkers", 0) == 0 and stats["committed"] == 4


@pytest.mark.parametrize("target", TARGET_PARAMS)
def test_switch_killed_and_restarted_mid_step(bed, tmp_path, target):
    """The switch is killed (SIGKILL) twice inside a step and the controller restores it: every
    partial sum is gone. Worker 0 loses 30 % of what it receives, so at the kill it usually lacks
    parameters the others have (they will not send those gradients again): the node's stall
    resend of its recent parameters completes the step, and training ends at reference bits."""
    b, topo = bed
    init = small_model()
    gf = reference.synthetic_grads(32)
    steps = 6
    ref = reference.train(init, gf, 4, steps, OptimizerConfig())
    args = run_files(tmp_path, topo, init, steps) + ["--stall-resend", "0.5"]
    rto = RtoConfig(initial=0.05, min=0.01, max=0.5, deadline=20.0)
    with Fabric(target, bed, tmp_path) as fab:
        node = NodeProcess(b.hosts["opt1"], args, tmp_path / "node.log").start()
        try:
            workers = Workers(b, topo, init, gf, steps, rto=rto, recv_drop={0: 0.3}).start()
            for step in (1, 3):
                workers.wait_step(step)
                time.sleep(0.03)
                assert "rewrote" in " ".join(fab.restart())
            workers.join(120)
            assert node.wait(60) == 0
        finally:
            node.stop()
    stats = check_against(ref, workers, tmp_path)
    assert stats["stall_resends"] > 0


@pytest.mark.parametrize("target", TARGET_PARAMS)
def test_chaos_switch_node_worker_controller_killed_in_turn(bed, tmp_path, target):
    """One training run; in turn the switch is killed (SIGKILL) and restored by the controller,
    the optimizer node is killed (SIGKILL) and restarted on its state, one worker is killed
    between steps while the others go on and restarted at the step it was at, and the controller is replaced by a new one that
    learns the job from the switch (and then changes it: worker 3 leaves). Every survivor, the
    restarted worker and the node's master end bit-identical to the reference."""
    b, topo = bed
    init = small_model()
    gf = reference.synthetic_grads(33)
    steps = 10
    members = lambda s: [0, 1, 2, 3] if s < 8 else [0, 1, 2]  # noqa: E731
    ref = reference.train(init, gf, 4, steps, OptimizerConfig(), members=members)
    args = run_files(tmp_path, topo, init, steps) + ["--stall-resend", "0.5"]
    rto = RtoConfig(initial=0.05, min=0.01, max=0.5, deadline=30.0)
    with Fabric(target, bed, tmp_path) as fab:
        node = NodeProcess(b.hosts["opt1"], args, tmp_path / "node.log").start()
        try:
            workers = Workers(b, topo, init, gf, 8, rto=rto).start()
            workers.wait_step(1)
            time.sleep(0.03)
            assert "pushed the pipeline" in fab.restart()  # 1. the switch
            workers.wait_step(3)
            time.sleep(0.03)
            node.kill()  # 2. the optimizer node
            time.sleep(0.3)
            node = NodeProcess(b.hosts["opt1"], args, tmp_path / "node.log").start()
            workers.wait_step(5)
            time.sleep(0.03)
            at, params = workers.kill(2)  # 3. a worker, while the others start the next step
            assert 5 <= at < 8
            time.sleep(0.3)
            again = Workers(b, topo, init, gf, 8, rto=rto, ids=[2], first_step=at, params=params).start()
            ctl = fab.restart_controller()  # 4. the controller
            assert sorted(ctl.job(1).workers) == [0, 1, 2, 3]
            workers.join(120)
            again.join(120)
            ctl.remove_worker(1, 3)  # the new controller can still manage the job
            last = Workers(b, topo, init, gf, steps, rto=rto, ids=[0, 1, 2], first_step=8,
                           params=workers.results[0]).start()
            last.join(120)
            assert node.wait(60) == 0
        finally:
            node.stop()
    assert sorted(workers.results) == [0, 1, 3] and sorted(again.results) == [2]
    at8 = reference.train(init, gf, 4, 8, OptimizerConfig())
    check_against(at8, workers, tmp_path, master=False)
    check_against(at8, again, tmp_path, master=False)
    check_against(ref, last, tmp_path)
