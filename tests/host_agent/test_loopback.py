"""Agents over real veths in namespaces, with the in-test aggregator as the switch
seam: bit-identical to the reference, also with loss, duplicates, reordering and
a killed and restarted optimizer node."""
import dataclasses
import random
import time

import numpy as np
import pytest

from host_agent import optim, reference, state
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


def state_rss(pid: int) -> int:
    """Resident bytes of the process's mappings of its state files."""
    total, inside = 0, False
    try:
        lines = open(f"/proc/{pid}/smaps").read().splitlines()
    except OSError:
        return 0
    for line in lines:
        if "-" in line.split(" ", 1)[0] and not line.startswith(("Rss", "Size")):
            inside = line.endswith(("/state0.bin", "/state1.bin"))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


def test_node_trains_state_ten_times_its_ram_budget(bed, tmp_path):
    """RSS of the state mappings (sampled) stays within the budget, and the whole process grows
    by less than the state: the state is paged, not loaded."""
    b, topo = bed
    budget = 512 << 10
    init = {"big": np.random.default_rng(3).standard_normal(230_000).astype(np.float32) * 0.1,
            "small": np.zeros(100, np.float32)}
    lay = optim.layout_of(init)
    state_bytes = 2 * lay.n_chunks * state.RECORD.itemsize
    assert state_bytes >= 10 * budget
    cfg = OptimizerConfig()
    state.create(tmp_path / "state", lay, state.init_pieces(lay, init), cfg, page_chunks=32)
    steps = 1
    gf = reference.synthetic_grads(4)
    ref = reference.train(init, gf, N, steps, cfg)
    topo = dataclasses.replace(topo, jobs=[dataclasses.replace(topo.jobs[0], slots=64)])  # a wider window
    args = setup_run(tmp_path, topo, init)
    args[args.index("--ram-budget") + 1] = str(budget)
    args[args.index("--steps") + 1] = str(steps)
    samples = []
    with aggregator(bed):
        node = NodeProcess(b.hosts["opt1"], args, tmp_path / "node.log").start()
        pid = node.child_pid()
        try:
            workers = Workers(b, topo, init, gf, steps).start()
            while any(t.is_alive() for t in workers.threads):
                samples.append(state_rss(pid))
                time.sleep(0.01)
            workers.join()
            assert node.wait(60) == 0
        finally:
            node.stop()
    for params in workers.results.values():
        assert same_bits(params, ref.params)
    stats = load_stats(tmp_path / "stats.json")
    page = stats["page_bytes"]
    assert len(samples) > 20 and max(samples) > 0
    assert max(samples) <= budget + page, f"state mappings reached {max(samples)} B for a budget of {budget} B"
    assert stats["peak_pages"] * page <= budget
    grown = (stats["vm_hwm_kb"] - stats["rss_start_kb"]) * 1024
    assert grown < state_bytes / 2, f"node grew by {grown} B; state is {state_bytes} B"
