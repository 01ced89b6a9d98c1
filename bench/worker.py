"""Worker agent I/O against bare raw-socket loops, side by side (one veth pair in namespaces).

- send: a whole step's gradients through WorkerAgent (fp16 rounding, chunking, encode, window,
  send) vs a bare loop sending the same number of ready-made frames of the same length;
- receive: a step's parameter frames taken by the agent (receive, tag and source checks, decode,
  window, reassembly) through its socket's PACKET_MMAP ring, and by a second agent through
  recvmmsg (the receive path before the ring: rawsock.RING off), each vs a bare loop receiving
  the same frames one recv at a time. The three sockets sit on one interface, so each gets its own
  copy of the same frames, sent before any of them reads; who reads first changes every round.
  A first round warms up untimed.

K is the process's (MINDP_K). Run as root: .venv/bin/python bench/worker.py [--rounds N]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

from host_agent import optim, rawsock  # noqa: E402
from host_agent.window import RtoConfig  # noqa: E402
from host_agent.worker import WorkerAgent, WorkerConfig, slot_and_version  # noqa: E402
from mindp import codec  # noqa: E402
from mindp.harness import testbed  # noqa: E402
from mindp.protocol import K, Kind  # noqa: E402
from mindp.readable import readable  # noqa: E402
from mindp.topology import star  # noqa: E402

#: Chunks per step: fit the agent's receive buffer (4,096 rows) and its ring, so nothing is dropped.
CHUNKS = min(4096, rawsock.ring_size()[1])


def drain(s) -> int:
    n = 0
    while True:
        try:
            s.recv(1 << 16)
            n += 1
        except BlockingIOError:
            return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=20, help="steps timed (default 20)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    if os.geteuid() != 0:
        print("bench/worker.py: needs root (network namespaces, raw sockets)", file=sys.stderr)
        return 1
    topo = star([1], slots=CHUNKS)
    # Without the streaming thread: put() and wait() do all the work in the timed thread (a thread
    # would send and receive in the background and leave the timer only its hand-offs).
    cfg = WorkerConfig.from_topology(topo, 1, 0, rto=RtoConfig(initial=60.0, deadline=600.0), stream=False)
    lay = optim.layout_of({"g": np.zeros(CHUNKS * K, np.float32)})
    grads = np.random.default_rng(0).standard_normal(CHUNKS * K).astype(np.float32)
    opt = topo.host("opt1")
    node = codec.Addresses(opt.mac, "ff:ff:ff:ff:ff:ff", opt.ip, "255.255.255.255")
    names = ("ring", "recvmmsg", "bare")
    took = dict.fromkeys(("send", "bare send", *names), 0.0)
    with testbed.Testbed("bwk-") as bed:
        nh = bed.add(topo.host("w1_0"))
        socks = {}
        for name in names:
            socks[name] = nh.socket()
            rawsock.prepare(socks[name])
        outer = testbed.raw_socket(nh.switch_iface)
        agents = {}
        for name in ("ring", "recvmmsg"):
            rawsock.RING = name == "ring"
            agents[name] = WorkerAgent(cfg, lay, socks[name])
        rawsock.RING = True
        if rawsock.ring_of(socks["ring"]) is None:
            print("bench/worker.py: no receive ring could be set up here", file=sys.stderr)
            return 1
        grad_frame = codec.encode(Kind.GRAD, codec.header_array(1), np.zeros((1, K), np.float16),
                                  agents["ring"].addrs)[0].tobytes()
        chunks = np.arange(CHUNKS)
        slot = slot_and_version(0, chunks, CHUNKS, cfg.slots)[0]
        for r in range(args.rounds + 1):  # round 0 warms up (first calls, caches) untimed
            if r == 1:
                took = dict.fromkeys(took, 0.0)
            t = time.perf_counter()
            for _ in range(CHUNKS):
                socks["bare"].send(grad_frame)
            took["bare send"] += time.perf_counter() - t
            drain(outer)
            handles = {}
            for name, agent in agents.items():
                t = time.perf_counter()
                handles[name] = agent.start_step()
                handles[name].put("g", grads)
                if name == "ring":
                    took["send"] += time.perf_counter() - t
                drain(outer)
            params = codec.encode(Kind.PARAM, codec.header_array(
                CHUNKS, job=1, step=r, chunk=chunks, slot=slot, ver=slot_and_version(r, chunks, CHUNKS, cfg.slots)[1]),
                np.ones((CHUNKS, K), np.float16), node)
            assert rawsock.send_rows(outer, params, range(CHUNKS)) == (CHUNKS, 0)
            for name in names[r % 3:] + names[: r % 3]:
                t = time.perf_counter()
                if name == "bare":
                    got = 0
                    while got < CHUNKS:
                        readable([socks[name]], 1.0)
                        got += len(rawsock.recv_batch(socks[name]))
                else:
                    handles[name].wait()
                took[name] += time.perf_counter() - t
        outer.close()
        for s in socks.values():
            s.close()
    n = CHUNKS * args.rounds
    rate = {k: n / v for k, v in took.items()}
    print(f"K = {K}, {CHUNKS} chunks a step, {args.rounds} steps; ring: {rawsock.ring_size()[1]} slots of "
          f"{rawsock.ring_size()[0]} B")
    print(f"{'worker, frames/s':52s} {'agent':>10s} {'bare loop':>10s} {'ratio':>6s}")
    rows = [("send (fp16 + encode + window + send)", rate["send"], rate["bare send"]),
            ("receive, ring (checks + decode + window + reassembly)", rate["ring"], rate["bare"]),
            ("receive, recvmmsg (the same)", rate["recvmmsg"], rate["bare"])]
    for name, ours, bare in rows:
        print(f"{name:52s} {ours:10.0f} {bare:10.0f} {ours / bare:6.2f}")
    print(f"receive through the ring / through recvmmsg: {rate['ring'] / rate['recvmmsg']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
