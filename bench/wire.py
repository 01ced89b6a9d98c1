"""Wire codec figures, side by side in one run.

    python bench/wire.py [--elements N] [--scapy-packets N]

Prints the numpy codec's encode rate for a flat tensor of N fp16 elements
(packets/s and elements/s), Scapy building the same kind of packets, their
ratio, the codec's decode rate, and (as root) a bare raw AF_PACKET send loop on
a veth pair: the codec must outrun the socket so it is never the bottleneck.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from host_agent.agent_args import integer  # noqa: E402
from mindp import codec, layers  # noqa: E402
from mindp.protocol import K, Header, Kind  # noqa: E402
from mindp.harness.testbed import quiet_veths, sh  # noqa: E402

ADDRS = codec.Addresses("02:00:00:00:00:01", "02:00:00:00:00:02", "10.0.0.1", "10.0.0.2")


def best_of(fn, repeat=3):
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def raw_send_rate(frames: np.ndarray, seconds: float = 1.0) -> float | None:
    if os.geteuid() != 0:
        return None
    a, b = "bwire0", "bwire1"
    sh("ip", "link", "del", a, check=False)
    sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
    try:
        quiet_veths((a, None), (b, None))  # running: else the first frames meet the noop qdisc, cheap drops
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        s.bind((a, 0))
        bufs = [f.tobytes() for f in frames[:4096]]
        sent, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for buf in bufs:
                s.send(buf)
            sent += len(bufs)
        rate = sent / (time.perf_counter() - t0)
        s.close()
        return rate
    finally:
        sh("ip", "link", "del", a, check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=integer(K), default=10_000_000)
    ap.add_argument("--scapy-packets", type=integer(1), default=2000)
    args = ap.parse_args()

    flat = np.random.default_rng(0).standard_normal(args.elements).astype(np.float16)
    n = -(-flat.size // K)
    frames = None

    def enc():
        nonlocal frames
        frames = codec.encode_tensor(Kind.GRAD, flat, ADDRS, job=1, worker=0, step=0)

    t_codec = best_of(enc)
    m = args.scapy_packets
    chunks = flat[: m * K].reshape(m, K)

    def scapy_build():
        for i in range(m):
            bytes(layers.build_frame(Header(kind=Kind.GRAD, job=1, chunk=i), chunks[i], src_mac=ADDRS.src_mac,
                                     dst_mac=ADDRS.dst_mac, src_ip=ADDRS.src_ip, dst_ip=ADDRS.dst_ip))

    t_scapy = best_of(scapy_build, repeat=1)
    t_dec = best_of(lambda: codec.decode(frames, Kind.GRAD))
    codec_pps, scapy_pps = n / t_codec, m / t_scapy
    raw = raw_send_rate(frames)

    print(f"wire codec, K={K}, {args.elements:,} fp16 elements = {n:,} packets")
    print(f"  codec encode   {codec_pps:14,.0f} packets/s {codec_pps * K:16,.0f} elements/s")
    print(f"  scapy build    {scapy_pps:14,.0f} packets/s {scapy_pps * K:16,.0f} elements/s  ({m:,} packets)")
    print(f"  codec decode   {n / t_dec:14,.0f} packets/s {n / t_dec * K:16,.0f} elements/s")
    print(f"  ratio codec/scapy encode: {codec_pps / scapy_pps:,.0f}x")
    if raw is None:
        print("  raw AF_PACKET send: skipped (needs root)")
    else:
        print(f"  raw AF_PACKET send loop {raw:11,.0f} packets/s; ratio codec encode/raw send: {codec_pps / raw:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
