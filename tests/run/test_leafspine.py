"""make run TOPO=leafspine end to end: three switch processes (embedded, and BMv2 where installed)
linked in Mininet, the tree controller over one P4Runtime session each, two optimizer shards on
the spine, workers on the leaves; the run must end bit-exact with the reference trainer, also
with injected loss (every level then recovers its own losses)."""
from __future__ import annotations

import json

import pytest

from host_agent import optim
from mindp import topology, workload
from mininet_topos import config, net
from mininet_topos.leafspine import switch_ports
from tests.target_params import TARGET_PARAMS

from .makerun import MakeRun, assert_clean, needs_root

LEAVES, WORKERS, SHARDS, STEPS = 2, 2, 2, 4


@pytest.mark.net
@needs_root
@pytest.mark.parametrize("target", TARGET_PARAMS)
@pytest.mark.parametrize("loss", ["0", "0.02"])
def test_leafspine_run_is_bit_exact(tmp_path, target, loss):
    run = MakeRun(tmp_path, "--target", target, "--topo", "leafspine", "--leaves", str(LEAVES), "--workers", str(WORKERS),
              "--optimizers", str(SHARDS), "--steps", str(STEPS), "--loss", loss, "--p4", "committed")
    assert run.run() == 0, run.out + run.err
    s = run.summary()
    d = run.run_dir
    cfg = json.loads((d / "config.json").read_text())
    assert (cfg["topo"], cfg["leaves"], cfg["optimizers"], s["target"]) == ("leafspine", LEAVES, SHARDS, target)
    assert s["max_abs_param_diff_vs_reference"] == 0.0
    assert s["workers"] == LEAVES * WORKERS  # every leaf's, as the chart's title says
    assert f"{LEAVES * WORKERS} workers" in (run.run_dir / "curve.svg").read_text()
    topo = topology.Topology.load(d / "topology.json")
    assert [sw.name for sw in topo.switches] == ["spine", "leaf1", "leaf2"] and topo.job(1).n_workers == 4
    n_chunks = optim.layout_of(workload.init_params(workload.WorkloadConfig(n_workers=4))).n_chunks
    (job,) = s["per_job"]
    assert job["max_abs_param_diff_vs_reference"] == 0.0 and job["final_loss"] < job["initial_loss"]
    per_switch = job["switch_counters"]["per_switch"]
    # Every switch completed every chunk of every step exactly once (resends counted apart) ...
    assert {name: c["completions"] for name, c in per_switch.items()} == dict.fromkeys(
        ("spine", "leaf1", "leaf2"), STEPS * n_chunks)
    # ... from its own members: a leaf its two workers' gradients, the spine the two leaves' partials.
    for name, c in per_switch.items():
        assert c["grad_packets"] >= 2 * STEPS * n_chunks, name
    # The nodes saw one sum per chunk between them, each for its own range.
    stats = json.loads((d / "job1" / "optimizer-stats.json").read_text())["shards"]
    assert sum(x["applied"] for x in stats) == STEPS * n_chunks
    assert [x["applied"] for x in stats] == [STEPS * (hi - lo + 1) for lo, hi, _ in topo.shard_ranges(1)]
    logs = sorted(p.name for p in (d / "logs").iterdir())
    assert [x for x in logs if x.startswith("optimizer")] == ["optimizer-job1-shard0.log", "optimizer-job1-shard1.log"]
    assert all(f"switch-{name}.log" in logs for name in ("spine", "leaf1", "leaf2"))  # BMv2 adds its own .log.txt
    if loss == "0":  # nothing dropped but spurious retransmissions (a busy machine), at any level
        assert {r for c in per_switch.values() for r in c["drops"]} <= {"DUPLICATE"}, per_switch
    assert_clean(run)


# --- without a network: the variables and the Mininet topology of a tree ----------------------

@pytest.mark.parametrize("kw,message", [
    (dict(topo="ring"), "TOPO must be one of star|leafspine"),
    (dict(leaves="2"), "LEAVES and OPTIMIZERS need TOPO=leafspine"),
    (dict(optimizers="2"), "LEAVES and OPTIMIZERS need TOPO=leafspine"),
    (dict(topo="leafspine", optimizers="9"), "OPTIMIZERS must be an integer in 1..8"),
    (dict(topo="leafspine", leaves="0"), "LEAVES must be an integer in 1..32"),
    (dict(topo="leafspine", leaves="8", workers="5"), "LEAVES x WORKERS must be at most 32"),
    (dict(topo="leafspine", jobs="2"), "JOBS must be 1"),
    (dict(topo="leafspine", leaves="4", grpc_port="9000", thrift_port="9003"), "need 5 free ports each"),
])
def test_tree_variables_are_checked_in_one_line(kw, message):
    with pytest.raises(config.RunConfigError, match=message):
        config.parse(**kw)


def test_tree_variables_and_ports():
    cfg = config.parse(topo="leafspine", leaves="3", workers="2", optimizers="2")
    assert (cfg.total_workers, cfg.leaves, cfg.optimizers) == (6, 3, 2)
    assert switch_ports(cfg) == [(9559, 9090), (9560, 9091), (9561, 9092), (9562, 9093)]
    assert config.parse(workers="3").total_workers == 3  # a star: WORKERS is the job's


def test_mininet_topology_of_a_tree():
    data = topology.leafspine(2, 2, 2, chunks=8)
    topo = net.DataTopo(data, prefix="mnq-")
    assert sorted(topo.switches()) == ["leaf1", "leaf2", "spine"] and sorted(topo.hosts()) == sorted(data.hosts)
    links = {frozenset((a, b)): topo.linkInfo(a, b) for a, b in topo.links()}
    up = links[frozenset(("leaf2", "spine"))]
    ends = {(up["node1"], up["port1"], up["intfName1"]), (up["node2"], up["port2"], up["intfName2"])}
    assert ends == {("leaf2", 3, "mnq-leaf2p3"), ("spine", 2, "mnq-spinep2")}
    w = links[frozenset(("w1_2", "leaf2"))]
    assert (w["port2"], w["intfName2"], w["intfName1"]) == (1, "mnq-leaf2p1", "eth0")
    names = net.interfaces(data, "mnq-")
    assert len(names) == len(set(names)) == 6 + 2 * 2 and "mnq-spinep4" in names
    assert all(len(n) <= 15 for n in names)
