"""Closed-loop load against a switch, for the benches: one sender host, one sink.

The sender carries both workers of a 2-worker job (one port keeps their frames
in order), so every second gradient frame completes a sum at the sink.
"""
from __future__ import annotations

import ipaddress
import time

import numpy as np

from host_agent import rawsock

from mindp import codec, mmsg
from mindp.protocol import K, Kind, frame_len
from mindp.readable import readable
from mindp.topology import Host


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
    and L2 forwarding from the sender (its source guard entry) to the sink."""
    from controller import p4info_names as N
    from controller.model import Entry

    return [
        Entry(N.L2_FORWARD, {N.MF_DST_MAC: sink.mac}, N.FORWARD, {"port": sink.port}),
        Entry(N.SOURCES, {N.MF_INGRESS_PORT: sender.port, N.MF_SRC_MAC: sender.mac, N.MF_SRC_IP: sender.ip}, N.ALLOW),
        Entry(N.JOBS, {N.MF_JOB: 1}, N.SET_JOB, {
            "slot_base": 0, "slot_count": 1024, "workers": 2, "optimizer_port": sink.port,
            "optimizer_mac": sink.mac, "optimizer_ip": sink.ip, "mcast_group": N.job_group(1), "epoch": 1,
            "chunks": 0, "uplink": 0, "child_id": 0}),
        *(Entry(N.WORKERS, {N.MF_INGRESS_PORT: sender.port, N.MF_JOB: 1, N.MF_WORKER: w}, N.ADMIT_WORKER)
          for w in (0, 1)),
    ]


def closed_loop(tx, rx, frames: list[bytes], per_output: int, window: int) -> tuple[float, int]:
    """Send with at most `window` frames in flight; returns (input packets/s, outputs received).

    Frames (all of one length) leave in bursts by sendmmsg and outputs come in by recvmmsg, so
    the load generator costs little next to the switch it measures. Stops after 1 s without
    output (lost frames): the rate counts what came through.
    """
    rows = np.frombuffer(b"".join(frames), np.uint8).reshape(len(frames), -1)
    inbox = _Inbox(rx, window)
    sent = received = 0
    expected = len(frames) // per_output
    t0 = last = time.perf_counter()
    while received < expected:
        room = min(window - (sent - received * per_output), len(frames) - sent)
        if room > 0:
            rawsock.send_rows(tx, rows, range(sent, sent + room))
            sent += room
        ready = readable([rx], 1.0)
        if not ready:
            break
        got = inbox.take()
        if got:
            received += got
            last = time.perf_counter()
    return received * per_output / max(last - t0, 1e-9), received


class _Inbox:
    """Counts the frames waiting on a socket, taking them a burst per system call."""

    WIDTH = 2048

    def __init__(self, sock, rows: int):
        self.sock = sock
        self.vec = mmsg.Vectors(np.zeros((max(rows, 1), self.WIDTH), np.uint8)) if mmsg.CALLS else None

    def take(self) -> int:
        got = 0
        if self.vec is None:
            while True:
                try:
                    self.sock.recv(self.WIDTH)
                except BlockingIOError:
                    return got
                got += 1
        n = len(self.vec.msgs)
        while True:
            k = self.vec.recv(self.sock.fileno(), 0, n)
            got += k
            if k < n:
                return got


def forward_loop(in_iface: str, out_iface: str, batch: int) -> None:
    """Forward every frame from `in_iface` to `out_iface`, `batch` frames per recvmmsg and one
    sendmmsg each: a switch doing nothing but its batched I/O, the ceiling of any switch here.
    Prints "ready" once listening; runs until killed."""
    a, b = rawsock.open_raw(in_iface), rawsock.open_raw(out_iface)
    vec = mmsg.Vectors(np.zeros((batch, _Inbox.WIDTH), np.uint8))
    lens = vec.iov["len"]
    print("ready", flush=True)
    while True:
        readable([a], None)
        n = vec.recv(a.fileno(), 0, batch)
        if n:
            lens[:n] = vec.msgs["len"][:n]
            mmsg.send(b.fileno(), vec.msgs[:n])
            lens[:n] = _Inbox.WIDTH
