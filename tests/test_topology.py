"""Topology and job descriptions: round trip and one-line errors for bad data."""
import json

import pytest

from mindp.topology import Host, JobSpec, Topology, TopologyError, leafspine, star


def test_star_round_trips_through_json(tmp_path):
    topo = star([3, 2], slots=16)
    path = tmp_path / "topo.json"
    topo.dump(path)
    back = Topology.load(path)
    assert back == topo
    assert [j.n_workers for j in back.jobs] == [3, 2]
    assert len({h.port for h in back.hosts.values()}) == 7


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda d: d["hosts"]["w1_1"].update(mac=d["hosts"]["w1_0"]["mac"]), "share mac"),
        (lambda d: d["hosts"]["w1_1"].update(port=0), "port 0"),
        (lambda d: d["hosts"]["w1_1"].update(ip="10.0.0.300"), "bad IPv4"),
        (lambda d: d["hosts"]["w1_1"].update(mac="zz"), "bad MAC"),
        (lambda d: d["jobs"][0].update(optimizer="nobody"), "unknown host"),
        (lambda d: d["jobs"][0].update(job_id=64), "outside 0..63"),
        (lambda d: d["jobs"][0]["workers"].update({"40": "w1_0"}), "worker ids"),
        (lambda d: d["jobs"].append(dict(d["jobs"][0])), "used twice"),
        (lambda d: d["jobs"][0].pop("workers"), "malformed job"),
        (lambda d: d.pop("hosts"), "malformed topology"),
    ],
)
def test_bad_descriptions_raise_one_clear_error(mutate, message):
    d = json.loads(json.dumps(star([2]).to_dict()))
    mutate(d)
    with pytest.raises(TopologyError, match=message):
        Topology.from_dict(d)


def test_unreadable_file_is_a_topology_error(tmp_path):
    (tmp_path / "t.json").write_text("{not json")
    with pytest.raises(TopologyError, match="cannot read"):
        Topology.load(tmp_path / "t.json")
    with pytest.raises(TopologyError, match="no workers"):
        JobSpec.from_dict({"job_id": 1, "workers": {}, "optimizer": "o"})


def test_job_lookup_and_chunk_count_round_trip(tmp_path):
    topo = star([2, 1])
    assert topo.job(2).optimizer == "opt2"
    with pytest.raises(TopologyError, match=r"job 5 is not in the topology \(jobs: 1, 2\)"):
        topo.job(5)
    d = topo.to_dict()
    assert "chunks" not in d["jobs"][0]  # not known: absent
    d["jobs"][0]["chunks"] = 40
    back = Topology.from_dict(d)
    assert back.job(1).chunks == 40 and back.to_dict()["jobs"][0]["chunks"] == 40
    d["jobs"][0]["chunks"] = -1
    with pytest.raises(TopologyError, match="chunks must be 0"):
        Topology.from_dict(d)


@pytest.mark.parametrize("data,message", [
    ({"job_id": 1, "optimizer": "o"}, "'workers' missing"),
    ({"job_id": 1, "workers": {"0": "a"}}, "'optimizer' missing"),
    ({"job_id": "x", "workers": {"0": "a"}, "optimizer": "o"}, "invalid literal"),
])
def test_malformed_job_messages_name_the_field_without_python_reprs(data, message):
    with pytest.raises(TopologyError, match=message) as exc:
        JobSpec.from_dict(data)
    assert "KeyError" not in str(exc.value) and "ValueError(" not in str(exc.value)


# --- trees: switches, links, shards -------------------------------------------------


def test_single_switch_json_is_unchanged_in_form():
    d = star([2]).to_dict()
    assert set(d) == {"switch", "hosts", "jobs"} and set(d["switch"]) == {"name", "grpc_addr", "device_id"}
    assert all(set(h) == {"mac", "ip", "port"} for h in d["hosts"].values())
    topo = Topology.from_dict(d)
    assert topo.switch.name == "s1" and not topo.is_tree and topo.switch_of(topo.host("w1_0")) == "s1"


def test_leafspine_round_trips_and_places_hosts(tmp_path):
    topo = leafspine(2, 3, 2, chunks=11, grpc_port=9600, thrift_port=9700)
    topo.dump(tmp_path / "t.json")
    back = Topology.load(tmp_path / "t.json")
    assert back == topo and back.is_tree
    assert [(s.name, s.grpc_addr, s.device_id, s.thrift_port) for s in back.switches] == [
        ("spine", "127.0.0.1:9600", 0, 9700), ("leaf1", "127.0.0.1:9601", 1, 9701), ("leaf2", "127.0.0.1:9602", 2, 9702)]
    assert [h.name for h in back.hosts_on("leaf2")] == ["w1_3", "w1_4", "w1_5"]
    assert [(h.name, h.port) for h in back.hosts_on("spine")] == [("opt1_0", 3), ("opt1_1", 4)]
    assert back.neighbours("spine") == [(1, "leaf1", 4), (2, "leaf2", 4)]
    assert back.toward("leaf1", "spine") == 4 and back.toward("spine", "leaf2") == 2
    assert back.toward("leaf1", "leaf2") == 4 and back.toward("leaf1", "leaf1") == 0
    with pytest.raises(TopologyError, match="3 switches"):
        back.switch


def test_shard_ranges_are_contiguous_and_cover_every_chunk():
    for m, c in ((1, 7), (2, 11), (3, 3), (4, 160), (8, 9)):
        topo = leafspine(1, 1, m, chunks=c)
        ranges = topo.shard_ranges(1)
        assert len(ranges) == m and ranges[0][0] == 0 and ranges[-1][1] == c - 1
        assert all(b[0] == a[1] + 1 for a, b in zip(ranges, ranges[1:]))
        sizes = [hi - lo + 1 for lo, hi, _ in ranges]
        assert max(sizes) - min(sizes) <= 1
        assert [h for _, _, h in ranges] == list(topo.job(1).optimizers)
    single = star([2]).job(1)
    assert single.shard_ranges() == [(0, 2**32 - 1, "opt1")] and not single.sharded
    with pytest.raises(TopologyError, match='need "chunks" >= 2'):
        leafspine(1, 1, 2)


def test_branches_give_leaves_their_workers_and_the_spine_its_leaves():
    topo = leafspine(3, 2, 1)
    b = topo.branches(topo.job(1))
    assert sorted(b) == ["leaf1", "leaf2", "leaf3", "spine"]
    assert b["spine"].parent is None and b["spine"].workers == {}
    assert b["spine"].children == {0: ("leaf1", 1), 1: ("leaf2", 2), 2: ("leaf3", 3)}
    assert (b["leaf2"].parent, b["leaf2"].uplink_port, b["leaf2"].parent_port, b["leaf2"].child_id) == ("spine", 3, 2, 1)
    assert b["leaf3"].workers == {4: "w1_4", 5: "w1_5"}
    # A worker on the spine itself keeps its id there; the leaves take the ids it leaves free.
    d = topo.to_dict()
    d["hosts"]["wx"] = {"mac": "02:00:00:00:01:01", "ip": "10.0.1.1", "port": 9, "switch": "spine"}
    d["jobs"][0]["workers"]["0"] = "wx"
    d["jobs"][0]["workers"]["6"] = "w1_0"
    b = Topology.from_dict(d).branches(Topology.from_dict(d).job(1))
    assert b["spine"].workers == {0: "wx"} and sorted(b["spine"].children) == [1, 2, 3]
    # A leaf without workers of the job is not part of it.
    d = topo.to_dict()
    d["jobs"][0]["workers"] = {"0": "w1_0", "1": "w1_1"}
    assert sorted(Topology.from_dict(d).branches(Topology.from_dict(d).job(1))) == ["leaf1", "spine"]


def _tree() -> dict:
    return json.loads(json.dumps(leafspine(2, 2, 2, chunks=8).to_dict()))


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d["links"][0].update(b="nowhere"), "unknown switch 'nowhere'"),
    (lambda d: d["links"][0].update(a_port=1), "share port 1 of switch leaf1"),
    (lambda d: d["links"][1].update(b_port=0), "port 0 outside"),
    (lambda d: d["links"][1].update(b="leaf2"), "linked to itself"),
    (lambda d: d["links"].pop(), "must join the 3 switches in a tree"),
    (lambda d: d["links"].append({"a": "leaf1", "a_port": 9, "b": "leaf2", "b_port": 9}), "in a tree"),
    (lambda d: d["switches"][2].update(name="leaf1"), "switch name 'leaf1' used twice"),
    (lambda d: d["switches"][2].update(grpc_addr=d["switches"][0]["grpc_addr"]), "share grpc_addr"),
    (lambda d: d["switches"][1].update(thrift_port=9090), "share thrift_port"),
    (lambda d: d["switches"][1].update(name="leaf-1"), "switch name 'leaf-1'"),
    (lambda d: d["hosts"]["w1_0"].pop("switch"), 'no "switch"'),
    (lambda d: d["hosts"]["w1_0"].update(switch="s9"), "unknown switch 's9'"),
    (lambda d: d["hosts"]["w1_2"].update(switch="leaf1"), "share port 1 of switch leaf1"),
    (lambda d: d["hosts"]["opt1_1"].update(switch="leaf2", port=9), "different switches"),
    (lambda d: d["jobs"][0].update(optimizer=["opt1_0", "opt1_0"]), "listed twice"),
    (lambda d: d["jobs"][0].update(optimizer=[]), "1..8 optimizer nodes"),
    (lambda d: d["jobs"][0].update(chunks=1), 'need "chunks" >= 2'),
    (lambda d: d.update(switch={"name": "s1"}), "not both"),
    (lambda d: d["links"][0].pop("b_port"), "'b_port' missing"),
])
def test_bad_trees_raise_one_line_errors(mutate, message):
    d = _tree()
    mutate(d)
    with pytest.raises(TopologyError, match=message) as exc:
        Topology.from_dict(d)
    assert "\n" not in str(exc.value)


def test_hosts_added_without_a_switch_belong_to_the_single_switch():
    topo = star([1])
    topo.hosts["spare"] = Host("spare", "02:00:00:00:00:14", "10.0.0.20", 20)
    topo.check()
    assert [h.name for h in topo.hosts_on("s1")][-1] == "spare"
