"""Topology and job descriptions: round trip and one-line errors for bad data."""
import json

import pytest

from mindp.topology import JobSpec, Topology, TopologyError, star


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
