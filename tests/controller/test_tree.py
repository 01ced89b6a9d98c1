"""A tree of real switches (embedded, and BMv2 where installed), one P4Runtime session each:
the same pipeline on all, a job's part on every switch (leaves send partial sums up, the spine
routes sums to the shard owning each chunk), all-or-nothing creation, `mindp-ctl topo`."""
from __future__ import annotations

import dataclasses
import json

import pytest

from controller import p4info_names as n
from controller import cli
from controller.controller import Controller, ControllerError
from controller.treectl import TreeController
from mindp.topology import JobSpec, Topology, leafspine
from tests.target_params import TARGET_PARAMS

from .switch import Switch


@pytest.fixture(params=TARGET_PARAMS)
def tree(request, tmp_path):
    """leafspine(2 leaves x 2 workers, 2 shards) on three switches on free ports."""
    base = leafspine(2, 2, 2, chunks=10)
    sws = []
    try:
        for spec in base.switches:
            (tmp_path / spec.name).mkdir()
            sw = Switch(request.param, tmp_path / spec.name)
            sw.cfg.device_id = spec.device_id  # each its own, as on a real fabric
            sws.append(sw.start())
        specs = tuple(dataclasses.replace(spec, grpc_addr=sw.addr, thrift_port=sw.cfg.thrift_port)
                      for spec, sw in zip(base.switches, sws))
        topo = Topology(specs, base.hosts, base.jobs, base.links)
        topo.check()
        yield topo, dict(zip((s.name for s in specs), sws))
    finally:
        for sw in sws:
            sw.stop()


def entries(ctl: Controller, table: str) -> list:
    return sorted(ctl.conn.read_entries(table), key=lambda e: e.key())


def test_a_tree_job_is_each_switch_s_part(tree):
    topo, _ = tree
    with TreeController(topo) as t:
        assert t.push() == {"spine": True, "leaf1": True, "leaf2": True}
        t.install_forwarding()
        parts = t.create_job(topo.job(1))
        assert list(parts) == ["spine", "leaf1", "leaf2"]  # root first
        spine, leaf1, leaf2 = (t.switches[s] for s in ("spine", "leaf1", "leaf2"))
        (je,) = entries(spine, n.JOBS)
        assert (je.params["uplink"], je.params["workers"], je.params["optimizer_port"]) == (0, 2, 3)
        assert [(e.match[n.MF_CHUNK], e.params["port"]) for e in entries(spine, n.SHARDS)] == [((0, 4), 3), ((5, 9), 4)]
        members = entries(spine, n.WORKERS)
        assert sorted(e.match[n.MF_INGRESS_PORT] for e in members) == [1, 2]  # the leaves,
        assert {(e.action, e.params["max_nworkers"]) for e in members} == {(n.ADMIT_CHILD, 2)}  # 2 workers each
        assert sorted(e.match[n.MF_INGRESS_PORT] for e in entries(spine, n.OPTIMIZERS)) == [3, 4]  # both shards
        for ctl, child, workers in ((leaf1, 0, [0, 1]), (leaf2, 1, [2, 3])):
            (je,) = entries(ctl, n.JOBS)
            assert (je.params["uplink"], je.params["child_id"], je.params["optimizer_port"]) == (1, child, 3)
            assert je.params["optimizer_mac"] == topo.host("opt1_0").mac
            assert sorted(e.match[n.MF_WORKER] for e in entries(ctl, n.WORKERS)) == workers
            assert {e.action for e in entries(ctl, n.WORKERS)} == {n.ADMIT_WORKER}
            assert entries(ctl, n.SHARDS) == []
        # Forwarding: a remote host is out of the port towards its switch.
        fwd = {e.match[n.MF_DST_MAC]: e.params.get("port") for e in entries(leaf1, n.L2_FORWARD)}
        assert fwd[topo.host("w1_0").mac] == 1 and fwd[topo.host("w1_3").mac] == 3 == fwd[topo.host("opt1_1").mac]
        # The source guard: a host may send from the same port (a leaf's uplink carries every host not
        # under it; the spine's port to a leaf carries that leaf's hosts).
        for ctl in (leaf1, spine):
            src = {(e.match[n.MF_SRC_MAC], e.match[n.MF_SRC_IP]): e.match[n.MF_INGRESS_PORT]
                   for e in entries(ctl, n.SOURCES)}
            fwd = {e.match[n.MF_DST_MAC]: e.params.get("port") for e in entries(ctl, n.L2_FORWARD)}
            assert src == {(h.mac, h.ip): fwd[h.mac] for h in topo.hosts.values()}
        assert {p for (mac, _), p in src.items() if mac in (topo.host("w1_2").mac, topo.host("w1_3").mac)} == {2}
        assert t.switches["spine"].stats().jobs[1].grad_packets == 0
    # A new controller learns every switch's part back from the switches.
    with TreeController(topo) as again:
        held = again.jobs()
        assert {s: sorted(j) for s, j in held.items()} == {"spine": [1], "leaf1": [1], "leaf2": [1]}
        for s in held:
            got, want = held[s][1], parts[s]
            assert (got.uplink is None, got.child_id, got.shards, sorted(got.workers), got.epoch, got.children) == \
                (want.uplink is None, want.child_id, want.shards, sorted(want.workers), want.epoch, want.children), s
        gone = again.delete_job(1)
        assert list(gone) == ["leaf1", "leaf2", "spine"]  # leaves first
        assert all(entries(c, n.JOBS) == [] and entries(c, n.WORKERS) == [] for c in again.switches.values())
        with pytest.raises(ControllerError, match="unknown job 1"):
            again.delete_job(1)


def test_a_failed_create_is_undone_on_every_switch(tree):
    topo, _ = tree
    with TreeController(topo) as t:
        t.push()
        # leaf2 already runs a job 1 of its own: the tree's job 1 cannot go there.
        t.switches["leaf2"].create_job(JobSpec(1, {0: "w1_2"}, "w1_3"), leafspine(2, 2, 1))
        with pytest.raises(ControllerError, match=r"switch leaf2: job 1 already exists \(undone on spine, leaf1\)"):
            t.create_job(topo.job(1))
        assert entries(t.switches["spine"], n.JOBS) == [] and entries(t.switches["leaf1"], n.WORKERS) == []
        assert t.switches["spine"].pool.free == n.POOL_SLOTS
        assert len(entries(t.switches["leaf2"], n.JOBS)) == 1  # its own job is untouched


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_mindp_ctl_topo_and_tree_commands(tree, tmp_path, capsys):
    topo, sws = tree
    path = tmp_path / "tree.json"
    topo.dump(path)
    t = ("--topology", str(path))
    code, out, err = run_cli(capsys, *t, "push")
    assert code == 0 and out.count("pushed the pipeline") == 3, err
    code, out, err = run_cli(capsys, *t, "jobs", "create", "--job-id", "1")
    assert code == 0 and [line.split(":")[0] for line in out.splitlines() if ": created job" in line] == \
        ["spine", "leaf1", "leaf2"], err
    code, out, err = run_cli(capsys, *t, "topo")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("spine  [") and "leaf1 (port 1 <-> its port 3)" in out
    assert "job 1 root: chunks 0..4 -> opt1_0, chunks 5..9 -> opt1_1" in out
    assert "job 1 leaf: child 1 of spine via port 3" in out and "0=leaf1@1 1=leaf2@2" in out
    assert "level 1 (leaf1, leaf2): job 1: 0 / 0 / 0 / 0 / 0" in out
    code, out, _ = run_cli(capsys, *t, "--json", "topo")
    data = json.loads(out)
    assert [s["name"] for s in data["switches"]] == ["spine", "leaf1", "leaf2"]
    assert [lv["switches"] for lv in data["levels"]] == [["spine"], ["leaf1", "leaf2"]]
    leaf1 = data["switches"][1]
    assert leaf1["jobs"][0]["child_id"] == 0 and leaf1["jobs"][0]["counters"]["grad_packets"] == 0
    assert {"port": 3, "link": "spine", "peer_port": 1} in leaf1["ports"]
    # Single-switch commands name their switch in a tree; without it, one line.
    code, _, err = run_cli(capsys, *t, "stats")
    assert code == 1 and "3 switches (spine, leaf1, leaf2): give --switch NAME" in err and len(err.splitlines()) == 1
    code, out, err = run_cli(capsys, *t, "--switch", "leaf2", "--json", "jobs", "show", "1")
    assert code == 0 and json.loads(out)["uplink"]["port"] == 3 and json.loads(out)["child_id"] == 1, err
    # cells reads the named switch over its own Thrift port (the topology's thrift_port, not 9090).
    code, out, err = run_cli(capsys, *t, "--switch", "leaf2", "--json", "cells", "1", "--all")
    assert code == 0 and json.loads(out)["workers"] == [2, 3] and len(json.loads(out)["cells"]) == 2 * 64, err
    code, out, err = run_cli(capsys, *t, "--switch", "leaf9", "stats")
    assert code == 1 and "unknown switch 'leaf9'" in err
    # A switch that is down is shown so; the rest is read.
    sws["leaf2"].stop()
    code, out, err = run_cli(capsys, *t, "--timeout", "1", "topo")
    assert code == 0 and "UNREACHABLE" in out.split("leaf2 (port 2")[1] and "job 1 leaf: child 0" in out, err
    code, out, err = run_cli(capsys, *t, "--timeout", "1", "jobs", "delete", "1")
    assert code == 1 and "switch leaf2" in err


def test_topo_on_a_single_switch(switch, topo, tmp_path, capsys):
    path = tmp_path / "t.json"
    topo = dataclasses.replace(topo, switches=(dataclasses.replace(topo.switch, grpc_addr=switch.addr),))
    topo.dump(path)
    code, _, err = run_cli(capsys, "--topology", str(path), "push")
    assert code == 0, err
    code, _, err = run_cli(capsys, "--topology", str(path), "jobs", "create", "--job-id", "2")
    assert code == 0, err
    code, out, err = run_cli(capsys, "--topology", str(path), "topo")
    assert code == 0, err
    assert out.splitlines()[0].startswith("s1  [") and "job 2 root: sums -> opt2 (port 7)" in out
    assert "per level" not in out  # one switch, one level


@pytest.mark.parametrize("target", ["embedded"])
def test_sharded_job_on_a_single_switch(target, tmp_path):
    """Shards need no tree: one switch routes each chunk range's sum to its node."""
    sw = Switch(target, tmp_path).start()
    try:
        d = leafspine(1, 2, 3, chunks=9).to_dict()
        d.pop("links")
        d["switch"] = {"name": "s1", "grpc_addr": sw.addr, "device_id": 0}
        d.pop("switches")
        d["hosts"] = {name: {**h, "port": i + 1} for i, (name, h) in enumerate(d["hosts"].items())}
        for h in d["hosts"].values():
            h.pop("switch")
        topo = Topology.from_dict(d)
        with Controller.for_topology(topo) as ctl:
            ctl.push()
            job = ctl.create_job(topo.job(1))
            assert [(s.lo, s.hi, s.node.host) for s in job.shards] == [(0, 2, "opt1_0"), (3, 5, "opt1_1"),
                                                                        (6, 8, "opt1_2")]
            assert len(entries(ctl, n.SHARDS)) == 3 and job.uplink is None
    finally:
        sw.stop()


