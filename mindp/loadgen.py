"""Closed-loop load against a switch, for the benches: one sender host, one sink.

The sender carries both workers of a 2-worker job (one port keeps their frames
in order), so every second gradient frame completes a sum at the sink.
"""
from __future__ import annotations

import ipaddress
import select
import time

import numpy as np

from . import codec
from .protocol import K, Kind, frame_len
from .topology import Host


def gradient_frames(sender: Host, sink: Host, uses: int, k: int = K) -> list[bytes]:
    """2 * uses gradient frames: workers 0 and 1 for chunks 0, 1, ... of job 1 (1024 slots)."""
    rng = np.random.default_rng(0)
    n = 2 * uses
    chunk = np.repeat(np.arange(uses), 2)
    hdr = codec.header_array(n, job=1, worker=np.tile([0, 1], uses), step=0, chunk=chunk, slot=chunk % 1024,
                             ver=(chunk // 1024) & 1, count=k)
    elems = rng.standard_normal((n, k)).astype(np.float16)
    frames = codec.encode(Kind.GRAD, hdr, elems, codec.Addresses(sender.mac, sink.mac, sender.ip, sink.ip), k=k)
    return [f.tobytes() for f in frames]


def forward_frames(sender: Host, sink: Host, n: int, k: int = K) -> list[bytes]:
    """Plain IPv4 frames to the sink as long as a gradient frame (IP protocol 253, not our
    protocol: L2 forwarded; the switch drops EtherTypes other than ARP and IPv4)."""
    length = frame_len(Kind.GRAD, k)
    eth = bytes.fromhex(sink.mac.replace(":", "") + sender.mac.replace(":", "")) + b"\x08\x00"
    ip = bytearray(bytes([0x45, 0]) + (length - 14).to_bytes(2, "big") + bytes(4) + bytes([64, 253, 0, 0])
                   + ipaddress.IPv4Address(sender.ip).packed + ipaddress.IPv4Address(sink.ip).packed)
    ip[10:12] = codec.ipv4_checksum(bytes(ip)).to_bytes(2, "big")
    head = eth + bytes(ip)
    return [head + i.to_bytes(4, "big") + bytes(length - len(head) - 4) for i in range(n)]


def aggregation_entries(sender: Host, sink: Host) -> list:
    """Table entries for job 1 (2 workers behind the sender's port, the sink as optimizer node)
    and L2 forwarding to the sink."""
    from controller import p4info_names as N
    from controller.model import Entry

    return [
        Entry(N.L2_FORWARD, {N.MF_DST_MAC: sink.mac}, N.FORWARD, {"port": sink.port}),
        Entry(N.JOBS, {N.MF_JOB: 1}, N.SET_JOB, {
            "slot_base": 0, "slot_count": 1024, "workers": 2, "optimizer_port": sink.port,
            "optimizer_mac": sink.mac, "optimizer_ip": sink.ip, "mcast_group": N.job_group(1), "epoch": 1,
            "chunks": 0, "uplink": 0, "child_id": 0}),
        *(Entry(N.WORKERS, {N.MF_INGRESS_PORT: sender.port, N.MF_JOB: 1, N.MF_WORKER: w}, N.ADMIT) for w in (0, 1)),
    ]


def closed_loop(tx, rx, frames: list[bytes], per_output: int, window: int) -> tuple[float, int]:
    """Send with at most `window` frames in flight; returns (input packets/s, outputs received).

    Stops after 1 s without output (lost frames): the rate counts what came through.
    """
    sent = received = 0
    expected = len(frames) // per_output
    t0 = last = time.perf_counter()
    while received < expected:
        while sent < len(frames) and sent - received * per_output < window:
            tx.send(frames[sent])
            sent += 1
        ready, _, _ = select.select([rx], [], [], 1.0)
        if not ready:
            break
        while True:
            try:
                rx.recv(4096)
            except BlockingIOError:
                break
            received += 1
            last = time.perf_counter()
    return received * per_output / max(last - t0, 1e-9), received
