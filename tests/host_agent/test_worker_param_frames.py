"""PARAM frames of several chunks (docs/PROTOCOL.md): a worker on a real veth takes every chunk of
frames of 1 to PARAM_CHUNKS_MAX chunks on each of its receive paths (the socket's ring, recvmmsg,
recvmsg_into frame by frame, and the per-frame bytes paths of fault injection); a multi-chunk frame
of the wrong length, or of a short chunk, is counted once and dropped; a tagged one counted as
tagged; a forged one's chunks counted per chunk; other traffic of the host is no error."""
import socket
import struct

import numpy as np
import pytest

from host_agent import optim, rawsock
from host_agent.window import RtoConfig
from host_agent.worker import WorkerAgent, WorkerConfig, slot_and_version
from mindp import codec, progress
from mindp.harness import testbed
from mindp.protocol import PARAM_CHUNKS_MAX, K, Flag, Kind, param_frame_len
from mindp.topology import star

N = 11  # chunks: the last one short (count K - 5)
LAYOUT = optim.layout_of({"a": np.zeros(N * K - 5, np.float32)})


def value(chunk: int) -> float:
    return chunk + 0.25


def param(node: codec.Addresses, chunk: int, chunks: int, cfg: WorkerConfig, step: int = 0, more: int | None = None,
          count: int = K, flags: int = 0) -> bytes:
    """A PARAM frame of `chunks` chunks from `chunk` on, each chunk's elements value(chunk);
    `more` (default chunks - 1) and `count` as the header says, whatever it carries."""
    slot, ver = slot_and_version(step, [chunk], N, cfg.slots)
    hdr = codec.header_array(1, job=cfg.job_id, step=step, chunk=chunk, slot=slot, ver=ver, count=count, flags=flags,
                             more=chunks - 1 if more is None else more)
    vals = np.repeat([value(c) for c in range(chunk, chunk + chunks)], K).astype(np.float16)[None, :]
    return codec.encode(Kind.PARAM, hdr, vals, node, k=chunks * K)[0].tobytes()


def received(stats) -> dict:
    """The counters of frames received (progress: the ones of sending move while resends go)."""
    return {k: v for k, v in stats.items()
            if k.startswith("rejected_") or k in ("params_received", "duplicates", "future", "stale", "unsent")}


def tagged(frame: bytes, vid: int = 7) -> bytes:
    return frame[:12] + struct.pack("!HH", 0x8100, vid) + frame[12:]


@pytest.fixture(scope="module")
def bed():
    topo = star([1], slots=16)
    with testbed.Testbed("hpf-") as b:
        b.add(topo.host("w1_0"))
        yield b, topo


PATHS = ("ring", "recvmmsg", "plain", "bytes-ring", "bytes")


def force(path: str, monkeypatch) -> rawsock.Faults | None:
    """Make a new agent receive by `path`; the fault injection (none) that selects the bytes paths."""
    if path not in ("ring", "bytes-ring"):
        monkeypatch.setattr(rawsock, "RING", False)
    if path == "plain":
        monkeypatch.setattr(rawsock, "_MMSG", None)
        monkeypatch.setattr(rawsock, "MMSG", False)
    return rawsock.Faults() if path.startswith("bytes") else None


@pytest.mark.net
@pytest.mark.parametrize("path", PATHS)
def test_a_worker_takes_every_chunk_of_multi_chunk_frames(bed, monkeypatch, path):
    b, topo = bed
    faults = force(path, monkeypatch)
    cfg = WorkerConfig.from_topology(topo, 1, 0, rto=RtoConfig(initial=1.0, deadline=progress.STALL))
    sock = b.hosts["w1_0"].socket()
    rawsock.prepare(sock)
    agent = WorkerAgent(cfg, LAYOUT, sock, faults)
    assert (rawsock.ring_of(sock) is not None) == (path in ("ring", "bytes-ring"))
    assert (agent.receiver is None) == (path == "plain")
    switch = testbed.raw_socket(b.hosts["w1_0"].switch_iface)
    opt = topo.host("opt1")
    node = codec.Addresses(opt.mac, "ff:ff:ff:ff:ff:ff", opt.ip, "255.255.255.255")
    forger = codec.Addresses("02:00:00:00:00:66", "ff:ff:ff:ff:ff:ff", opt.ip, "255.255.255.255")
    st = agent.stats
    try:
        h = agent.start_step()
        h.put("a", np.ones(N * K - 5, np.float32))  # every chunk sent: each may be answered

        def settle(done, what):
            progress.wait(lambda: (h.pump(0.05), done())[1], lambda: received(st), stall=progress.STALL, what=what)

        bad = [tagged(param(node, 0, 4, cfg)),  # on another VLAN: tagged, once
               param(node, 0, 4, cfg, more=1),  # four chunks' length, two by its header: length, once
               param(node, 8, 3, cfg, more=3),  # three chunks' length, four by its header
               param(node, 9, 2, cfg, count=K - 5),  # a short chunk in a frame of several: length
               param(forger, 0, 2, cfg),  # forged: each of its chunks refused
               param(node, 0, 4, cfg, step=1),  # the next step's: each chunk counted, none taken
               b"\xff" * 12 + b"\x88\xb5" + b"\x00" * 100]  # the host's other traffic: no error
        for f in bad:
            switch.send(f)
        want = {"rejected_tagged": 1, "rejected_length": 3, "rejected_source": 2, "future": 4}
        settle(lambda: all(st[k] >= v for k, v in want.items()), "the refused frames")
        assert received(st) == want and h.window.n_done == 0
        # Chunks 0-1, 2-5, 6-8, then 9 and the short 10 one a frame, and chunks 2-5 again.
        good = [param(node, 0, 2, cfg), param(node, 2, PARAM_CHUNKS_MAX, cfg), param(node, 6, 3, cfg),
                param(node, 9, 1, cfg), param(node, 10, 1, cfg, count=K - 5),
                param(node, 2, PARAM_CHUNKS_MAX, cfg, flags=Flag.RETRANSMIT)]
        assert sorted({len(f) for f in good}) == [param_frame_len(c) for c in (1, 2, 3, 4)]
        for f in good:
            switch.send(f)
        settle(lambda: st["duplicates"] >= PARAM_CHUNKS_MAX, "the parameters")
        params = h.wait()
        assert params["a"].tobytes() == np.repeat([value(c) for c in range(N)], K)[: N * K - 5].astype(
            np.float16).tobytes()
        assert st["params_received"] == N and st["duplicates"] == PARAM_CHUNKS_MAX
        assert {k: v for k, v in st.items() if k.startswith("rejected_")} == {
            k: v for k, v in want.items() if k != "future"}
    finally:
        switch.close()
        sock.close()


def test_a_sharded_worker_takes_each_chunk_of_a_frame_from_its_owner_only():
    """A frame of four chunks across the shards' boundary from the first shard's node: its two
    chunks are taken, the second shard's two refused (each counted)."""
    nodes = [("02:00:00:00:00:0a", "10.0.0.10"), ("02:00:00:00:00:0b", "10.0.0.11")]
    cfg = WorkerConfig(1, 0, 16, "02:00:00:00:00:01", "10.0.0.1", *nodes[0],
                       rto=RtoConfig(initial=1.0, deadline=progress.STALL),
                       shards=((0, 5, *nodes[0]), (6, N - 1, *nodes[1])))
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with a, b:
        agent = WorkerAgent(cfg, LAYOUT, a)
        h = agent.start_step()
        h.put("a", np.ones(N * K - 5, np.float32))
        first, second = (codec.Addresses(mac, "ff:ff:ff:ff:ff:ff", ip, "255.255.255.255") for mac, ip in nodes)
        b.send(param(first, 4, 4, cfg))
        progress.wait(lambda: (h.pump(0.05), agent.stats["rejected_source"] >= 2)[1], lambda: received(agent.stats),
                      stall=progress.STALL, what="the frame")
        assert agent.stats["rejected_source"] == 2 and agent.stats["params_received"] == 2
        assert np.flatnonzero(h.window.done).tolist() == [4, 5]
        b.send(param(first, 0, 4, cfg))
        b.send(param(second, 6, 4, cfg))
        b.send(param(first, 10, 1, cfg, count=K - 5))  # the second shard's chunk from the first node
        b.send(param(second, 10, 1, cfg, count=K - 5))
        params = h.wait()
        assert params["a"].tobytes() == np.repeat([value(c) for c in range(N)], K)[: N * K - 5].astype(
            np.float16).tobytes()
        assert agent.stats["rejected_source"] == 3 and agent.stats["params_received"] == N

