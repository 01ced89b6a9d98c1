"""UDP segmentation offload for an agent's bursts: runs of frames with one Ethernet/IPv4/UDP header
leave as one super-frame each, which the kernel cuts back into the same frames.

A frame sent alone costs a system call's share, an skb, and a pass through the packet socket and
the link's transmit path; DDP's TCP pays those once per 64 KB segment. Sent through a second
packet socket with PACKET_VNET_HDR, a virtio_net_hdr asking GSO_UDP_L4 (gso_size: one frame's
UDP payload) makes a run of up to 64 KB one skb: the kernel segments it on the way out (in
software where the link's offloads are off, computing each frame's UDP checksum from the
pseudo-header seed written here) and every frame arrives as if sent alone, with its own IP
length, id and checksums. Receivers need nothing new. Where the link has UDP segmentation offload
on (make run's hosts on the embedded switch, mindp/vnet.py), the super-frame reaches the switch
whole and the switch cuts it into the same frames.

The payload bytes are gathered by the kernel from the rows themselves (an iovec per frame), so
nothing is copied here. A socket gets a sender from `attach` where it is opened (rawsock.open_raw,
in its namespace); without one (MINDP_NO_GSO=1, an old kernel, a socket opened elsewhere), and
for rows that are not plain IPv4/UDP, rawsock sends frame by frame.
"""
from __future__ import annotations

import errno
import os
import socket
import struct
import weakref

import numpy as np

from mindp.codec import ipv4_checksum
from mindp.vnet import F_NEEDS_CSUM, GSO_UDP_L4, PACKET_VNET_HDR, SOL_PACKET, VNET_HDR

ETH, IP, UDP = 14, 20, 8
PREFIX = ETH + IP + UDP
_HEADER = np.dtype((np.void, PREFIX))  # a frame's headers as one opaque item (compared whole)
#: Frames per super-frame at most: UDP GSO's limit in the kernels that have it (UDP_MAX_SEGMENTS, 64
#: before 6.10), and 64 KB.
MAX_SEGMENTS = 64
MAX_BYTES = 65535
#: errnos of a kernel that takes PACKET_VNET_HDR but will not segment UDP (ENOTSUPP is 524)
UNSUPPORTED = (errno.EINVAL, errno.EMSGSIZE, errno.EOPNOTSUPP, errno.EPROTONOSUPPORT, 524)
NO_GSO = VNET_HDR.pack(0, 0, 0, 0, 0, 0)
ENABLED = os.environ.get("MINDP_NO_GSO") != "1"


def super_header(header: bytes, count: int, seg: int) -> bytes:
    """The 42-byte header of a super-frame of `count` frames of `seg` payload bytes each, from
    its frames' shared header: IP and UDP lengths of the whole, IP checksum, and the UDP
    checksum field holding the pseudo-header sum the kernel completes per frame."""
    h = bytearray(header[:PREFIX])
    udp_len = UDP + count * seg
    struct.pack_into("!H", h, ETH + 2, IP + udp_len)
    h[ETH + 10:ETH + 12] = b"\0\0"
    struct.pack_into("!H", h, ETH + 10, ipv4_checksum(bytes(h[ETH:ETH + IP])))
    struct.pack_into("!H", h, ETH + IP + 4, udp_len)
    pseudo = bytes(h[ETH + 12:ETH + 20]) + struct.pack("!BBH", 0, socket.IPPROTO_UDP, udp_len)
    struct.pack_into("!H", h, ETH + IP + 6, ~ipv4_checksum(pseudo) & 0xFFFF)  # the sum, not its complement
    return bytes(h)


def plain_udp(header, width: int) -> bool:
    """Whether a frame of `width` bytes starting with `header` is Ethernet, IPv4 without options
    and unfragmented, UDP, with IP and UDP lengths to its end: a frame the kernel's segmentation
    gives back as it is."""
    h = bytes(header[:PREFIX])
    return (len(h) == PREFIX and width > PREFIX and h[12:14] == b"\x08\x00" and h[ETH] == 0x45 and h[ETH + 9] == socket.IPPROTO_UDP
            and h[ETH + 6] & 0x3F == 0 and h[ETH + 7] == 0
            and struct.unpack_from("!H", h, ETH + 2)[0] == width - ETH
            and struct.unpack_from("!H", h, ETH + IP + 4)[0] == width - ETH - IP)


class Sender:
    """Super-frames onto the link a packet socket is bound to."""

    def __init__(self, iface: str):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)  # protocol 0: it receives nothing
        try:
            s.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
            s.bind((iface, 0))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        except OSError:
            s.close()
            raise
        s.setblocking(False)
        self.sock = s
        self.usable = True
        self._headers: dict[tuple[bytes, int], tuple[bytes, bytes]] = {}

    def _prefix(self, header: bytes, count: int, seg: int) -> tuple[bytes, bytes]:
        key = (header, count)
        hit = self._headers.get(key)
        if hit is None:
            if len(self._headers) > 256:
                self._headers.clear()
            vnet = VNET_HDR.pack(F_NEEDS_CSUM, GSO_UDP_L4, PREFIX, seg,
                                 ETH + IP, 6)
            hit = self._headers[key] = (vnet, super_header(header, count, seg))
        return hit

    def send(self, frames: np.ndarray, rows: np.ndarray, refused: tuple[int, ...],
             lens: np.ndarray | None = None) -> tuple[int, int]:
        """Send frames[rows] (C-contiguous rows, each its first lens[row] bytes if given, else
        whole): runs of rows with one plain IPv4/UDP header and length (plain_udp) as
        super-frames, other rows alone. Returns (rows sent, failed): a super-frame the kernel
        refuses with an errno of `refused` counts all its frames as lost (retransmission covers
        them). Where the kernel will not segment (UNSUPPORTED), the sender turns itself off and
        returns the rows it did send: the caller sends the others."""
        stride = frames.shape[1]
        heads = frames[rows, :PREFIX]
        # a run ends where a row's headers or length differ from the one before it
        items = heads.view(_HEADER).reshape(-1)
        cut = items[1:] != items[:-1]
        if lens is None:
            sizes = None
        else:
            sizes = np.asarray(lens, dtype=np.int64)[rows]
            cut |= sizes[1:] != sizes[:-1]
        edges = (np.flatnonzero(cut) + 1).tolist()
        mv = memoryview(frames).cast("B")
        sendmsg = self.sock.sendmsg
        failed = 0
        for a, b in zip([0, *edges], [*edges, len(rows)]):
            width = stride if sizes is None else int(sizes[a])
            seg = width - PREFIX
            step = min(MAX_SEGMENTS, (MAX_BYTES - IP - UDP) // seg) if plain_udp(heads[a], width) else 1
            for i in range(a, b, step):
                pick = rows[i:min(b, i + step)].tolist()
                if len(pick) == 1:
                    bufs = [NO_GSO, mv[pick[0] * stride:pick[0] * stride + width]]
                else:
                    bufs = [*self._prefix(bytes(heads[i]), len(pick), seg)]
                    bufs += [mv[r * stride + PREFIX:r * stride + width] for r in pick]
                try:
                    sendmsg(bufs)
                except OSError as exc:
                    if exc.errno in refused:
                        failed += len(pick)
                    elif exc.errno in UNSUPPORTED and len(pick) > 1:
                        self.usable = False
                        return i, failed
                    else:
                        raise
        return len(rows), failed


_senders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # packet socket -> Sender


def attach(s: socket.socket) -> Sender | None:
    """Give packet socket `s` a GSO sender on its link; to be called in the network namespace
    `s` was made in (the sender's socket is bound by interface name). None where GSO is off or
    the kernel has no PACKET_VNET_HDR: `s` then sends frame by frame."""
    if not ENABLED or getattr(s, "family", None) != socket.AF_PACKET:
        return None
    try:
        g = Sender(s.getsockname()[0])
    except OSError as exc:
        if exc.errno not in (errno.ENOPROTOOPT, errno.EINVAL, errno.EPERM, errno.ENODEV):
            raise
        return None
    _senders[s] = g
    weakref.finalize(s, g.sock.close)
    return g


def sender(s: socket.socket) -> Sender | None:
    """`s`'s GSO sender, if `attach` gave it one that the kernel has not refused."""
    g = _senders.get(s)
    return g if g is not None and g.usable else None


def detach(s: socket.socket) -> None:
    """Take `s`'s sender away: its bursts go frame by frame again."""
    g = _senders.pop(s, None)
    if g is not None:
        g.sock.close()
