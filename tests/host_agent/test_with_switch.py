"""Worker agents and the optimizer node through the real switch (the embedded switch
always, BMv2 where installed), configured by the real controller over P4Runtime, on
veth pairs in namespaces: parameters bit-identical to the reference, also with
loss, duplicates and reordering, and across a killed and restarted node."""

import numpy as np
import pytest

from host_agent import optim, reference, state
from host_agent.optim import OptimizerConfig
from mindp.protocol import K

from tests.target_params import TARGET_PARAMS

from .harness import AgentFabric, NodeProcess, Workers, check_against, job_bed, run_files, train
from .helpers import small_model, with_nonfinite

pytestmark = pytest.mark.net
N = 3
STEPS = 4
FAULTS = ["--drop-prob", "0.05", "--dup-prob", "0.05", "--reorder-prob", "0.05", "--seed", "3"]


@pytest.fixture(scope="module")
def bed():
    yield from job_bed("has-", N)


@pytest.mark.parametrize("target", TARGET_PARAMS)
@pytest.mark.parametrize("lossy", [False, True], ids=["clean", "loss-dup-reorder"])
def test_training_through_the_switch_is_bit_identical(bed, tmp_path, target, lossy):
    topo = bed[1]
    init = small_model()
    gf = reference.synthetic_grads(21)
    ref = reference.train(init, gf, N, STEPS, OptimizerConfig())
    args = run_files(tmp_path, topo, init, STEPS)
    faults = dict(drop=0.05, dup=0.05, reorder=0.05) if lossy else {}
    if lossy and target == "bmv2":  # BMv2 has no fault injection: the node's own paths lose too
        args += ["--drop-recv", "0.05", "--drop-send", "0.05", "--dup-send", "0.05", "--reorder-send", "0.05"]
    with AgentFabric(target, bed, tmp_path, FAULTS if lossy else ()):
        workers = train(bed, args, tmp_path, init, gf, STEPS, **faults)
    stats = check_against(ref, workers, tmp_path)
    assert stats["applied"] == STEPS * optim.layout_of(init).n_chunks
    if lossy:
        totals = workers.totals()
        assert totals["retransmitted"] > 0 and totals["duplicates"] > 0
        assert stats.get("resent", 0) > 0


@pytest.mark.parametrize("target", TARGET_PARAMS)
def test_nonfinite_gradient_skips_its_step(bed, tmp_path, target):
    topo = bed[1]
    init = small_model()
    gf = with_nonfinite(reference.synthetic_grads(23), 1, 2, "w", 3)
    ref = reference.train(init, gf, N, STEPS, OptimizerConfig())
    assert len(ref.nonfinite) == 1
    args = run_files(tmp_path, topo, init, STEPS)
    with AgentFabric(target, bed, tmp_path):
        workers = train(bed, args, tmp_path, init, gf, STEPS)
    stats = check_against(ref, workers, tmp_path, master=False)
    assert [tuple(x) for x in stats["nonfinite"]] == ref.nonfinite  # the node's hook saw the switch's flag
    step, chunk = ref.nonfinite[0]
    for a in workers.agents.values():  # and every worker learnt it from the parameters' flag (set on
        # the flagged chunk's answer and on every answer the node sent after it)
        assert a.stats["nonfinite_steps"] == 1 and [s for s, _ in a.nonfinite_log] == [step]
        assert chunk in a.nonfinite_log[0][1]


@pytest.mark.parametrize("target", TARGET_PARAMS)
def test_killed_and_restarted_node_through_the_switch(bed, tmp_path, target):
    topo = bed[1]
    init = small_model()
    gf = reference.synthetic_grads(22)
    ref = reference.train(init, gf, N, STEPS, OptimizerConfig())
    args = run_files(tmp_path, topo, init, STEPS)
    with AgentFabric(target, bed, tmp_path):
        workers = train(bed, args, tmp_path, init, gf, STEPS, kill_after=(1, 2), seed=5)
    check_against(ref, workers, tmp_path)


@pytest.mark.parametrize("target", TARGET_PARAMS)
def test_ram_budget_holds_through_the_switch(bed, tmp_path, target):
    """State ten times the budget, one step through the switch: the node's pager never holds more
    pages than the budget, and the process never grows by the state's size."""
    b, topo = bed
    page_chunks = max(1, 1024 // K)  # pages of 1,024 elements: a budget of a few at any K
    budget = 512 << 10
    # The state dwarfs what the node holds besides it at any K (its receive rows, a batch's arrays:
    # a few MB at K = 1,024, which grew it by 3.4 MB once under load): at large K more elements, so
    # holding the state still fails the last assertion and those never do.
    init = {"big": np.random.default_rng(3).standard_normal(230_000 * max(1, K // 256)).astype(np.float32) * 0.1}
    lay = optim.layout_of(init)
    state_bytes = 2 * lay.n_chunks * state.RECORD.itemsize
    assert state_bytes >= 10 * budget
    cfg = OptimizerConfig()
    state.create(tmp_path / "state", lay, state.init_pieces(lay, init), cfg, page_chunks=page_chunks)
    gf = reference.synthetic_grads(4)
    ref = reference.train(init, gf, N, 1, cfg)
    args = run_files(tmp_path, topo, init, 1)
    args[args.index("--ram-budget") + 1] = str(budget)
    with AgentFabric(target, bed, tmp_path):
        node = NodeProcess(b.hosts["opt1"], args, tmp_path / "node.log").start()
        try:
            workers = Workers(b, topo, init, gf, 1).start()
            workers.join()
            assert node.finish() == 0
        finally:
            node.stop()
    stats = check_against(ref, workers, tmp_path, master=False)
    assert 0 < stats["peak_pages"] * stats["page_bytes"] <= budget
    assert stats["writebacks"] > 0 and stats["pages_prefetched"] > 0  # streamed: the pager's counts are out
    assert (stats["vm_hwm_kb"] - stats["rss_start_kb"]) * 1024 < state_bytes / 2
