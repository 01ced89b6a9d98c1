"""The source guard (issue 30): an ordinary frame is forwarded only from a host known behind its
ingress port, with that host's MAC and IPv4 address (ARP: the Ethernet source, the sender MAC and
the sender IP). Anything else is dropped and counted SPOOFED; mindp frames are admission's."""
import struct

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether

from mindp.fixedpoint import exact_sum
from mindp.protocol import SHARD_NOTICE, SHARD_NOTICE_FORMAT, SHARD_NOTICE_PORT, K

from .sums import only_sums_at

pytestmark = pytest.mark.net


def ipv4(src_mac, src_ip, dst, dst_ip: str | None = None) -> bytes:
    return bytes(Ether(src=src_mac, dst=dst.mac) / IP(src=src_ip, dst=dst_ip or dst.ip, proto=253) / (b"s" * 40))


def arp(eth_src, sha, spa, op=2) -> bytes:
    """A broadcast ARP (a gratuitous reply by default: no host answers it)."""
    return bytes(Ether(src=eth_src, dst="ff:ff:ff:ff:ff:ff") / ARP(op=op, hwsrc=sha, psrc=spa, hwdst=sha, pdst=spa))


def assert_dropped_as_spoofed(fabric, frames: list[tuple[str, bytes]]) -> None:
    before = fabric.drops("SPOOFED")
    for host, frame in frames:
        fabric.send(host, frame)
    assert not any(fabric.collect(0).values()), "a forged frame was forwarded"
    assert fabric.drops("SPOOFED") == before + len(frames)


def test_forged_arp_is_dropped_and_counted(fabric):
    me, other = fabric.hosts["w1_0"], fabric.hosts["opt1"]
    assert_dropped_as_spoofed(fabric, [
        ("w1_0", arp(me.mac, me.mac, other.ip)),  # my MAC for the node's IP: poisoning
        ("w1_0", arp(me.mac, other.mac, other.ip)),  # the node's sender MAC inside my frame
        ("w1_0", arp(me.mac, other.mac, me.ip)),  # sender MAC not the frame's
        ("w1_0", arp(other.mac, other.mac, other.ip)),  # the node, wholly, but from my port
        ("w1_0", arp(me.mac, me.mac, "10.0.0.200", op=1)),  # a request from an address nobody has
        ("x", arp(me.mac, me.mac, me.ip)),  # w1_0 itself, from x's port
    ])


def test_forged_ipv4_is_dropped_and_counted(fabric):
    me, other, dst = fabric.hosts["w1_1"], fabric.hosts["opt2"], fabric.hosts["w2_0"]
    assert_dropped_as_spoofed(fabric, [
        ("w1_1", ipv4(me.mac, other.ip, dst)),  # wrong source IP
        ("w1_1", ipv4(other.mac, me.ip, dst)),  # wrong source MAC
        ("w1_1", ipv4(other.mac, other.ip, dst)),  # another host, from my port
        ("w1_1", ipv4("02:00:00:00:aa:01", "10.9.9.9", dst)),  # nobody
        ("w1_1", ipv4(me.mac, "0.0.0.0", dst)),
        ("w1_1", bytes(Ether(src=me.mac, dst="ff:ff:ff:ff:ff:ff") / IP(src=other.ip, dst="255.255.255.255")
                       / UDP(sport=9, dport=9) / b"broadcast")),
    ])


def test_a_forged_shard_notice_reaches_no_node(fabric):
    """The shards' NOTICE (plain UDP between optimizer nodes) sent by a worker of another job with
    a node's source address: the receiving node would skip a step on it."""
    node, peer = fabric.hosts["opt1"], fabric.hosts["opt2"]
    me = fabric.hosts["w2_0"]
    notice = struct.pack(SHARD_NOTICE_FORMAT, SHARD_NOTICE, 1, 3)
    forged = [Ether(src=me.mac, dst=node.mac) / IP(src=peer.ip, dst=node.ip),
              Ether(src=peer.mac, dst=node.mac) / IP(src=peer.ip, dst=node.ip)]
    assert_dropped_as_spoofed(fabric, [
        ("w2_0", bytes(f / UDP(sport=SHARD_NOTICE_PORT, dport=SHARD_NOTICE_PORT) / notice)) for f in forged])


def test_mindp_frames_are_judged_by_admission_not_the_source_guard(fabric, job1):
    """Gradients with the node's source MAC and an IP nobody has: admission judges mindp frames by
    (port, job, worker); the guard never sees them."""
    rng = np.random.default_rng(30)
    grads = [rng.standard_normal(K).astype(np.float16) for _ in job1.workers]
    before = fabric.drops("SPOOFED")
    opt = fabric.hosts["opt1"]
    for w, g in enumerate(grads):
        frame = bytearray(fabric.grad(job1, w, g, step=0, chunk=1))
        frame[26:30] = bytes([10, 0, 0, 200])  # the switch checks no IPv4 checksum
        frame[6:12] = bytes.fromhex(opt.mac.replace(":", ""))
        fabric.send(job1.workers[w], bytes(frame))
    dec = only_sums_at(fabric, fabric.collect(1), "opt1", 1)
    assert np.array_equal(dec.elements[0], exact_sum(grads)[0])
    assert fabric.drops("SPOOFED") == before


def test_each_hosts_own_traffic_is_forwarded(fabric):
    """Every host's own ARP and IPv4 (x too, in no job) pass. Last in the module: the frames are
    addressed so that no kernel answers (an IPv4 address nobody has, gratuitous ARP replies)."""
    before = fabric.drops("SPOOFED")
    for name, h in fabric.hosts.items():
        dst = fabric.hosts["w1_0" if name != "w1_0" else "opt1"]
        frame = ipv4(h.mac, h.ip, dst, "10.0.0.250")
        fabric.send(name, frame)
        got = fabric.collect(1)
        assert frame in got[dst.name], f"{name}'s own frame was not forwarded"
        g = arp(h.mac, h.mac, h.ip)
        fabric.send(name, g)
        got = fabric.collect(len(fabric.hosts) - 1)
        assert all(g in got[o] for o in fabric.hosts if o != name), f"{name}'s own ARP was not flooded"
    assert fabric.drops("SPOOFED") == before
    fabric.drain()
