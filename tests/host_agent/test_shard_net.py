"""Sharded optimizer nodes as real processes (mindp-optimizer --shard I) on veths in namespaces, with
the job's workers: bit-identical to the reference, also when one shard is killed and restarted mid-run
and with a non-finite step (the shards agree over real UDP). The fabric is the real switch (the
embedded one always, BMv2 where installed; its shards table filled by the controller), and the
in-test aggregator taught the same routing (sum of chunk c to c's owner, PARAM admitted only from
c's owner, plain frames forwarded by MAC) with loss, duplicates and reordering; and a
leaf-spine of real switches with the shards on the spine."""
import contextlib
import random
import struct
import threading
import time

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from host_agent import optim, reference, state
from host_agent.optim import OptimizerConfig
from host_agent.shards import NOTICE_PORT
from mindp import codec, progress
from mindp.harness import testbed
from mindp.protocol import K, SHARD_NOTICE, SHARD_NOTICE_FORMAT, Kind
from mindp.topology import Host, JobSpec, Topology, host_addresses, leafspine
from mindp.harness.treebed import TreeBed

from tests.target_params import TARGET_PARAMS

from .aggregator import Aggregator
from .harness import STALL, AgentFabric, NodeProcess, Workers, load_stats, node_args
from .helpers import same_bits, small_model, with_nonfinite
from .shard_topology import sharded_topology

pytestmark = pytest.mark.net
N, M, STEPS = 2, 2, 4
CHUNKS = optim.layout_of(small_model()).n_chunks


class ShardAggregator(Aggregator):
    """The aggregator with the switch's shard routing; ARP, the shards' notices and the step digest
    are forwarded like ordinary L2 traffic (Aggregator._forward)."""

    def __init__(self, topo: Topology, ports, **faults):
        job = topo.jobs[0]
        self.shards = [(lo, hi, topo.host(h)) for lo, hi, h in topo.shard_ranges(job)]
        workers = {w: topo.host(n) for w, n in job.workers.items()}
        super().__init__(job.job_id, workers, self.shards[0][2], ports, **faults)
        self.node_ports = {h.port: h for _, _, h in self.shards}
        self.port_of_mac.update({bytes.fromhex(h.mac.replace(":", "")): p for p, h in self.node_ports.items()})
        self.stats.update(params_refused=0)

    def _owner(self, chunk: int) -> Host:
        return next(h for lo, hi, h in self.shards if lo <= chunk <= hi)

    def _grad(self, h, g) -> None:
        self.optimizer = self._owner(int(h["chunk"]))  # the shards table: this chunk's node
        super()._grad(h, g)

    def _from_port(self, port: int, frames: list[bytes]) -> None:
        if port not in self.node_ports:
            self._grads(frames, port)
            return
        for frame in frames:
            dec = codec.decode([frame], Kind.PARAM)
            if not len(dec.headers):
                continue
            if self._owner(int(dec.headers[0]["chunk"])).port == port:
                self._param(frame)
            else:
                self.stats["params_refused"] += 1


FABRICS = ["aggregator", *TARGET_PARAMS]


@contextlib.contextmanager
def fabric(kind, bed, tmp_path):
    """The switch (with the job installed by the controller) or the lossy aggregator; yields the
    aggregator or None."""
    if kind == "aggregator":
        with ShardAggregator(bed[1], bed[0].ports(), drop=0.03, dup=0.03, reorder=0.03, seed=4) as agg:
            yield agg
    else:
        with AgentFabric(kind, bed, tmp_path):
            yield None


@pytest.fixture(scope="module")
def bed():
    topo = sharded_topology(N, M, CHUNKS)
    with testbed.Testbed("hsh-") as b:
        for h in topo.hosts.values():
            b.add(h)
        yield b, topo


def run_sharded(bed, tmp_path, init, gf, steps, kill=None, seed=0, **worker_kw):
    """All shards (CLI processes) and workers to the last step; kill=(shard, step): that shard is
    killed (SIGKILL) a random moment after the workers finished `step`, and restarted. Returns the
    workers, each shard's stats and the shards' joined export."""
    b, topo = bed
    topo.dump(tmp_path / "topo.json")
    np.savez(tmp_path / "init.npz", **init)
    args = [node_args(tmp_path / "topo.json", tmp_path / f"state{i}", tmp_path / "init.npz", steps,
                      tmp_path / f"final{i}.npz", tmp_path / f"stats{i}.json") + ["--shard", str(i)]
            for i in range(M)]
    names = topo.jobs[0].optimizers
    nodes = [NodeProcess(b.hosts[names[i]], args[i], tmp_path / f"node{i}.log").start() for i in range(M)]
    try:
        workers = Workers(b, topo, init, gf, steps, **worker_kw).start()
        if kill:
            i, step = kill
            workers.wait_step(step)
            time.sleep(random.Random(seed).uniform(0, 0.06))
            nodes[i].kill()
            time.sleep(0.3)
            nodes[i] = NodeProcess(b.hosts[names[i]], args[i], tmp_path / f"node{i}.log").start()
            assert "resuming after step" in nodes[i].banner
        workers.join()
        for node in nodes:
            assert node.finish() == 0
    finally:
        for node in nodes:
            node.stop()
    stats = [load_stats(tmp_path / f"stats{i}.json") for i in range(M)]
    master = state.join_exports([tmp_path / f"final{i}.npz" for i in range(M)], optim.layout_of(init))
    return workers, stats, master


@pytest.mark.parametrize("kind", FABRICS)
@pytest.mark.parametrize("kill", [None, (1, 2)], ids=["clean", "shard-killed"])
def test_sharded_nodes_train_to_reference_bits(bed, tmp_path, kill, kind):
    b, topo = bed
    init = small_model()
    gf = reference.synthetic_grads(31)
    ref = reference.train(init, gf, N, STEPS, OptimizerConfig())
    with fabric(kind, bed, tmp_path) as agg:
        workers, stats, master = run_sharded(bed, tmp_path, init, gf, STEPS, kill=kill, seed=7)
    for w, params in workers.results.items():
        assert same_bits(params, ref.params), f"worker {w} differs from the reference"
    assert same_bits(master, ref.master)
    ranges = topo.shard_ranges(topo.jobs[0])
    for (lo, hi, _), st in zip(ranges, stats):
        assert st["committed"] == STEPS - 1
        if kill is None:  # each shard applied exactly its own range, once per step
            assert st["applied"] == STEPS * (hi - lo + 1) and st.get("rejected_chunk", 0) == 0
    if kill:
        assert stats[0]["applied"] == STEPS * (ranges[0][1] + 1)  # the other shard never noticed
    if agg:
        assert agg.stats["params_refused"] == 0


@pytest.mark.parametrize("kind", FABRICS)
def test_nonfinite_step_is_skipped_by_every_shard_through_processes(bed, tmp_path, kind):
    b, topo = bed
    init = small_model()
    lay = optim.layout_of(init)
    lo1 = topo.shard_ranges(topo.jobs[0])[1][0]
    index = max(lo1 * K, lay.offsets["w"]) - lay.offsets["w"]  # shard 1's first element in tensor "w"
    chunk = (lay.offsets["w"] + index) // K
    assert index < next(s.size for s in lay.specs if s.name == "w") and chunk >= lo1
    gf = with_nonfinite(reference.synthetic_grads(32), 1, 2, "w", index)
    ref = reference.train(init, gf, N, STEPS, OptimizerConfig())
    assert [c for _, c in ref.nonfinite] == [chunk]
    with fabric(kind, bed, tmp_path) as agg:
        workers, stats, master = run_sharded(bed, tmp_path, init, gf, STEPS)
    for w, params in workers.results.items():
        assert same_bits(params, ref.params), f"worker {w} differs from the reference"
        assert [s for s, _ in workers.agents[w].nonfinite_log] == [2]
    assert same_bits(master, ref.master)
    assert [st["nonfinite_steps"] for st in stats] == [1, 1]
    assert stats[1]["notices"] == 1 and stats[0]["notices_acked"] >= 1
    if agg:
        assert agg.stats["forwarded"] > 0


@pytest.mark.parametrize("target", TARGET_PARAMS)
def test_sharded_nodes_behind_a_leaf_spine_with_a_shard_killed(tmp_path, target):
    """Two leaves (one worker each) under a spine with the two shards: the leaves' partial sums
    are completed at the spine and routed to the shard owning each chunk; shard 1 is killed and
    restarted mid-run; reference bits."""
    topo = leafspine(2, 1, M, chunks=CHUNKS, slots=8)
    init = small_model()
    gf = reference.synthetic_grads(33)
    ref = reference.train(init, gf, 2, STEPS, OptimizerConfig())
    with TreeBed(topo, target, tmp_path, "hst") as tree:
        workers, stats, master = run_sharded((tree.bed, tree.topo), tmp_path, init, gf, STEPS, kill=(1, 1), seed=3)
    for w, params in workers.results.items():
        assert same_bits(params, ref.params), f"worker {w} differs from the reference"
    assert same_bits(master, ref.master)
    lo1 = tree.topo.shard_ranges(tree.topo.jobs[0])[1][0]
    assert stats[0]["applied"] == STEPS * lo1 and stats[0].get("rejected_chunk", 0) == 0


def forged_notices(topo: Topology, sender: str, steps: int) -> list[bytes]:
    """NOTICEs (job 1, every step) from host `sender` to each shard node, posing as the other
    shard: its source IP with the sender's MAC, and with the other shard's MAC too. A shard that
    took one would skip that step (NodeCore.skip_step), and the run would leave the reference."""
    me = topo.host(sender)
    nodes = [topo.host(h) for h in topo.jobs[0].optimizers]
    out = []
    for dst, peer in zip(nodes, nodes[::-1]):
        for mac in (me.mac, peer.mac):
            for step in range(steps):
                out.append(bytes(Ether(src=mac, dst=dst.mac) / IP(src=peer.ip, dst=dst.ip)
                                 / UDP(sport=NOTICE_PORT, dport=NOTICE_PORT)
                                 / struct.pack(SHARD_NOTICE_FORMAT, SHARD_NOTICE, 1, step)))
    return out


def spoofed_when_settled(fab, sent: int) -> int:
    """The switch's SPOOFED count (no-job row) once it reached `sent`: the last frames may still be
    queued in the switch when the run ends."""
    def count() -> int:
        return fab.ctl.stats([]).no_job.drops.get("SPOOFED", 0)

    progress.wait(lambda: count() >= sent, count, stall=STALL, what="the forged frames counted")
    return count()


@pytest.mark.parametrize("target", TARGET_PARAMS)
def test_forged_shard_notices_from_another_jobs_worker_are_dropped(tmp_path, target):
    """While job 1 trains on two shards, a worker of job 2 on the same switch keeps sending the
    shards NOTICEs with the other shard's address. The source guard drops every one (SPOOFED) and
    the job ends bit-identical to the reference, no step skipped."""
    topo = sharded_topology(N, M, CHUNKS)
    hosts = dict(topo.hosts)
    for i, name in enumerate(("w2_0", "opt2"), start=N + M + 1):
        hosts[name] = Host(name, *host_addresses(i), i)
    topo = Topology(topo.switches, hosts, [topo.jobs[0], JobSpec(2, {0: "w2_0"}, "opt2", 8)])
    topo.check()
    init = small_model()
    gf = reference.synthetic_grads(34)
    ref = reference.train(init, gf, N, STEPS, OptimizerConfig())
    frames = forged_notices(topo, "w2_0", STEPS)
    sent = 0
    with testbed.Testbed("hsf-") as b:
        for h in topo.hosts.values():
            b.add(h)
        with AgentFabric(target, (b, topo), tmp_path) as fab:
            fab.ctl.create_job(topo.jobs[1])
            stop = threading.Event()
            sock = b.hosts["w2_0"].socket()

            def forge():
                nonlocal sent
                while not stop.wait(0.05):
                    for f in frames:
                        sock.send(f)
                        sent += 1

            forger = threading.Thread(target=forge, daemon=True)
            forger.start()
            try:
                workers, stats, master = run_sharded((b, topo), tmp_path, init, gf, STEPS)
            finally:
                stop.set()
                forger.join()
                sock.close()
            spoofed = spoofed_when_settled(fab, sent)
    for w, params in workers.results.items():
        assert same_bits(params, ref.params), f"worker {w} differs from the reference"
    assert same_bits(master, ref.master)
    for st in stats:
        assert (st.get("nonfinite_steps", 0), st.get("notices_acked", 0), st.get("notice_rejected", 0)) == (0, 0, 0)
    assert sent > 0 and spoofed == sent

