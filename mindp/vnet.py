"""What a host's link offloads leave for the switch to finish: UDP super-frames and partial checksums.

A host whose link has UDP segmentation offload on (`tx-udp-segmentation`, make run's hosts on the
embedded switch) hands an agent's super-frame (host_agent/udpgso.py: up to 64 KB of frames that
share one header) to its veth whole, and the veth passes it whole to the switch's port: the
sending kernel neither segments it nor computes its frames' checksums, which saves the host about
three quarters of its cost a frame. The host's own traffic (TCP, UDP sockets) then leaves with
partial checksums (CHECKSUM_PARTIAL): the link was trusted to finish them.

A port's packet socket with PACKET_VNET_HDR reads each frame's virtio_net_hdr before it (in the
receive ring's slot, and first in a `recv` of a frame that waited in the socket's queue), which
says both: a super-frame's `gso_type` and `gso_size`, a partial checksum's `csum_start` and
`csum_offset`. The switch finishes what the sending kernel would have done on a link without
offloads, so the P4 program, the pcaps and every receiver see the frames of that link byte for
byte: a super-frame becomes its segments (IP total length, id counted up from the super-frame's,
IP checksum, UDP length and UDP checksum of each), a partial checksum is completed.

This module is the reference (numpy, the switch's Python loop); softswitch/native/io.h does the
same in C."""
from __future__ import annotations

import platform
import struct
from dataclasses import dataclass

import numpy as np

SOL_PACKET = 263
PACKET_VNET_HDR = 15
VNET_HDR = struct.Struct("=BBHHHH")  # flags, gso_type, hdr_len, gso_size, csum_start, csum_offset
VNET_LEN = VNET_HDR.size
F_NEEDS_CSUM = 1
GSO_NONE, GSO_UDP_L4 = 0, 5
ETH = 14
IPPROTO_UDP = 17
#: `ethtool -K IFACE ...` argument groups, in order, that give a host's link what the switch finishes:
#: UDP segmentation offload and the transmit checksums and scatter-gather it needs; SCTP's CRC
#: offload off again (`tx on` sets it, and a CRC is no checksum the switch completes).
HOST_OFFLOADS = (("tx", "on", "sg", "on", "tx-udp-segmentation", "on"),
                 ("tx-checksum-sctp", "off", "tx-sctp-segmentation", "off"))
#: Kernels whose receive ring writes a virtio_net_hdr before each frame (tpacket_rcv's vnet
#: support, in every kernel since 4.x): older ones leave the bytes as they were, so a switch there
#: keeps its hosts' offloads off.
MIN_KERNEL = (5, 4)


def kernel_supports(release: str | None = None) -> bool:
    """Whether this kernel's receive rings carry virtio_net_hdrs (MIN_KERNEL)."""
    parts = (release or platform.release()).split(".")
    try:
        return (int(parts[0]), int(parts[1].split("-")[0])) >= MIN_KERNEL
    except (IndexError, ValueError):
        return False


@dataclass(frozen=True)
class Vnet:
    """One frame's virtio_net_hdr, as the kernel wrote it (host byte order)."""
    flags: int
    gso_type: int
    hdr_len: int
    gso_size: int
    csum_start: int
    csum_offset: int

    @classmethod
    def parse(cls, raw) -> "Vnet":
        return cls(*VNET_HDR.unpack_from(bytes(raw[:VNET_LEN])))

    @property
    def needs_csum(self) -> bool:
        return bool(self.flags & F_NEEDS_CSUM)


def ones_sum(data: np.ndarray) -> int:
    """The one's complement sum (folded, not complemented) of `data`'s big-endian 16-bit words, an
    odd last byte padded with zero."""
    b = np.asarray(data, np.uint8)
    if len(b) % 2:
        b = np.append(b, np.uint8(0))
    return _fold(int(b.view(">u2").sum(dtype=np.uint64)))


def _store(frame: np.ndarray, at: int, value: int) -> None:
    frame[at], frame[at + 1] = value >> 8, value & 0xFF


def complete(frame: np.ndarray, n: int, start: int, offset: int) -> bool:
    """Complete frame[:n]'s partial checksum in place, as skb_checksum_help does: the field at
    start + offset holds the pseudo-header's sum; the sum from `start` to the end, complemented,
    replaces it (0 is sent as 0xFFFF). False, and nothing written, when the field is outside."""
    at = start + offset
    if start < 0 or at + 2 > n:
        return False
    total = _fold_complement(ones_sum(frame[start:n]))
    _store(frame, at, total or 0xFFFF)
    return True


def udp_layout(frame: np.ndarray, n: int, v: Vnet) -> int | None:
    """The headers' length (Ethernet, IPv4, UDP) of the untagged Ethernet/IPv4/UDP super-frame
    frame[:n] that `v` describes (GSO_UDP_L4, some payload), or None when it is not one. Read from
    the frame: the kernel's hdr_len is the skb's linear part, which may be the whole frame."""
    if v.gso_type != GSO_UDP_L4 or v.gso_size == 0 or n < ETH + 20:
        return None
    if frame[12] != 0x08 or frame[13] != 0x00 or frame[ETH] >> 4 != 4 or frame[ETH + 9] != IPPROTO_UDP:
        return None
    ihl = (int(frame[ETH]) & 0xF) * 4
    if ihl < 20 or n <= ETH + ihl + 8 or (v.needs_csum and v.csum_start != ETH + ihl):
        return None
    return ETH + ihl + 8


def segment_count(n: int, hdr: int, v: Vnet) -> int:
    """Frames a super-frame of n bytes with hdr bytes of headers makes."""
    return -(-(n - hdr) // v.gso_size)


def segments(frame: np.ndarray, n: int, v: Vnet) -> list[np.ndarray] | None:
    """Super-frame frame[:n] (its virtio_net_hdr `v`) cut as the sending kernel's UDP segmentation
    cuts it: each segment the headers with up to gso_size bytes of the payload; IP total length,
    id (the super-frame's, plus the segment's index) and checksum, UDP length and checksum (0 sent
    as 0xFFFF) of its own. None when it is not such a frame (udp_layout)."""
    hdr = udp_layout(frame, n, v)
    if hdr is None:
        return None
    head = np.array(frame[:hdr], np.uint8)
    ip_id = int(head[ETH + 4]) << 8 | int(head[ETH + 5])
    udp = hdr - 8
    out = []
    for i, at in enumerate(range(hdr, n, v.gso_size)):
        payload = frame[at : min(n, at + v.gso_size)]
        seg = np.concatenate([head, payload])
        _store(seg, ETH + 2, len(seg) - ETH)
        _store(seg, ETH + 4, (ip_id + i) & 0xFFFF)
        _store(seg, ETH + 10, 0)
        _store(seg, ETH + 10, ~ones_sum(seg[ETH:udp]) & 0xFFFF)
        udp_len = len(seg) - udp
        _store(seg, udp + 4, udp_len)
        _store(seg, udp + 6, 0)
        pseudo = np.concatenate([seg[ETH + 12 : ETH + 20], np.array([0, IPPROTO_UDP, udp_len >> 8, udp_len & 0xFF],
                                                                    np.uint8)])
        total = _fold_complement(ones_sum(pseudo) + ones_sum(seg[udp:]))
        _store(seg, udp + 6, total or 0xFFFF)
        out.append(seg)
    return out


def _fold(total: int) -> int:
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def _fold_complement(total: int) -> int:
    return ~_fold(total) & 0xFFFF
