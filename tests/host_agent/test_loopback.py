"""Agents over real veths in namespaces, with the in-test aggregator as the switch
seam: bit-identical to the reference, also with loss, duplicates, reordering and
a killed and restarted optimizer node."""
import random
import time

import numpy as np
import pytest

from host_agent import optim, reference
from host_agent.optim import OptimizerConfig
from mindp.testbed import Testbed
from mindp.topology import star

from .aggregator import Aggregator
from .harness import NodeProcess, Workers, load_npz, load_stats, node_args
from .helpers import same_bits, small_model

pytestmark = pytest.mark.net
STEPS = 4
N = 3


@pytest.fixture(scope="module")
def bed():
    topo = star([N], slots=8)
    with Testbed("hal-") as b:
        for h in topo.hosts.values():
            b.add(h)
        yield b, topo


def setup_run(tmp_path, topo, init):
    topo_path = tmp_path / "topo.json"
    topo.dump(topo_path)
    init_path = tmp_path / "init.npz"
    np.savez(init_path, **init)
    return node_args(topo_path, tmp_path / "state", init_path, STEPS, tmp_path / "final.npz", tmp_path / "stats.json")


def aggregator(bed_topo, **faults):
    b, topo = bed_topo
    job = topo.jobs[0]
    workers = {w: topo.host(n) for w, n in job.workers.items()}
    return Aggregator(job.job_id, workers, topo.host(job.optimizer), b.ports(), **faults)


@pytest.mark.parametrize("faults", [{}, dict(drop=0.05, dup=0.05, reorder=0.05, seed=1)],
                         ids=["clean", "loss-dup-reorder"])
def test_workers_and_node_match_reference(bed, tmp_path, faults):
    b, topo = bed
    init = small_model()
    gf = reference.synthetic_grads(11)
    ref = reference.train(init, gf, N, STEPS, OptimizerConfig())
    args = setup_run(tmp_path, topo, init)
    with aggregator(bed, **faults) as agg:
        node = NodeProcess(b.hosts["opt1"], args, tmp_path / "node.log").start()
        try:
            workers = Workers(b, topo, init, gf, STEPS, drop=faults.get("drop", 0.0)).start()
            workers.join()
            assert node.wait(30) == 0
        finally:
            node.stop()
    for w, params in workers.results.items():
        assert same_bits(params, ref.params), f"worker {w} differs from the reference"
    assert same_bits(load_npz(tmp_path / "final.npz"), ref.master)
    stats = load_stats(tmp_path / "stats.json")
    n_chunks = optim.layout_of(init).n_chunks
    assert stats["applied"] == STEPS * n_chunks and stats["committed"] == STEPS - 1
    totals = workers.totals()
    assert totals["params_received"] == N * STEPS * n_chunks
    if faults:
        assert agg.stats["dropped"] and agg.stats["duplicated"] and agg.stats["reordered"]
        assert totals["retransmitted"] > 0 and totals["timeouts"] > 0
        assert stats.get("resent", 0) > 0  # duplicate sums were answered from stored parameters


def test_killed_and_restarted_node_ends_bit_identical(bed, tmp_path):
    b, topo = bed
    init = small_model()
    gf = reference.synthetic_grads(12)
    ref = reference.train(init, gf, N, STEPS, OptimizerConfig())
    args = setup_run(tmp_path, topo, init)
    rng = random.Random(7)
    with aggregator(bed) as agg:
        node = NodeProcess(b.hosts["opt1"], args, tmp_path / "node.log").start()
        try:
            workers = Workers(b, topo, init, gf, STEPS).start()
            for kill_after in (1, 2):
                workers.wait_step(kill_after)
                time.sleep(rng.uniform(0, 0.02))  # somewhere inside the next step
                node.kill()
                time.sleep(0.3)  # workers time out and retransmit into the void meanwhile
                node = NodeProcess(b.hosts["opt1"], args, tmp_path / "node.log").start()
                assert "resuming after step" in node.banner
            workers.join()
            assert node.wait(30) == 0
        finally:
            node.stop()
    for params in workers.results.values():
        assert same_bits(params, ref.params)
    assert same_bits(load_npz(tmp_path / "final.npz"), ref.master)
    assert agg.stats["resent_sums"] > 0  # the gap was filled by retransmissions

