"""The sharded job's topology: one switch, its workers and the optimizer node's shards each on a port."""
from mindp.topology import Host, JobSpec, SwitchSpec, Topology, host_addresses


def sharded_topology(n_workers: int, m: int, chunks: int, slots: int = 8) -> Topology:
    """One switch: workers w1_0.. on ports 1..n, shards opt1_0.. on the next m ports."""
    hosts = {}
    for port in range(1, n_workers + m + 1):
        name = f"w1_{port - 1}" if port <= n_workers else f"opt1_{port - n_workers - 1}"
        hosts[name] = Host(name, *host_addresses(port), port)
    job = JobSpec(1, {i: f"w1_{i}" for i in range(n_workers)}, tuple(f"opt1_{i}" for i in range(m)), slots, chunks)
    topo = Topology((SwitchSpec(),), hosts, [job])
    topo.check()
    return topo
