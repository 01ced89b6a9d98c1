"""The Mininet topology is built from mindp.topology data: same hosts, MACs, IPs and switch ports."""
from mindp import topology
from mininet_topos import net


def test_mininet_topology_follows_the_data_for_two_jobs():
    data = topology.star([2, 2])
    topo = net.DataTopo(data, prefix="mnq-")
    assert sorted(topo.hosts()) == sorted(data.hosts) and topo.switches() == ["s1"]
    for name, host in data.hosts.items():
        info = topo.nodeInfo(name)
        assert info["mac"] == host.mac and info["ip"] == f"{host.ip}/16"
        (link,) = [topo.linkInfo(a, b) for a, b in topo.links() if name in (a, b)]
        assert link["port2"] == host.port and link["intfName2"] == f"mnq-p{host.port}"
        assert link["intfName1"] == "eth0"
    assert net.interfaces(data, "mnq-") == [f"mnq-p{p}" for p in range(1, 7)]
    # Job 2's workers and optimizer sit on ports after job 1's.
    assert [data.host(h).port for h in ("w1_0", "w1_1", "opt1", "w2_0", "w2_1", "opt2")] == [1, 2, 3, 4, 5, 6]
