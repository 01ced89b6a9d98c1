"""Worker agent I/O against bare raw-socket loops, side by side (one veth pair in namespaces).

- send: a whole step's gradients through WorkerAgent (fp16 rounding, chunking, encode, window,
  send) vs a bare loop sending the same number of ready-made frames of the same length;
- receive: a step's parameter frames taken by the agent (receive, tag and source checks,
  decode, window, reassembly) vs a bare loop receiving the same frames.

Run as root: .venv/bin/python bench/worker.py
"""
from __future__ import annotations

import os
import select
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

from host_agent import optim, rawsock  # noqa: E402
from host_agent.window import RtoConfig  # noqa: E402
from host_agent.worker import WorkerAgent, WorkerConfig, slot_and_version  # noqa: E402
from mindp import codec, testbed  # noqa: E402
from mindp.protocol import K, Kind  # noqa: E402
from mindp.topology import star  # noqa: E402

CHUNKS = 4096  # per step: fits the receive buffer, so nothing is dropped on the way in
ROUNDS = 5


def drain(s) -> int:
    n = 0
    while True:
        try:
            s.recv(4096)
            n += 1
        except BlockingIOError:
            return n


def main() -> int:
    if os.geteuid() != 0:
        print("bench/worker.py: needs root (network namespaces, raw sockets)", file=sys.stderr)
        return 1
    topo = star([1], slots=CHUNKS)
    cfg = WorkerConfig.from_topology(topo, 1, 0, rto=RtoConfig(initial=60.0, deadline=600.0))
    lay = optim.layout_of({"g": np.zeros(CHUNKS * K, np.float32)})
    grads = {"g": np.random.default_rng(0).standard_normal(CHUNKS * K).astype(np.float32)}
    opt = topo.host("opt1")
    node = codec.Addresses(opt.mac, "ff:ff:ff:ff:ff:ff", opt.ip, "255.255.255.255")
    with testbed.Testbed("bwk-") as bed:
        nh = bed.add(topo.host("w1_0"))
        sock = nh.socket()
        rawsock.prepare(sock)
        outer = testbed.raw_socket(nh.switch_iface)
        outer.setsockopt(1, 8, 64 << 20)  # SO_RCVBUF: hold a whole step of our sends
        agent = WorkerAgent(cfg, lay, sock)
        grad_frame = codec.encode(Kind.GRAD, codec.header_array(1), np.zeros((1, K), np.float16),
                                  agent.addrs)[0].tobytes()
        slot, ver = slot_and_version(0, np.arange(CHUNKS), CHUNKS, cfg.slots)
        params = [codec.encode(Kind.PARAM, codec.header_array(CHUNKS, job=1, step=step, chunk=np.arange(CHUNKS),
                                                              slot=slot, ver=slot_and_version(step, np.arange(CHUNKS),
                                                                                               CHUNKS, cfg.slots)[1]),
                               np.ones((CHUNKS, K), np.float16), node) for step in range(ROUNDS)]
        del slot, ver
        ours_send = bare_send = ours_recv = bare_recv = 0.0
        for r in range(ROUNDS):
            t = time.perf_counter()
            for _ in range(CHUNKS):
                sock.send(grad_frame)
            bare_send += time.perf_counter() - t
            drain(outer)

            t = time.perf_counter()
            h = agent.start_step()
            h.put("g", grads["g"])
            ours_send += time.perf_counter() - t
            assert agent.stats["sent"] == (r + 1) * CHUNKS
            drain(outer)

            frames = [f.tobytes() for f in params[r]]
            for f in frames:
                outer.send(f)
            t = time.perf_counter()
            got = 0
            while got < CHUNKS:
                select.select([sock], [], [], 1.0)
                got += len(rawsock.recv_batch(sock))
            bare_recv += time.perf_counter() - t

            for f in frames:
                outer.send(f)
            t = time.perf_counter()
            h.wait()
            ours_recv += time.perf_counter() - t
        outer.close()
        sock.close()
    n = CHUNKS * ROUNDS
    rows = [("send (fp16 + encode + window + send)", n / ours_send, n / bare_send),
            ("receive (checks + decode + window + reassembly)", n / ours_recv, n / bare_recv)]
    print(f"{'worker, frames/s':50s} {'agent':>10s} {'bare loop':>10s} {'ratio':>6s}")
    for name, ours, bare in rows:
        print(f"{name:50s} {ours:10.0f} {bare:10.0f} {ours / bare:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
