"""A packet socket's receive ring: the kernel copies each arriving frame into the next free slot of a
buffer the process maps (PACKET_MMAP, TPACKET_V2), and the process reads slots in order until it
finds one the kernel still owns.

Why: with recvmmsg every frame costs the kernel a message header and an iovec copied in and out, an
skb cloned, queued, copied out and freed in the reader's system call; with the ring the frame is
copied once, as it arrives, and the reader makes no call at all while frames keep coming (the
embedded switch forwards ~25 % more packets/s, docs/SOFTSWITCH.md; a worker's receive,
docs/WORKER.md). Used by the embedded switch's ports (`receive`: any frame, its VLAN tag put back;
its C packet loop, softswitch/native/io.h, reads the same ring at the same `head`) and by the host
agents (`receive_rows`: frames of one length into the rows of a buffer, vectorised).

A frame longer than a slot holds: with `copy_long` (the switch: slots of its K's longest mindp frame, longer frames through
the socket's queue) it comes whole through the socket's queue as well (PACKET_COPY_THRESH) and its
slot says so (TP_STATUS_COPY); without (the hosts, slots sized for their longest frame,
`slot_bytes`) it is cut short in its slot and counted as a frame of another length.
"""
from __future__ import annotations

import mmap
import socket
import struct

import numpy as np

from . import vnet as vn
from .protocol import IPPROTO_UDP, UDP_PORT, K, Kind, frame_len
from .switch_constants import POOL_SLOTS

SOL_PACKET = 263
PACKET_RX_RING = 5
PACKET_STATISTICS = 6
PACKET_COPY_THRESH = 7
PACKET_VERSION = 10
TPACKET_V2 = 1
TP_STATUS_USER = 1  # the reader owns the slot (else the kernel: TP_STATUS_KERNEL, 0)
TP_STATUS_COPY = 2  # the frame did not fit: it waits whole in the socket's queue
TP_STATUS_VLAN_VALID = 1 << 4
TP_STATUS_VLAN_TPID_VALID = 1 << 6
ETH_P_8021Q = 0x8100
PACKET_OUTGOING = 4
TAG = 4  # bytes of a restored VLAN tag: a batch slot keeps room for them

#: Where a frame starts in its slot: after struct tpacket2_hdr (32 bytes) and struct sockaddr_ll
#: (20), placed so that the network header after a 14-byte Ethernet header is 16-byte aligned.
MAC_OFFSET = 66

BLOCK = 1 << 17  # the ring is allocated in blocks of about this many bytes (64 of the switch's slots)

TOO_LONG, GONE = -1, -2  # RxRing._take's results other than a length

#: A slot's first 44 bytes as 32-bit words: tp_status, tp_len, tp_snaplen, tp_mac | tp_net << 16,
#: tp_sec, tp_nsec, tp_vlan_tci | tp_vlan_tpid << 16, tp_padding (zero), sll_family | sll_protocol
#: << 16, sll_ifindex, sll_hatype | sll_pkttype << 16 | sll_halen << 24 (the source address after
#: it differs from frame to frame). The words RxRing._good_run compares:
HEAD_WORDS = 11
STATUS, LEN, SNAPLEN, OFFSETS, TAG_WORD, LINK = 0, 1, 2, 3, 6, 10


def slot_bytes(longest: int) -> int:
    """The slot that holds a frame of `longest` bytes with its header, and a byte more (a longer
    frame, cut short to the slot, never passes for one of `longest`): a power of two up to a page
    (it divides a block), else whole pages."""
    need = MAC_OFFSET + longest + 1
    if need <= mmap.PAGESIZE:
        return max(64, 1 << (need - 1).bit_length())
    return -(-need // mmap.PAGESIZE) * mmap.PAGESIZE


def switch_slot(k: int = K) -> int:
    """A switch port's slot at K = k: bytes, its header (struct tpacket2_hdr, struct sockaddr_ll)
    included: 2 KiB, or a whole SUM/PARTIAL frame of k (a child switch's PARTIAL comes in at a
    parent), so no mindp frame takes the socket queue's slower path; with room for the
    virtio_net_hdr before it (mindp/vnet.py)."""
    return max(2048, slot_bytes(vn.VNET_LEN + frame_len(Kind.SUM, k)))


#: The switch's slot at this K.
FRAME = switch_slot()


def whole_blocks(frames: int, frame: int) -> tuple[int, int]:
    """(slots a block, slots): at least `frames` slots of `frame` bytes, in whole blocks of ~BLOCK."""
    per_block = max(1, BLOCK // frame)
    return per_block, -(-frames // per_block) * per_block


def switch_frames(frame: int) -> int:
    """A switch port's slots of `frame` bytes: 8 MiB, as much as the socket buffer the port had
    before, and at least one for each of the pool's aggregation slots (no window of chunks in
    flight to a port outgrows its ring: 690 slots at K = 1,024 dropped frames of a 1,024-chunk
    window), in whole blocks (the ring a port makes has exactly these)."""
    return whole_blocks(max(POOL_SLOTS, (8 << 20) // frame), frame)[1]


#: The switch's slots per port at this K.
FRAMES = switch_frames(FRAME)


def header_dtype(frame: int) -> np.dtype:
    """struct tpacket2_hdr and the struct sockaddr_ll after it, one per slot of `frame` bytes."""
    return np.dtype({"names": ["status", "len", "snaplen", "mac", "tci", "tpid", "pkttype"],
                     "formats": ["<u4", "<u4", "<u4", "<u2", "<u2", "<u2", "u1"],
                     "offsets": [0, 4, 8, 12, 24, 26, 42], "itemsize": frame})


#: Bytes of a frame that tell a mindp frame: Ethernet, IPv4 and UDP up to the destination port.
MINDP_PREFIX = 38


def is_mindp(rows: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Which rows hold a mindp frame (IPv4, UDP to mindp's port; the first lens[i] bytes of row i),
    whatever its length: a frame of another length counts as rejected only then. The host's other
    traffic (ARP, the step digest's UDP, ICMP) comes through the same socket and is no error."""
    if rows.shape[1] < MINDP_PREFIX:
        return np.zeros(len(rows), bool)
    f = rows[:, :MINDP_PREFIX]
    return ((np.asarray(lens) >= MINDP_PREFIX) & (f[:, 12] == 0x08) & (f[:, 13] == 0x00) & (f[:, 23] == IPPROTO_UDP)
            & ((f[:, 36].astype(np.uint16) << 8 | f[:, 37]) == UDP_PORT))


class RxRing:
    """The receive ring of packet socket `sock` (bound, not yet receiving through a ring): `frames`
    slots (rounded up to whole blocks) of `frame` bytes (FRAME, or `slot_bytes`). Frames queued on
    the socket before are dropped by the kernel when the ring is set up: set it up before traffic.
    `vnet` (the switch, where the kernel has it: mindp/vnet.py): each frame comes with its
    virtio_net_hdr, and `receive` cuts super-frames and completes partial checksums."""

    vnet = False

    def __init__(self, sock: socket.socket, frame: int = FRAME, frames: int = FRAMES, copy_long: bool = True,
                 vnet: bool = False):
        self.sock = sock
        per_block, frames = whole_blocks(frames, frame)
        self.frame, self.frames = frame, frames
        self.vnet = vnet
        if vnet:
            sock.setsockopt(SOL_PACKET, vn.PACKET_VNET_HDR, 1)  # before the ring: the kernel refuses it after
            self._vbuf = bytearray(vn.VNET_LEN)
            self._big = np.zeros(1 << 17, np.uint8)  # a super-frame from the socket's queue: 64 KB and headers
        sock.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V2)
        if copy_long:
            sock.setsockopt(SOL_PACKET, PACKET_COPY_THRESH, 1)
        sock.setsockopt(SOL_PACKET, PACKET_RX_RING,
                        struct.pack("IIII", per_block * frame, frames // per_block, frame, frames))
        self.mem = mmap.mmap(sock.fileno(), frames * frame)
        self._map(np.frombuffer(self.mem, np.uint8))
        self.head = np.zeros(1, np.int64)  # the next slot to read (modulo frames); the switch's C loop moves it too

    def _map(self, raw: np.ndarray) -> None:
        """Views of the ring's memory `raw` (uint8, frames * frame bytes): slots, header fields."""
        frames, frame = self.frames, self.frame
        self.slots = raw.reshape(frames, frame)
        header = raw.view(header_dtype(frame))
        self.status, self.lens, self.snaplens = header["status"], header["len"], header["snaplen"]
        self.macs, self.tcis, self.tpids, self.pkttypes = header["mac"], header["tci"], header["tpid"], header["pkttype"]
        # Each slot's first HEAD_WORDS 32-bit words: receive_rows' common case is told by one
        # comparison of a run's headers with its first. Status words read as Python ints (_run).
        self._heads = np.lib.stride_tricks.as_strided(raw.view(np.uint32), (frames, HEAD_WORDS), (frame, 4),
                                                      writeable=False)
        self._words = memoryview(raw).cast("I")
        self._stride = frame // 4

    def dropped(self) -> int:
        """Frames the kernel dropped since the last call because the ring was full (the reader fell
        behind): struct tpacket_stats' tp_drops, which reading resets."""
        _, drops = struct.unpack("II", self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
        return drops

    @property
    def address(self) -> int:
        return self.slots.ctypes.data

    def ready(self, k: int, most: int) -> int:
        """How many slots from k on (at most `most`, not past the ring's end) the reader owns. The
        kernel hands slots over in order, so a binary search finds the end of the run; a frame still
        being copied on another CPU may sit before a later one already handed over, so the run is
        then checked slot by slot (vectorised)."""
        return self._owned(k, self._run(k, most))

    def _run(self, k: int, most: int) -> int:
        """ready's binary search alone: the run's end, its slots not yet checked one by one."""
        most = min(most, self.frames - k)
        words, stride = self._words, self._stride
        if most <= 0 or not words[k * stride] & TP_STATUS_USER:
            return 0
        lo, hi = 1, most
        if words[(k + most - 1) * stride] & TP_STATUS_USER:
            return most
        hi = most - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if words[(k + mid) * stride] & TP_STATUS_USER:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _owned(self, k: int, run: int) -> int:
        """How many of the `run` slots from k on the reader owns, in a row."""
        owned = (self.status[k : k + run] & TP_STATUS_USER) != 0
        return run if owned.all() else int(owned.argmin())

    def receive_rows(self, buf: np.ndarray, start: int = 0, lens: np.ndarray | None = None) -> tuple[int, int, int]:
        """Waiting frames of exactly buf.shape[1] bytes into rows start.. of `buf`, in order, up to
        its end; (rows filled, tagged frames dropped, frames of another length dropped). With
        `lens`, frames of up to buf.shape[1] bytes, their lengths into `lens` (a row's bytes past its
        frame are left as they were). A frame that carried a VLAN tag is never taken (the kernel
        strips the tag: it would look like an untagged one); our own transmissions (kernels before
        4.20) are left out uncounted."""
        width, out = buf.shape[1], lens
        rows, tagged, other = start, 0, 0
        while rows < len(buf):
            head = int(self.head[0])
            k = head % self.frames
            m = self._run(k, len(buf) - rows)
            if not m:
                break
            if self._take_run(k, m, buf, rows, out):
                self.release(m)  # after their frames were copied
                rows += m
                continue
            m = self._owned(k, m)
            s = slice(k, k + m)
            lens = self.lens[s].copy()  # one pass over the slots' headers (a page apart at large K)
            tag = ((self.status[s] & TP_STATUS_VLAN_VALID) != 0) | (self.tcis[s] != 0)
            mine = self.pkttypes[s] != PACKET_OUTGOING
            fits = (lens == width) if out is None else (lens <= width)
            good = fits & (self.snaplens[s] == lens) & ~tag & mine
            keep = int(np.count_nonzero(good))
            macs = self.macs[s]
            mac = int(macs[0])
            # Only the longest frame's bytes: a batch of short frames in wide rows copies no more.
            w = width if out is None or not keep else int(lens.max() if keep == m else lens[good].max())
            if keep == m and (macs == mac).all():  # the usual case: one strided copy
                buf[rows : rows + m, :w] = self.slots[s, mac : mac + w]
            elif keep:
                at = rows + np.cumsum(good) - 1
                for mac in np.unique(macs[good]).tolist():
                    sel = np.flatnonzero(good & (macs == mac))
                    buf[at[sel], :w] = self.slots[k + sel, mac : mac + w]
            if out is not None:
                out[rows : rows + keep] = lens if keep == m else lens[good]
            tagged += int(np.count_nonzero(tag & mine))
            odd = np.flatnonzero(~good & ~tag & mine)
            other += sum(self._mindp(k + int(i)) for i in odd)  # rare: a frame at a time
            self.release(m)  # after their frames were copied
            rows += keep
        return rows - start, tagged, other

    def _take_run(self, k: int, m: int, buf: np.ndarray, row: int, out: np.ndarray | None) -> bool:
        """receive_rows' common case, in a few numpy calls: the m slots from k on all owned, every
        frame good (untagged, not ours, whole, of the rows' width; with `out`, of up to it) and at
        one offset: their frames copied into rows row.. of `buf` (lengths into `out`); True. Else
        nothing done, False (the general path sorts them out)."""
        run = self._good_run(k, m, buf.shape[1], out is None)
        if run is None:
            return False
        mac, w, sizes = run
        if out is not None:
            out[row : row + m] = sizes
        buf[row : row + m, :w] = self.slots[k : k + m, mac : mac + w]
        return True

    def _good_run(self, k: int, m: int, width: int, exact: bool) -> tuple[int, int, np.ndarray | int] | None:
        """Whether the m slots from k on are all owned and hold good frames (untagged, not ours,
        whole) at one offset, each `width` bytes long (`exact`) or up to it: (their offset, the
        longest frame's length, each frame's length or their one length); None when not."""
        # Owned first, in a call of its own: a header is read only once its status said it is ours.
        if not np.bitwise_and.reduce(self.status[k : k + m]) & TP_STATUS_USER:
            return None
        heads = self._heads[k : k + m]
        first = heads[0]
        same = (heads == first).all(axis=0).tolist()  # per word: the run's slots all alike
        status, size, snap, at, _, _, tag, _, _, _, link = first.tolist()
        if not (same[STATUS] and same[OFFSETS] and same[TAG_WORD] and same[LINK] and not tag
                and not status & TP_STATUS_VLAN_VALID and (link >> 16) & 0xFF != PACKET_OUTGOING):
            return None
        if same[LEN] and same[SNAPLEN]:
            if snap != size or size > width or (exact and size != width):
                return None
            return at & 0xFFFF, size, size
        if exact:
            return None
        sizes = heads[:, LEN]
        w = int(sizes.max())
        if w > width or not (sizes == heads[:, SNAPLEN]).all():
            return None
        return at & 0xFFFF, w, sizes

    def waiting_rows(self, width: int, most: int) -> np.ndarray | None:
        """receive_rows' common case without its copy: the waiting frames from the head on (up to
        `most`, not past the ring's end), when all are good frames of exactly `width` bytes at
        one offset, as the rows of a view of the ring's memory. None otherwise (none waits, or
        receive_rows has frames to sort out). The slots stay the reader's, and the view valid,
        until `release(len(rows))`."""
        k = int(self.head[0]) % self.frames
        m = self._run(k, most)
        run = self._good_run(k, m, width, True) if m else None
        if run is None:
            return None
        return self.slots[k : k + m, run[0] : run[0] + width]

    def release(self, m: int) -> None:
        """Hand the m slots from the head on (waiting_rows' view) back to the kernel."""
        head = int(self.head[0])
        k = head % self.frames
        self.status[k : k + m] = 0
        self.head[0] = head + m

    def _mindp(self, k: int) -> bool:
        """Slot k holds a mindp frame (is_mindp), whatever its length."""
        mac = int(self.macs[k])
        return bool(is_mindp(self.slots[k : k + 1, mac : mac + MINDP_PREFIX], self.snaplens[k : k + 1])[0])

    def frames_waiting(self, limit: int) -> tuple[list[bytes], int]:
        """Up to `limit` waiting frames as bytes, in order: (frames that carried no VLAN tag, frames
        that did, dropped). The per-frame form of receive_rows (frames of any length)."""
        frames: list[bytes] = []
        tagged = 0
        while len(frames) + tagged < limit:
            head = int(self.head[0])
            k = head % self.frames
            status = int(self.status[k])
            if not status & TP_STATUS_USER:
                break
            n, mac = int(self.snaplens[k]), int(self.macs[k])
            if self.pkttypes[k] != PACKET_OUTGOING:
                if status & TP_STATUS_VLAN_VALID or self.tcis[k]:
                    tagged += 1
                else:
                    frames.append(self.slots[k, mac : mac + n].tobytes())
            self.status[k] = 0
            self.head[0] = head + 1
        return frames, tagged

    def receive(self, buf: np.ndarray, lens: np.ndarray, start: int, want: int, limit: int,
                outgoing: bool) -> tuple[int, int]:
        """Up to `want` waiting frames into rows start.. of `buf` (their lengths into `lens`), each
        with the VLAN tag the kernel took off put back; (frames kept, frames dropped as longer
        than `limit` bytes, super-frames cut). `outgoing`: leave out our own transmissions
        (kernels before 4.20). With `vnet`, a super-frame becomes its frames, taken only while rows
        are left for all of them, and a partial checksum is completed (mindp/vnet.py); a
        super-frame that is no UDP one, or would make more frames than `want`, counts as too long."""
        head, kept, too_long, cut, end = int(self.head[0]), start, 0, 0, start + want
        try:
            while kept < end:
                k = head % self.frames
                status = int(self.status[k])
                if not status & TP_STATUS_USER:
                    break
                v = vn.Vnet.parse(self.slots[k, int(self.macs[k]) - vn.VNET_LEN:]) if self.vnet else None
                if v is not None and v.gso_type != vn.GSO_NONE:
                    n, mac, snap = int(self.lens[k]), int(self.macs[k]), int(self.snaplens[k])
                    hdr = vn.udp_layout(self.slots[k, mac:mac + snap], n, v) if snap >= 34 else None  # headers in the slot
                    count = vn.segment_count(n, hdr, v) if hdr else 0
                    if kept > start and count > end - kept:
                        break  # the next call takes it with room for all its frames
                    head += 1
                    frames = self._segments(k, status, v, limit if 0 < count <= end - kept else 0)
                    self.status[k] = 0
                    if frames is None:
                        too_long += 1
                    elif not (outgoing and self.pkttypes[k] == PACKET_OUTGOING):
                        cut += 1
                        for f in frames:
                            buf[kept, :len(f)] = f
                            lens[kept] = self._tag(k, status, buf[kept], len(f))
                            kept += 1
                    continue
                head += 1
                n = self._take(k, status, buf[kept], limit)
                self.status[k] = 0
                if n < 0:
                    too_long += n == TOO_LONG
                    continue
                if outgoing and self.pkttypes[k] == PACKET_OUTGOING:
                    continue
                if v is not None and v.needs_csum:
                    vn.complete(buf[kept], n, v.csum_start, v.csum_offset)
                lens[kept] = self._tag(k, status, buf[kept], n)
                kept += 1
        finally:
            self.head[0] = head
        return kept - start, too_long, cut

    def _tag(self, k: int, status: int, row: np.ndarray, n: int) -> int:
        """The VLAN tag the kernel took off slot k's frame (row[:n]) put back in it; its length."""
        if status & TP_STATUS_VLAN_VALID and n >= 12:
            tpid = int(self.tpids[k]) if status & TP_STATUS_VLAN_TPID_VALID else ETH_P_8021Q
            row[12 + TAG:n + TAG] = row[12:n]  # numpy copies overlapping ranges as if through a buffer
            row[12:12 + TAG] = np.frombuffer(struct.pack("!HH", tpid, int(self.tcis[k])), np.uint8)
            n += TAG
        return n

    def _segments(self, k: int, status: int, v: vn.Vnet, limit: int) -> list[np.ndarray] | None:
        """Slot k's super-frame (whole in the slot, or waiting in the socket's queue: read either
        way, so the queue stays in step with the ring) as its segments, or None: gone, cut short,
        no UDP super-frame, or a segment longer than `limit`."""
        if status & TP_STATUS_COPY:
            try:
                got = self.sock.recvmsg_into([self._vbuf, self._big], 0, socket.MSG_TRUNC | socket.MSG_DONTWAIT)[0]
            except OSError:
                return None
            n = got - vn.VNET_LEN
            if n > len(self._big):
                return None
            frame = self._big
        else:
            n, mac = int(self.lens[k]), int(self.macs[k])
            if int(self.snaplens[k]) != n:
                return None
            frame = self.slots[k, mac:mac + n]
        hdr = vn.udp_layout(frame, n, v)
        if hdr is None or hdr + min(v.gso_size, n - hdr) > limit:
            return None
        return vn.segments(frame, n, v)

    def _take(self, k: int, status: int, row: np.ndarray, limit: int) -> int:
        """Slot k's frame into `row`: its length, TOO_LONG, or GONE (the link went down before a
        frame that waited in the socket's queue was read)."""
        if status & TP_STATUS_COPY:
            try:
                if self.vnet:  # the virtio_net_hdr comes first here too (it is in the slot as well)
                    n = self.sock.recvmsg_into([self._vbuf, memoryview(row)[:limit]], 0,
                                               socket.MSG_TRUNC | socket.MSG_DONTWAIT)[0] - vn.VNET_LEN
                else:
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
        self.macs = self.tcis = self.tpids = self.pkttypes = self._heads = None
        self._words.release()
        self.mem.close()
