"""The job survives what operators and failures do to it mid-run, through the real switch (the
embedded switch always, BMv2 where installed) configured by the real controller: workers added
and removed between steps, a switch restarted mid-step; training ends bit-identical to the
reference run that does the same."""
import dataclasses

import pytest

from host_agent import reference
from host_agent.optim import OptimizerConfig

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
