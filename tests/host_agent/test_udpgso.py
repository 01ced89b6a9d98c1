"""An agent's bursts as UDP GSO super-frames (host_agent.udpgso through rawsock.send_rows), on a veth
pair: every frame arrives in order as it was built, with the lengths, checksums and IP ids the
kernel's segmentation gives it; rows that are not plain IPv4/UDP, and every row without a sender,
go as they are; a kernel that will not segment turns the sender off with no frame lost."""
import errno
import socket

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from host_agent import rawsock, udpgso
from mindp.harness import testbed
from mindp.protocol import UDP_PORT, Kind, frame_len, link_mtu

pytestmark = pytest.mark.net


def build(n: int, width: int, dsts=("10.0.0.2",)) -> np.ndarray:
    """n frames of `width` bytes, random payloads, IP id 7 and no UDP checksum (as the agents build
    them); row i goes to dsts[i * len(dsts) // n]."""
    f = np.zeros((n, width), np.uint8)
    f[:, 42:] = np.random.default_rng(width).integers(0, 256, (n, width - 42), dtype=np.uint8)
    for i, dst in enumerate(dsts):
        head = bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
                     / IP(src="10.0.0.1", dst=dst, id=7) / UDP(sport=UDP_PORT, dport=UDP_PORT, chksum=0)
                     / Raw(b"\0" * (width - 42)))
        f[i * n // len(dsts):(i + 1) * n // len(dsts), :42] = np.frombuffer(head[:42], np.uint8)
    return f


@pytest.fixture
def link():
    a, b = testbed.tagged("mdp-gso0"), testbed.tagged("mdp-gso1")
    with testbed.veth_pair(a, b):
        tx, rx = rawsock.open_raw(a), testbed.raw_socket(b)
        try:
            yield tx, rx
        finally:
            tx.close()
            rx.close()


def received(rx: socket.socket, count: int) -> list[bytes]:
    out = []
    while len(out) < count:
        rx.settimeout(10)
        frame = rx.recv(1 << 16)
        if frame[12:14] in (b"\x08\x00", b"\x88\xb5"):  # not the kernel's own IPv6 chatter
            out.append(frame)
    rx.setblocking(False)
    try:
        while True:
            extra = rx.recv(1 << 16)
            assert extra[12:14] not in (b"\x08\x00", b"\x88\xb5"), "more frames than were sent"
    except BlockingIOError:
        return out


def checksums_valid(frame: bytes) -> bool:
    p = Ether(frame)
    again = p.copy()
    del again[IP].chksum
    del again[UDP].chksum
    again = Ether(bytes(again))
    return again[IP].chksum == p[IP].chksum and (p[UDP].chksum in (0, again[UDP].chksum))


def same_but_kernel_fields(got: bytes, sent: np.ndarray) -> bool:
    """Equal but for the fields segmentation writes: IP id (bytes 18-19), IP checksum (24-25),
    UDP checksum (40-41)."""
    want = bytearray(sent.tobytes())
    got = bytearray(got)
    for lo, hi in ((18, 20), (24, 26), (40, 42)):
        want[lo:hi] = got[lo:hi] = b"\0\0"
    return got == want


# GRAD frames at K = 32, at this process's K (make test runs the file at both), and the link's longest
@pytest.mark.parametrize("width", sorted({frame_len(Kind.GRAD, 32), frame_len(Kind.GRAD), link_mtu() + 14}))
def test_runs_of_one_header_arrive_as_the_frames_built(link, width):
    tx, rx = link
    assert udpgso.sender(tx) is not None
    f = build(300, width, dsts=("10.0.0.2", "10.0.0.3"))
    rows = [5, 6, 7, *range(10, 290), 3]  # the last row's header differs from the one before it
    assert rawsock.send_rows(tx, f, rows) == (len(rows), 0)
    got = received(rx, len(rows))
    assert all(same_but_kernel_fields(g, f[r]) for g, r in zip(got, rows))
    assert all(checksums_valid(g) for g in got)
    ids = [int.from_bytes(g[18:20], "big") for g in got]
    per = min(udpgso.MAX_SEGMENTS, (udpgso.MAX_BYTES - 28) // (width - 42))
    assert ids[:per] == list(range(7, 7 + per))  # one super-frame, cut by the kernel
    assert [int.from_bytes(g[40:42], "big") != 0 for g in got[:-1]] == [True] * (len(got) - 1)
    assert got[-1] == f[3].tobytes()  # alone: sent as built


def test_rows_sent_with_lengths_go_as_runs_of_one_length(link):
    """As the node sends PARAM frames of 1-4 chunks: rows as wide as the longest, each its own length."""
    tx, rx = link
    stride = link_mtu() + 14
    sizes = [stride] * 70 + [stride - 100] * 3 + [200] + [stride] * 5 + [43] * 2
    f = np.zeros((len(sizes), stride), np.uint8)
    for i, size in enumerate(sizes):
        f[i, :size] = build(1, size)[0]
    f[:, -50:] = 0xEE  # past the shorter rows' lengths: never sent
    rows = list(range(len(sizes)))
    assert rawsock.send_rows(tx, f, rows, lens=np.array(sizes)) == (len(rows), 0)
    got = received(rx, len(rows))
    assert [len(g) for g in got] == sizes
    assert all(same_but_kernel_fields(g, f[r, :size]) for g, r, size in zip(got, rows, sizes))
    assert all(checksums_valid(g) for g in got)
    assert [int.from_bytes(g[18:20], "big") for g in got[70:73]] == [7, 8, 9]  # a run of 3 cut by the kernel


def test_rows_that_are_not_plain_udp_go_as_built(link):
    tx, rx = link
    width = frame_len(Kind.GRAD)
    f = build(40, width)
    f[:15, 12:14] = (0x88, 0xB5)  # not IPv4
    f[15:30, 16:18] = (0, 60)  # an IP length short of the frame: its tail is padding
    f[30:, 20] |= 0x20  # a fragment (more fragments)
    assert rawsock.send_rows(tx, f, range(40)) == (40, 0)
    assert received(rx, 40) == [row.tobytes() for row in f]


def test_rows_of_one_header_go_at_their_own_lengths(link):
    """Rows whose headers are alike but whose lengths are not (the header does not give the
    frame's length, so not plain UDP) each leave at the length given for it."""
    tx, rx = link
    width = frame_len(Kind.GRAD)
    f = build(6, width)
    f[:, 16:18] = (0, 60)  # one IP length for every row
    sizes = np.array([width, width - 10, width - 10, width, 100, 100])
    assert rawsock.send_rows(tx, f, range(6), lens=sizes) == (6, 0)
    assert received(rx, 6) == [row[:size].tobytes() for row, size in zip(f, sizes)]


def test_without_a_sender_rows_go_one_by_one_as_built(link, monkeypatch):
    monkeypatch.setattr(udpgso, "ENABLED", False)  # as MINDP_NO_GSO=1 at import
    a, b = testbed.tagged("mdp-gso2"), testbed.tagged("mdp-gso3")
    with testbed.veth_pair(a, b):
        tx, rx = rawsock.open_raw(a), testbed.raw_socket(b)
        try:
            assert udpgso.sender(tx) is None
            f = build(100, frame_len(Kind.GRAD))
            assert rawsock.send_rows(tx, f, range(100)) == (100, 0)
            assert received(rx, 100) == [row.tobytes() for row in f]
        finally:
            tx.close()
            rx.close()


class Refusing:
    """The sender's socket as a kernel that refuses every super-frame with `err` (a test seam:
    no kernel here refuses them)."""

    def __init__(self, sock: socket.socket, err: int):
        self.sock, self.err, self.calls = sock, err, 0

    def sendmsg(self, bufs):
        self.calls += 1
        if bufs[0] != udpgso.NO_GSO:
            raise OSError(self.err, "refused")
        return self.sock.sendmsg(bufs)


def test_a_kernel_that_will_not_segment_turns_the_sender_off_and_no_frame_is_lost(link):
    tx, rx = link
    g = udpgso.sender(tx)
    g.sock = Refusing(g.sock, errno.EINVAL)
    f = build(100, frame_len(Kind.GRAD), dsts=("10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"))
    rows = [0, *range(50, 100)]  # one lone row, then runs
    assert rawsock.send_rows(tx, f, rows) == (len(rows), 0)
    assert received(rx, len(rows)) == [f[r].tobytes() for r in rows]
    assert udpgso.sender(tx) is None and g.sock.calls == 2
    assert rawsock.send_rows(tx, f, range(10)) == (10, 0)
    assert received(rx, 10) == [row.tobytes() for row in f[:10]]


def test_a_full_queue_counts_each_frame_of_a_refused_super_frame_as_lost(link):
    tx, rx = link
    g = udpgso.sender(tx)
    g.sock = Refusing(g.sock, errno.ENOBUFS)
    f = build(100, frame_len(Kind.GRAD))
    assert rawsock.send_rows(tx, f, range(100)) == (100, 100)
    assert udpgso.sender(tx) is g
    g.sock = Refusing(g.sock.sock, errno.EPERM)
    with pytest.raises(PermissionError):
        rawsock.send_rows(tx, f, range(100))
