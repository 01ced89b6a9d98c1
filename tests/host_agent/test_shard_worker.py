"""A worker of a sharded job takes the parameters of chunk c only from the node owning c: forged
answers from the other shard (sent first, with other values) are refused and counted."""
import socket
import threading

import numpy as np

from host_agent import optim, shards
from host_agent.window import RtoConfig
from host_agent.worker import WorkerAgent, WorkerConfig
from mindp import codec
from mindp.protocol import Kind, frame_len
from mindp.topology import Host, JobSpec, SwitchSpec, Topology

from .helpers import small_model

NODES = [("02:00:00:00:00:0a", "10.0.0.10"), ("02:00:00:00:00:0b", "10.0.0.11")]


class ShardEcho(threading.Thread):
    """Answers each GRAD with PARAM = 2 * gradient from the owning shard's address, after a forged
    PARAM = -1 * gradient from the other shard's address."""

    def __init__(self, sock, split: int):
        super().__init__(daemon=True)
        self.sock, self.split = sock, split
        self.stop = False
        self.forged = 0

    def run(self):
        self.sock.settimeout(0.05)
        while not self.stop:
            try:
                frame = self.sock.recv(frame_len(Kind.GRAD))
            except socket.timeout:
                continue
            h, g = codec.decode_one(frame, Kind.GRAD)
            owner = int(h["chunk"] > self.split)
            for node, scale in ((1 - owner, -1), (owner, 2)):
                mac, ip = NODES[node]
                addrs = codec.Addresses(mac, "ff:ff:ff:ff:ff:ff", ip, "255.255.255.255")
                vals = (g.astype(np.float32) * scale).astype(np.float16)[None, :]
                self.sock.send(codec.encode(Kind.PARAM, np.array([h]), vals, addrs)[0].tobytes())
            self.forged += 1


def test_params_only_from_the_shard_owning_the_chunk():
    init = small_model()
    lay = optim.layout_of(init)
    split = lay.n_chunks // 2 - 1
    cfg = WorkerConfig(1, 0, 4, "02:00:00:00:00:01", "10.0.0.1", *NODES[0],
                       rto=RtoConfig(initial=0.05, min=0.01, deadline=5.0),
                       shards=((0, split, *NODES[0]), (split + 1, lay.n_chunks - 1, *NODES[1])))
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    echo = ShardEcho(b, split)
    echo.start()
    try:
        agent = WorkerAgent(cfg, lay, a)
        grads = {n: np.full(v.shape, 0.25, np.float32) for n, v in init.items()}
        params = agent.push(grads)
    finally:
        echo.stop = True
        echo.join()
        a.close()
        b.close()
    assert all(np.all(p == np.float16(0.5)) for p in params.values())
    assert agent.stats["rejected_source"] == echo.forged >= lay.n_chunks


def test_worker_config_takes_the_shards_from_the_topology():
    hosts = {n: Host(n, f"02:00:00:00:00:0{i}", f"10.0.0.{i}", i) for i, n in enumerate(["w0", "o1", "o2"], 1)}
    topo = Topology((SwitchSpec(),), hosts, [JobSpec(1, {0: "w0"}, ("o1", "o2"), slots=4, chunks=9)])
    topo.check()
    cfg = WorkerConfig.from_topology(topo, 1, 0)
    assert cfg.shards == ((0, 3, hosts["o1"].mac, hosts["o1"].ip), (4, 8, hosts["o2"].mac, hosts["o2"].ip))
    assert (cfg.optimizer_mac, cfg.optimizer_ip) == (hosts["o1"].mac, hosts["o1"].ip)
    src = shards.ParamSources(list(cfg.shards))
    assert src.owner(np.array([0, 3, 4, 8])).tolist() == [0, 0, 1, 1]
