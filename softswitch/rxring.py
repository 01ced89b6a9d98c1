"""A port's receive ring: the kernel copies each arriving frame into the next free slot of a
buffer the switch maps (PACKET_MMAP, TPACKET_V2), and the switch reads slots in order until it
finds one the kernel still owns.

Why: with recvmmsg every frame costs the kernel a message header and an iovec copied in and out, an
skb cloned, queued, copied out and freed in the switch's system call; with the ring the frame is
copied once, as it arrives, and the switch makes no call at all while frames keep coming (the
switch then forwards ~25 % more packets/s, docs/SOFTSWITCH.md). A frame longer than a ring slot
holds (over 1,982 bytes, FRAME less the header: jumbo frames) comes whole through the socket's
queue as well (PACKET_COPY_THRESH) and its slot says so (TP_STATUS_COPY): nothing is cut short.

The C packet loop (softswitch/native/io.h) reads the same ring at the same `head`, so either loop
may run at any time.
"""
from __future__ import annotations

import mmap
import socket
import struct

import numpy as np

SOL_PACKET = 263
PACKET_RX_RING = 5
PACKET_STATISTICS = 6
PACKET_COPY_THRESH = 7
PACKET_VERSION = 10
TPACKET_V2 = 1
TP_STATUS_USER = 1  # the switch owns the slot (else the kernel: TP_STATUS_KERNEL, 0)
TP_STATUS_COPY = 2  # the frame did not fit: it waits whole in the socket's queue
TP_STATUS_VLAN_VALID = 1 << 4
TP_STATUS_VLAN_TPID_VALID = 1 << 6
ETH_P_8021Q = 0x8100
PACKET_OUTGOING = 4
TAG = 4  # bytes of a restored VLAN tag: a batch slot keeps room for them

FRAME = 2048  # bytes of a slot, its header (struct tpacket2_hdr, struct sockaddr_ll) included
FRAMES = 4096  # slots per port: 8 MiB, as much as the socket buffer the port had before
BLOCK = 1 << 17  # the ring is allocated in blocks of this many bytes (64 slots)

TOO_LONG, GONE = -1, -2  # RxRing._take's results other than a length

#: struct tpacket2_hdr and the struct sockaddr_ll after it, one per slot.
HEADER = np.dtype({"names": ["status", "len", "snaplen", "mac", "tci", "tpid", "pkttype"],
                   "formats": ["<u4", "<u4", "<u4", "<u2", "<u2", "<u2", "u1"],
                   "offsets": [0, 4, 8, 12, 24, 26, 42], "itemsize": FRAME})


class RxRing:
    """The receive ring of packet socket `sock` (bound, not yet receiving through a ring)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        sock.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V2)
        sock.setsockopt(SOL_PACKET, PACKET_COPY_THRESH, 1)
        sock.setsockopt(SOL_PACKET, PACKET_RX_RING, struct.pack("IIII", BLOCK, FRAMES * FRAME // BLOCK, FRAME, FRAMES))
        self.mem = mmap.mmap(sock.fileno(), FRAMES * FRAME)
        raw = np.frombuffer(self.mem, np.uint8)
        self.slots = raw.reshape(FRAMES, FRAME)
        header = raw.view(HEADER)
        self.status, self.lens, self.snaplens = header["status"], header["len"], header["snaplen"]
        self.macs, self.tcis, self.tpids, self.pkttypes = header["mac"], header["tci"], header["tpid"], header["pkttype"]
        self.head = np.zeros(1, np.int64)  # the next slot to read (modulo FRAMES); the C loop moves it too

    def dropped(self) -> int:
        """Frames the kernel dropped since the last call because the ring was full (the switch fell
        behind): struct tpacket_stats' tp_drops, which reading resets."""
        _, drops = struct.unpack("II", self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
        return drops

    @property
    def address(self) -> int:
        return self.slots.ctypes.data

    def receive(self, buf: np.ndarray, lens: np.ndarray, start: int, want: int, limit: int,
                outgoing: bool) -> tuple[int, int]:
        """Up to `want` waiting frames into rows start.. of `buf` (their lengths into `lens`), each
        with the VLAN tag the kernel took off put back; (frames kept, frames dropped as longer
        than `limit` bytes). `outgoing`: leave out our own transmissions (kernels before 4.20)."""
        head, kept, too_long = int(self.head[0]), start, 0
        try:
            for _ in range(want):
                k = head % FRAMES
                status = int(self.status[k])
                if not status & TP_STATUS_USER:
                    break
                head += 1
                n = self._take(k, status, buf[kept], limit)
                self.status[k] = 0
                if n < 0:
                    too_long += n == TOO_LONG
                    continue
                if outgoing and self.pkttypes[k] == PACKET_OUTGOING:
                    continue
                if status & TP_STATUS_VLAN_VALID and n >= 12:
                    tpid = int(self.tpids[k]) if status & TP_STATUS_VLAN_TPID_VALID else ETH_P_8021Q
                    row = buf[kept]
                    row[12 + TAG:n + TAG] = row[12:n]  # numpy copies overlapping ranges as if through a buffer
                    row[12:12 + TAG] = np.frombuffer(struct.pack("!HH", tpid, int(self.tcis[k])), np.uint8)
                    n += TAG
                lens[kept] = n
                kept += 1
        finally:
            self.head[0] = head
        return kept - start, too_long

    def _take(self, k: int, status: int, row: np.ndarray, limit: int) -> int:
        """Slot k's frame into `row`: its length, TOO_LONG, or GONE (the link went down before a
        frame that waited in the socket's queue was read)."""
        if status & TP_STATUS_COPY:
            try:
                n = self.sock.recv_into(memoryview(row)[:limit], limit, socket.MSG_TRUNC | socket.MSG_DONTWAIT)
            except OSError:
                return GONE
            return n if n <= limit else TOO_LONG
        n = int(self.lens[k])
        if n > limit or int(self.snaplens[k]) != n:  # cut short: no room in the socket's queue
            return TOO_LONG
        mac = int(self.macs[k])
        row[:n] = self.slots[k, mac:mac + n]
        return n

    def close(self) -> None:
        """Unmap the ring (the socket is closed by its owner)."""
        self.slots = self.status = self.lens = self.snaplens = None
        self.macs = self.tcis = self.tpids = self.pkttypes = None
        self.mem.close()
