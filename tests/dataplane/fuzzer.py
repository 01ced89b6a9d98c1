"""The fuzz suite's frames: malformed and hostile frames, each with the (row, reason) the switch must
count its drop under."""
from __future__ import annotations

import struct

import numpy as np

from controller import p4info_names as N
from mindp import codec
from mindp.protocol import K, Kind
from mindp.switch_constants import STEP_WINDOW

from .fabric import random_fp16
from .vlan_tags import tagged

NO_JOB = N.NO_JOB_ROW
STEP = 10  # the job's newest completed step before the fuzz

# Field offsets in a mindp frame (Ethernet 14 + IPv4 20 + UDP 8 = 42, then the header).
IP_LEN, UDP_LEN_AT = 16, 38
FIELD = {"version": (42, 1), "kind": (43, 1), "ver": (45, 1), "job": (46, 2), "worker": (48, 2), "slot": (50, 2),
         "count": (52, 2), "step": (54, 4), "chunk": (58, 4)}


def patch(frame: bytes, **fields) -> bytes:
    b = bytearray(frame)
    for name, value in fields.items():
        off, width = (IP_LEN, 2) if name == "ip_len" else (UDP_LEN_AT, 2) if name == "udp_len" else FIELD[name]
        b[off:off + width] = int(value).to_bytes(width, "big")
    return bytes(b)


class Fuzzer:
    """Frames with the (row, reason) each must be dropped under."""

    def __init__(self, fabric, job1, job2, tags_restored: bool):
        self.f, self.j1, self.j2 = fabric, job1, job2
        self.rng = np.random.default_rng(2024)
        self.macs = {h.mac for h in fabric.hosts.values()} | {"ff:ff:ff:ff:ff:ff"}
        # Without tags restored, a kernel strips an outer 802.1Q/802.1ad tag before the embedded
        # switch sees the frame: then only stacks whose verdict survives that are sent.
        self.tag_stacks = [(0x88A8, 0x8100), (0x9100, 0x8100), (0x9100,), (0x9100, 0x8100, 0x8100)]
        if tags_restored:
            self.tag_stacks += [(0x8100,), (0x8100, 0x8100), (0x88A8, 0x8100, 0x8100)]

    def r(self, lo, hi):
        return int(self.rng.integers(lo, hi))

    def grad(self, job=None, worker=0, **kw):
        job = job or self.j1
        kw.setdefault("step", STEP + 1)
        kw.setdefault("chunk", self.r(0, 60))
        return self.f.grad(job, worker, random_fp16(self.rng), **kw)

    def unknown_mac(self) -> str:
        while True:
            b = self.rng.integers(0, 256, 6)
            b[0] &= 0xFE  # unicast
            mac = ":".join(f"{x:02x}" for x in b)
            if mac not in self.macs:
                return mac

    def random_frame(self, sender: str):
        """A frame that is not mindp, from `sender`: half of the ordinary ones with its own source
        addresses (to an unknown MAC: NO_ROUTE), the others with random ones (SPOOFED)."""
        dst = bytes.fromhex(self.unknown_mac().replace(":", ""))
        body = self.rng.integers(0, 256, self.r(0, 180), dtype=np.uint8).tobytes()
        own = self.f.hosts[sender]
        mac, ip4 = bytes.fromhex(own.mac.replace(":", "")), bytes(map(int, own.ip.split(".")))
        honest = self.r(0, 2) == 1
        choice = self.r(0, 10)
        if choice < 7:  # any EtherType the switch does not know
            while (etype := self.r(0, 0x10000)) in (0x0800, 0x0806, 0x8100, 0x88A8, 0x9100):
                pass
            return dst + body[:6].ljust(6, b"\0") + struct.pack("!H", etype) + body[6:], NO_JOB, "UNKNOWN_ETHERTYPE"
        if choice < 9:  # IPv4, not UDP: an ordinary frame to an unknown MAC, or cut short
            ip = bytearray(body[:20].ljust(20, b"\0"))
            ip[0], ip[9] = 0x45, 6
            if self.r(0, 4) == 0:  # the IPv4 header cut short
                return dst + bytes(6) + b"\x08\x00" + bytes(ip)[: self.r(0, 20)], NO_JOB, "MALFORMED"
            if honest:
                ip[12:16] = ip4
                return dst + mac + b"\x08\x00" + bytes(ip) + body[20:], NO_JOB, "NO_ROUTE"
            return dst + bytes(6) + b"\x08\x00" + bytes(ip) + body[20:], NO_JOB, "SPOOFED"
        arp = bytearray(body)  # ARP with random contents
        if honest and len(arp) >= 28:
            arp[8:14], arp[14:18] = mac, ip4  # sender MAC and IP
            return dst + mac + b"\x08\x06" + bytes(arp), NO_JOB, "NO_ROUTE"
        frame = dst + bytes(6) + b"\x08\x06" + bytes(arp)
        return frame, NO_JOB, "SPOOFED" if len(frame) >= 42 else "MALFORMED"

    def out_of_range(self):
        case = self.r(0, 14)
        g = self.grad()
        if case == 0:
            return patch(g, version=self.pick(0, 256, avoid={1})), 1, "BAD_VERSION"
        if case == 1:
            return patch(g, kind=self.pick(0, 256, avoid={1, 3, 4})), 1, "BAD_KIND"
        if case == 2:
            return patch(g, kind=int(Kind.PARAM)), 1, "NOT_MEMBER"  # parameters from a worker port
        if case == 3:
            return patch(g, count=self.pick(0, 1 << 16, avoid=set(range(1, K + 1)))), 1, "BAD_LENGTH"
        if case == 4:
            return patch(g, udp_len=self.pick(0, 1 << 16, avoid={8 + 24 + 2 * K})), 1, "BAD_LENGTH"
        if case == 5:
            return patch(g, ip_len=self.pick(0, 1 << 16, avoid={20 + 8 + 24 + 2 * K})), 1, "BAD_LENGTH"
        if case == 6:
            job = self.pick(3, N.MAX_JOBS, avoid=set())
            return patch(g, job=job), job, "UNKNOWN_JOB"
        if case == 7:
            return patch(g, job=self.r(N.MAX_JOBS, 1 << 16)), NO_JOB, "UNKNOWN_JOB"
        if case == 8:
            return patch(g, worker=self.r(1, 1 << 16)), 1, "NOT_MEMBER"  # sent from worker 0's port
        if case == 9:
            return patch(g, slot=self.r(self.j1.slots, 1 << 16)), 1, "BAD_SLOT"
        if case == 10:
            return patch(g, ver=self.r(2, 256)), 1, "BAD_SLOT"
        if case == 11:
            chunk = self.pick(64, 1 << 32, avoid=set())
            return patch(g, chunk=chunk, slot=chunk % self.j1.slots), 1, "BAD_CHUNK"
        if case == 12:
            return patch(g, step=self.r(STEP + STEP_WINDOW + 1, 1 << 32)), 1, "FUTURE_STEP"
        return patch(g, job=0), 0, "UNKNOWN_JOB"  # job 0 is not installed either

    def pick(self, lo, hi, avoid):
        while (v := self.r(lo, hi)) in avoid:
            pass
        return v

    def cut_or_padded(self):
        g = self.grad()
        if self.r(0, 2):
            n = self.r(14 + 20, len(g))  # cut inside IPv4 .. elements
            return g[:n], (1 if n >= 42 + 24 else NO_JOB), "MALFORMED"
        extra = self.rng.integers(0, 256, self.r(1, 300), dtype=np.uint8).tobytes()
        return g + extra, 1, "BAD_LENGTH"

    def tagged_frame(self):
        tags = self.tag_stacks[self.r(0, len(self.tag_stacks))]
        return tagged(self.grad(), *tags), (1 if len(tags) <= 2 else NO_JOB), "TAGGED"

    def spoofed(self):
        case = self.r(0, 4)
        if case == 0:
            return "w1_0", self.grad(worker=1), 1, "NOT_MEMBER"  # another worker's id from w1_0's port
        if case == 1:
            return "x", self.grad(worker=0, src="x"), 1, "NOT_MEMBER"  # a host in no job
        if case == 2:
            return "w1_0", self.grad(self.j2, 0, src="w1_0"), 2, "NOT_MEMBER"  # job 2 from job 1's port
        opt = self.f.hosts["opt1"]
        params = codec.encode_tensor(Kind.PARAM, random_fp16(self.rng), codec.Addresses(
            opt.mac, "ff:ff:ff:ff:ff:ff", opt.ip, "255.255.255.255"), job=2, step=STEP)[0].tobytes()
        return "opt1", params, 2, "NOT_MEMBER"  # job 1's optimizer node sending job 2's parameters

    def forged(self):
        src, opt = self.f.hosts["w1_1"], self.f.hosts["opt1"]
        if self.r(0, 2):
            sums = self.rng.integers(-(1 << 40), 1 << 40, K)
            frame = codec.encode_tensor(Kind.SUM, sums, codec.Addresses(src.mac, opt.mac, src.ip, opt.ip), job=1,
                                        worker=1, step=STEP, nworkers=3)[0].tobytes()
            return frame, 1, "BAD_KIND"  # a sum is never accepted from anyone
        frame = codec.encode_tensor(Kind.PARAM, random_fp16(self.rng), codec.Addresses(
            src.mac, "ff:ff:ff:ff:ff:ff", src.ip, "255.255.255.255"), job=1, step=STEP)[0].tobytes()
        return frame, 1, "NOT_MEMBER"

    def partial(self):
        """Partial sums (a child switch's kind): from no member, cut, padded, from a worker, fp16-sized."""
        case = self.r(0, 5)
        src = "x" if case == 0 else "w1_0"
        h, opt = self.f.hosts[src], self.f.hosts["opt1"]
        step = STEP + 1
        chunk = self.r(0, 60)
        sums = self.rng.integers(-(1 << 40), 1 << 40, K)
        p = codec.encode_tensor(Kind.PARTIAL, sums, codec.Addresses(h.mac, opt.mac, h.ip, opt.ip), first_chunk=chunk,
                                job=1, worker=0, step=step, slot=chunk % self.j1.slots, nworkers=2)[0].tobytes()
        if case == 0:
            return src, p, 1, "NOT_MEMBER"
        if case == 1:
            n = self.r(14 + 20, len(p))
            return src, p[:n], (1 if n >= 42 + 24 else NO_JOB), "MALFORMED"
        if case == 2:
            return src, p + bytes(self.r(1, 64)), 1, "BAD_LENGTH"
        if case == 3:
            return src, p, 1, "WRONG_ROLE"  # a worker's port: workers send gradients
        return src, patch(self.grad(), kind=int(Kind.PARTIAL)), 1, "MALFORMED"  # too short for int64 elements

    def frame(self):
        """(sending host, frame, row, reason)."""
        kind = self.r(0, 9)
        if kind == 8:
            return self.partial()
        if kind == 0:
            src = ["w1_0", "x", "w2_1", "opt2"][self.r(0, 4)]
            return (src, *self.random_frame(src))
        if kind in (1, 2):
            return ("w1_0", *self.out_of_range())
        if kind == 3:
            return ("w1_0", *self.cut_or_padded())
        if kind == 4:
            return ("w1_0", *self.tagged_frame())
        if kind == 5:
            return self.spoofed()
        return ("w1_1", *self.forged())
