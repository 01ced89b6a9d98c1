"""Fuzz (issue 11, "Proof"): 10,000 malformed and hostile frames per target, each with the drop
reason (and counter row) it must be counted under; then the switch is alive and a valid round
still sums exactly. Nothing but the probes reaches any host, and the drop counters account for
every fuzz frame, reason by reason."""
from __future__ import annotations

import struct
from collections import Counter

import numpy as np
import pytest

from controller import p4info_names as N
from mindp import codec

from .fuzzer import STEP, Fuzzer
from .sums import complete_round
from .vlan_tags import stripped_by_kernel

pytestmark = pytest.mark.net

FRAMES = 10_000
WINDOW = 48  # fuzz frames between probes: under BMv2's 64-packet queues


def probe(fabric, src: str, dst: str, seq: int) -> bytes:
    """An ordinary IPv4 frame (protocol 253) that the switch forwards: it left after every earlier frame of `src`."""
    s, d = fabric.hosts[src], fabric.hosts[dst]
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + 8, seq & 0xFFFF, 0, 64, 253, 0,
                               bytes(map(int, s.ip.split("."))), bytes(map(int, d.ip.split(".")))))
    ip[10:12] = codec.ipv4_checksum(bytes(ip)).to_bytes(2, "big")
    return bytes.fromhex(d.mac.replace(":", "") + s.mac.replace(":", "")) + b"\x08\x00" + bytes(ip) + seq.to_bytes(8, "big")


def kernel_chatter(f: bytes) -> bool:
    """What the hosts' own kernels send: ARP, and ICMP (a probe's protocol unreachable). An ARP
    entry's unicast re-probe comes seconds after the probes that used it (5 s after its last use)."""
    return f[12:14] == b"\x08\x06" or (f[12:14] == b"\x08\x00" and f[23] == 1)


def drops_now(fabric) -> dict[int, int]:
    return {i: pkts for i, (pkts, _) in fabric.sw.read_counter(N.DROPS).items()}


def test_fuzz_frames_are_all_dropped_and_counted_then_a_round_sums_exactly(fabric, request):
    job1 = fabric.install_job(1, ["w1_0", "w1_1", "w1_2"], "opt1", slot_base=300, slots=4, epoch=0xF001, chunks=64)
    job2 = fabric.install_job(2, ["w2_0", "w2_1"], "opt2", slot_base=400, slots=4, epoch=0xF002)
    try:
        rng = np.random.default_rng(7)
        complete_round(fabric, job1, STEP, 0, rng)  # the job's newest completed step
        tags_restored = not stripped_by_kernel(fabric, (0x8100,))
        fz = Fuzzer(fabric, job1, job2, tags_restored)
        expected: Counter = Counter()
        before = drops_now(fabric)
        sent = 0
        dst_of = {"w1_0": "w2_0", "w1_1": "w2_0", "x": "w2_0", "w2_1": "w1_2", "opt1": "w2_0", "opt2": "w1_2"}
        while sent < FRAMES:
            senders = set()
            for _ in range(min(WINDOW, FRAMES - sent)):
                src, frame, row, reason = fz.frame()
                fabric.send(src, frame)
                expected[(row, N.DropReason[reason])] += 1
                senders.add(src)
                sent += 1
            probes = {src: probe(fabric, src, dst_of[src], sent) for src in senders}
            for src, p in probes.items():
                fabric.send(src, p)
            arrived = []
            for _ in range(20):  # until every probe is back (kernel frames count towards collect's n)
                got = fabric.collect(len(probes), grace=0.02)
                arrived += [f for frames in got.values() for f in frames]
                if set(probes.values()) <= set(arrived):
                    break
            # Besides the probes only the hosts' own kernels speak.
            others = [f for f in arrived if f not in probes.values() and not kernel_chatter(f)]
            assert set(probes.values()) <= set(arrived) and not others, f"after {sent} frames: a fuzz frame " \
                f"was forwarded or a probe was lost ({len(others)} foreign frames)"
        counted = Counter()
        for i, v in drops_now(fabric).items():
            if v - before.get(i, 0):
                counted[divmod(i, N.DROP_REASONS)] = v - before.get(i, 0)
        by_reason = Counter()
        for (row, reason), v in counted.items():
            by_reason[N.DropReason(reason).name] += v
        print(f"\nfuzz on {request.node.callspec.params.get('fabric')}: sent {sent}, counted {sum(counted.values())} "
              f"drops: " + ", ".join(f"{r} {v}" for r, v in sorted(by_reason.items())))
        assert sum(counted.values()) == sent
        assert {(r, int(c)): v for (r, c), v in expected.items()} == dict(counted)
        fabric.tap.accept = lambda f: not kernel_chatter(f)  # the probes' late ARP (seen in a loaded run)
        for chunk in range(4):  # alive, and aggregation is intact
            complete_round(fabric, job1, STEP + 1, chunk, rng, ver=1)
        complete_round(fabric, job2, 0, 2, rng)
    finally:
        fabric.tap.accept = None
        fabric.remove_job(job1)
        fabric.remove_job(job2)
        fabric.drain()
