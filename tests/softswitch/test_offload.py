"""What a host's link offloads leave to the embedded switch (mindp/vnet.py), on veth pairs into
network namespaces: a super-frame from a host whose link has UDP segmentation offload on reaches
the switch whole and leaves it as the frames the host's kernel makes of it on a link without
offloads, byte for byte, by the Python and by the C packet loop; a partial checksum is completed as
that kernel completes it; a super-frame is never taken in part."""
import socket
import struct
import time

import numpy as np
import pytest

from mindp import progress, targets, vnet
from mindp.harness import testbed
from mindp.topology import Host
from softswitch.batch import SLOT, Batch
from softswitch.dataplane import DataPlane
from softswitch.ports import Port

from .payloads import body

pytestmark = pytest.mark.net

H1 = Host("h1", "02:00:00:00:00:01", "10.9.0.1", 1)  # its link's offloads on: the switch cuts
H2 = Host("h2", "02:00:00:00:00:02", "10.9.0.2", 2)  # offloads off: its kernel cuts
PACKET_OUTGOING = 4
SEG = 1000


def ipv4_udp(payload: bytes, ident: int = 0x1234) -> bytes:
    """An Ethernet/IPv4/UDP frame with `payload`, its UDP checksum left zero."""
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28 + len(payload), ident, 0x4000, 64, socket.IPPROTO_UDP, 0,
                     bytes([10, 9, 0, 1]), bytes([10, 9, 0, 2]))
    ip = ip[:10] + struct.pack("!H", vnet._fold_complement(vnet.ones_sum(np.frombuffer(ip, np.uint8)))) + ip[12:]
    return (bytes.fromhex("020000000002" "020000000001" "0800") + ip
            + struct.pack("!HHHH", 4000, 5000, 8 + len(payload), 0) + payload)


def pseudo_seed(frame: bytes) -> bytes:
    """`frame` with its UDP checksum field holding the pseudo-header's sum (what a partial checksum
    carries)."""
    udp_len = len(frame) - 34
    pseudo = frame[26:34] + struct.pack("!BBH", 0, socket.IPPROTO_UDP, udp_len)
    return frame[:40] + struct.pack("!H", vnet.ones_sum(np.frombuffer(pseudo, np.uint8))) + frame[42:]


def vnet_sender(netns: str) -> socket.socket:
    with testbed.in_netns(netns):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        s.setsockopt(vnet.SOL_PACKET, vnet.PACKET_VNET_HDR, 1)
        s.bind(("eth0", 0))
    return s


def send_super(s: socket.socket, payload: bytes, seg: int = SEG) -> None:
    """One UDP super-frame of `payload` in seg-byte frames, as host_agent/udpgso.py sends them."""
    s.sendmsg([vnet.VNET_HDR.pack(vnet.F_NEEDS_CSUM, vnet.GSO_UDP_L4, 42, seg, 34, 6), pseudo_seed(ipv4_udp(payload))])


def send_partial(s: socket.socket, payload: bytes) -> None:
    """One frame whose UDP checksum the link is asked to complete, as a host's kernel sends it."""
    s.sendmsg([vnet.VNET_HDR.pack(vnet.F_NEEDS_CSUM, vnet.GSO_NONE, 0, 0, 34, 6), pseudo_seed(ipv4_udp(payload))])


def offload_on(h: testbed.NetHost) -> None:
    """The host's link as make run leaves it on the embedded switch (mininet_topos/net.quiet_host)."""
    for group in vnet.HOST_OFFLOADS:
        testbed.sh("ip", "netns", "exec", h.netns, "ethtool", "-K", "eth0", *group)


def arrivals(sock: socket.socket, n: int, idle_limit: float = progress.STALL) -> list[bytes]:
    """Frames arriving at a host (its own transmissions left out) until `n` came, or none for
    `idle_limit` s."""
    got, idle = [], time.monotonic()
    while len(got) < n and time.monotonic() - idle < idle_limit:
        try:
            frame, addr = sock.recvfrom(1 << 17)
        except BlockingIOError:
            time.sleep(0.002)
            continue
        idle = time.monotonic()
        if addr[2] != PACKET_OUTGOING:
            got.append(frame)
    return got


def checksums_hold(frame: bytes) -> bool:
    f = np.frombuffer(frame, np.uint8)
    udp_len = len(frame) - 34
    pseudo = np.frombuffer(frame[26:34] + struct.pack("!BBH", 0, socket.IPPROTO_UDP, udp_len), np.uint8)
    return vnet.ones_sum(f[14:34]) == 0xFFFF and vnet._fold(vnet.ones_sum(pseudo) + vnet.ones_sum(f[34:])) == 0xFFFF


@pytest.mark.skipif(not vnet.kernel_supports(), reason="the kernel's receive rings carry no virtio_net_hdr")
@pytest.mark.parametrize("loop", ["python", "c"])
@pytest.mark.parametrize("seg, count", [(SEG, 43), (88, 64)])
def test_a_super_frame_leaves_the_switch_as_the_hosts_kernel_would_cut_it(loop, seg, count):
    """The exprs program reflects IPv4 frames unchanged. The same super-frame (`count` frames'
    payload, a short last one; of 1,000-byte frames, and of 64 K = 32 GRADs' 88 bytes, which the
    kernel keeps in one linear buffer and so reports as all header) from a host whose link passes it
    whole and from one whose kernel cuts it comes back as the same frames, with valid checksums and
    ids counted up; so does a frame with a partial checksum; the switch counts the super-frame it cut."""
    from .engines import engine

    payload = body((count - 1) * seg + 57, 1)
    with testbed.Testbed("off") as bed:
        nets = {1: bed.add(H1), 2: bed.add(H2)}
        offload_on(nets[1])
        ports = {n: Port(n, h.switch_iface) for n, h in nets.items()}
        socks = {n: h.socket() for n, h in nets.items()}
        senders = {n: vnet_sender(h.netns) for n, h in nets.items()}
        eng = engine("exprs", "compiled")
        dp = DataPlane(eng, ports)
        got = {}
        try:
            for n in nets:
                send_super(senders[n], payload, seg)
                send_partial(senders[n], body(333, 2))

            def all_in() -> bool:
                if loop == "c":
                    assert dp.serve() is not None
                else:
                    for p in ports.values():
                        dp._port_ready(p)
                return eng.stats.rx >= 2 * (count + 1)

            progress.wait(all_in, lambda: eng.stats.rx, stall=progress.STALL, what="the switch reading", poll=0)
            got = {n: arrivals(socks[n], count + 1) for n in nets}
        finally:
            for s in [*socks.values(), *senders.values()]:
                s.close()
            dp.close()
    assert [len(f) for f in got[1][:count]] == [42 + seg] * (count - 1) + [42 + 57]
    assert got[1] == got[2]
    assert all(checksums_hold(f) for f in got[1])
    assert [struct.unpack_from("!H", f, 18)[0] for f in got[1][:count]] == [0x1234 + i for i in range(count)]
    assert b"".join(f[42:] for f in got[1][:count]) == payload
    assert (ports[1].rx, ports[1].rx_cut, ports[2].rx_cut, ports[1].rx_truncated) == (count + 1, 1, 0, 0)


@pytest.mark.skipif(not vnet.kernel_supports(), reason="the kernel's receive rings carry no virtio_net_hdr")
def test_a_super_frame_waits_for_room_for_all_its_frames_and_one_too_large_for_a_batch_is_counted():
    """Receiving into a batch with room for fewer frames than a super-frame makes: taken by a later
    call whole, never in part; one that makes more frames than the batch holds is a counted drop,
    and the socket's queue stays in step with the ring (the frame after it is read whole)."""
    with testbed.Testbed("off") as bed:
        h = bed.add(H1)
        offload_on(h)
        port = Port(1, h.switch_iface)
        sender = vnet_sender(h.netns)
        try:
            send_partial(sender, b"first")
            send_super(sender, body(5 * SEG, 3))  # 5 frames
            send_super(sender, body(30 * SEG, 4))  # through the socket's queue: 30 frames
            send_partial(sender, b"last")
            rx = Batch.empty(8, SLOT)
            progress.wait(lambda: int(port.ring.status[port.ring.head[0] % port.ring.frames]) & 1, lambda: 0,
                          stall=progress.STALL, what="a frame in the ring")
            time.sleep(0.2)
            rx.n = 4
            assert port.receive(rx, 4) == 1, "the first frame; the super-frame of 5 waits for room"
            rx.n = 0
            assert port.receive(rx, 8) == 5 and port.rx_cut == 1
            rx.n = 0
            assert port.receive(rx, 8) == 1, "the 30 frames dropped; the last frame read"
            assert rx.frame(0)[42:] == b"last"
        finally:
            sender.close()
            port.close()
    assert (port.rx, port.rx_cut, port.rx_truncated) == (7, 1, 1)


def test_the_reference_cuts_and_completes_as_specified():
    """vnet.segments and vnet.complete on a made-up frame: segment sizes, lengths, ids and
    checksums; kernel_supports reads a release string."""
    frame = np.frombuffer(pseudo_seed(ipv4_udp(body(2 * SEG + 1, 5))), np.uint8).copy()
    v = vnet.Vnet(vnet.F_NEEDS_CSUM, vnet.GSO_UDP_L4, 42, SEG, 34, 6)
    segs = vnet.segments(frame, len(frame), v)
    assert [len(s) for s in segs] == [42 + SEG, 42 + SEG, 43]
    assert all(checksums_hold(s.tobytes()) for s in segs)
    assert [struct.unpack_from("!HH", s.tobytes(), 16) for s in segs] == [(28 + SEG, 0x1234), (28 + SEG, 0x1235),
                                                                          (29, 0x1236)]
    assert vnet.segments(frame, len(frame), vnet.Vnet(1, vnet.GSO_UDP_L4, 42, SEG, 30, 6)) is None
    assert len(vnet.segments(frame, len(frame), vnet.Vnet(1, vnet.GSO_UDP_L4, len(frame), SEG, 34, 6))) == 3
    one = np.frombuffer(pseudo_seed(ipv4_udp(b"abc")), np.uint8).copy()
    assert vnet.complete(one, len(one), 34, 6) and checksums_hold(one.tobytes())
    assert not vnet.complete(one, 40, 34, 6)
    assert vnet.kernel_supports("6.1.0-13-amd64") and not vnet.kernel_supports("4.19.0") \
        and not vnet.kernel_supports("weird")


def test_make_runs_hosts_keep_udp_segmentation_offload_only_on_the_embedded_switch(monkeypatch):
    monkeypatch.delenv("MINDP_NO_USO", raising=False)
    assert targets.hosts_offload("embedded") == targets.hosts_offload("embedded-python") == vnet.kernel_supports()
    assert not targets.hosts_offload("bmv2")
    monkeypatch.setenv("MINDP_NO_USO", "1")
    assert not targets.hosts_offload("embedded")
