"""Raw AF_PACKET sockets for the agents: open, batch receive, send with counted errors.

An agent's socket receives through a PACKET_MMAP ring (mindp.rxring), set up by `enable_auxdata`
before traffic, in slots of the longest frame (SUM: K int64): every receive function here reads
the ring where the socket has one. A burst of plain UDP frames leaves as UDP GSO super-frames
(host_agent.udpgso) where the socket has a sender. Elsewhere (the ring cannot be set up, RING off;
no GSO sender), bursts go through sendmmsg/recvmmsg (ctypes, one system
call for up to 1024 frames, the message vectors built once and only the rows of each call written,
with numpy) where libc has them and pointers are 64-bit; elsewhere the same functions loop over
send/recvmsg_into.
"""
from __future__ import annotations

import errno
import os
import random
import socket
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field

import numpy as np

from host_agent import udpgso
from mindp import mmsg, rxring
from mindp.netutil import IFF_UP, hold_udp_port, interface_flags, mtu_problem, packet_socket
from mindp.protocol import Kind, frame_len, link_mtu
from mindp.switch_constants import POOL_SLOTS

SOL_PACKET = 263
PACKET_AUXDATA = 8
PACKET_IGNORE_OUTGOING = 23
#: Receive through a PACKET_MMAP ring where one can be set up (False: recvmmsg, as before the ring;
#: bench/worker.py runs both).
RING = True
#: An agent's ring: RING_BYTES, or more to hold RING_FRAMES: at K = 32 (512-byte slots) 32,768
#: frames in 16 MiB, at K = 1,024 (12 KiB slots) 2,048 in 24 MiB. Frames in flight to a host are at
#: most the switch's slots (each answered once, plus resends), so twice the pool holds them all.
RING_BYTES = 16 << 20
RING_FRAMES = 2 * POOL_SLOTS
#: recv's limit without a ring: the longest frame a link of ours carries (its MTU, an Ethernet
#: header and a VLAN tag), and a byte more, so that a longer one, cut short, never passes for it.
MAX_FRAME = link_mtu() + 14 + 4 + 1
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
RCVBUF = 16 << 20  # asked; the kernel doubles it
AUXDATA = mmsg.AUXDATA
TP_STATUS_VLAN_VALID = 1 << 4
AUX_SPACE = mmsg.AUX_SPACE
SEND_ERRNOS = (errno.ENOBUFS, errno.EAGAIN, errno.ENETDOWN)  # a frame lost, counted (then raise_if_link_down)
#: Errors of a socket whose link went down or away: retried, never fatal.
LINK_ERRNOS = (errno.ENETDOWN, errno.ENXIO, errno.ENODEV)
#: Retry interval while the link is down: first, most (doubling in between).
LINK_BACKOFF = (0.05, 2.0)
_MMSG = mmsg.CALLS  # (sendmmsg, recvmmsg), or None: per-frame loops
MMSG = _MMSG is not None  # sendmmsg/recvmmsg in use


class SocketError(RuntimeError):
    pass


def open_raw(iface: str) -> socket.socket:
    """A non-blocking raw socket on `iface` (in this process's namespace), deaf to its own sends."""
    too_small = mtu_problem(iface)
    if too_small:
        raise SocketError(too_small)
    try:
        s = packet_socket(iface)
    except PermissionError:
        raise SocketError("raw sockets need root (CAP_NET_RAW)") from None
    except OSError as exc:
        raise SocketError(f"cannot open a raw socket on {iface!r}: {exc.strerror or exc}") from None
    prepare(s)
    udpgso.attach(s)
    return s


def udp_guard() -> socket.socket | None:
    """Hold mindp's UDP port so our kernel sends no ICMP port-unreachable for the frames we
    take raw; None if it cannot be held (e.g. already held without SO_REUSEADDR)."""
    try:
        return hold_udp_port()
    except OSError:
        return None


def prepare(s: socket.socket) -> None:
    """Non-blocking, large receive buffer, own outgoing frames not looped back."""
    s.setblocking(False)
    # The receive path without a ring (a ring holds RING_BYTES of its own): 32 MiB of kernel buffer
    # (the kernel doubles what is asked) holds 26,215 SUM frames at K = 32 (1,280 bytes each with
    # the skb's overhead on a veth), 2,558 at K = 1,024: more than the frames in flight to a host
    # (RING_FRAMES). Past net.core.rmem_max only root may ask (SO_RCVBUFFORCE).
    try:
        s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
    except OSError:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    try:
        s.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    except OSError:
        pass  # older kernel: own frames are rejected by the decoder instead


@dataclass
class _Ring:
    """A socket's receive ring (None: it could not be set up) and the frames that were queued on
    the socket before (the kernel drops them when it sets a ring up: taken out first, they are
    handed out first)."""

    ring: rxring.RxRing | None
    queued: list[bytes] = field(default_factory=list)

    def pending(self, limit: int) -> list[bytes]:
        out, self.queued = self.queued[:limit], self.queued[limit:]
        return out


_rings: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # socket -> _Ring


def ring_of(s: socket.socket) -> rxring.RxRing | None:
    """The receive ring `enable_auxdata` gave `s`, if any."""
    r = _rings.get(s)
    return r.ring if r is not None else None


def ring_size() -> tuple[int, int]:
    """An agent's ring: (bytes of a slot, slots)."""
    frame = rxring.slot_bytes(frame_len(Kind.SUM))
    return frame, max(RING_FRAMES, RING_BYTES // frame)


def _attach_ring(s: socket.socket) -> bool:
    """Give packet socket `s` a receive ring of RING_BYTES in slots of the longest frame (SUM: K
    int64), the frames already queued on it taken out first; False where none can be set up."""
    if s in _rings:
        return _rings[s].ring is not None
    if not RING or getattr(s, "family", None) != socket.AF_PACKET:
        return False
    queued = []
    while True:
        try:
            queued.append(s.recv(MAX_FRAME))
        except (BlockingIOError, InterruptedError):
            break
    try:
        ring = rxring.RxRing(s, *ring_size(), copy_long=False)
    except (OSError, ValueError):  # an old kernel, no memory: recvmmsg then
        ring = None
    _rings[s] = _Ring(ring, queued)
    return ring is not None


def _raise_pending_error(s: socket.socket) -> None:
    """A ring receive makes no system call, so a socket error the kernel set (ENETDOWN: the link
    went down) is never reported by one: read it where the ring had nothing, and raise it as a
    receive call would have (select keeps waking for it until it is read)."""
    err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if err:
        raise OSError(err, os.strerror(err))


def raise_if_link_down(s: socket.socket) -> None:
    """Where sends failed: raise the error of a link that went down, as a receive would. A send
    that is under way as the link goes down can take the socket's pending ENETDOWN for itself (the
    kernel's packet_snd checks the interface, then reads the socket's error as it allocates the
    frame), and no receive then ever reports it: ask the socket, then the interface itself."""
    _raise_pending_error(s)
    if s.family != socket.AF_PACKET:
        return
    name = s.getsockname()[0]
    if not name:  # unbound by the kernel: the interface is gone
        raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))
    if not interface_flags(s, name) & IFF_UP:
        raise OSError(errno.ENETDOWN, os.strerror(errno.ENETDOWN))


def _queued(s: socket.socket, limit: int) -> tuple[list[bytes], rxring.RxRing | None]:
    """Frames queued before `s` got its ring (up to `limit`), and the ring."""
    r = _rings.get(s)
    if r is None:
        return [], None
    return (r.pending(limit) if r.queued else []), r.ring


def recv_batch(s: socket.socket, limit: int = 1024) -> list[bytes]:
    """Up to `limit` waiting frames (on a ring: those that carried no VLAN tag)."""
    frames, ring = _queued(s, limit)
    if ring is not None:
        frames += ring.frames_waiting(limit - len(frames))[0]
        if not frames:
            _raise_pending_error(s)
        return frames
    while len(frames) < limit:
        try:
            frames.append(s.recv(MAX_FRAME))
        except (BlockingIOError, InterruptedError):
            break
    return frames


def enable_auxdata(s: socket.socket) -> bool:
    """Make `s`'s receive functions tell frames that carried a VLAN tag the kernel stripped: by its
    receive ring (set up now: call before traffic), else by PACKET_AUXDATA, the kernel saying so
    per received frame; False where the socket is not AF_PACKET (test socket pairs)."""
    if _attach_ring(s):
        return True
    try:
        s.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
    except OSError:
        return False
    return True


def was_tagged(ancdata) -> bool:
    """Whether a frame's PACKET_AUXDATA says the kernel stripped an 802.1Q/802.1ad tag from it."""
    for level, kind, data in ancdata:
        if level == SOL_PACKET and kind == PACKET_AUXDATA and len(data) >= AUXDATA.size:
            status, _, _, _, _, tci, _ = AUXDATA.unpack_from(data)
            return bool(status & TP_STATUS_VLAN_VALID) or tci != 0
    return False


def recv_batch_untagged(s: socket.socket, limit: int = 1024) -> tuple[list[bytes], int]:
    """Like recv_batch on a socket with enable_auxdata: (frames that carried no VLAN tag, number
    of tagged frames dropped). A tagged frame never counts as mindp traffic: the kernel strips the
    tag, so without this a forged frame on another VLAN would look like one of ours."""
    frames, ring = _queued(s, limit)
    if ring is not None:
        more, tagged = ring.frames_waiting(limit - len(frames))
        if not frames and not more and not tagged:
            _raise_pending_error(s)
        return frames + more, tagged
    tagged = 0
    recvmsg = s.recvmsg
    while len(frames) + tagged < limit:
        try:
            data, anc, _, _ = recvmsg(MAX_FRAME, AUX_SPACE)
        except (BlockingIOError, InterruptedError):
            break
        if anc and was_tagged(anc):
            tagged += 1
        else:
            frames.append(data)
    return frames, tagged


class RowReceiver:
    """recvmmsg into the rows of a preallocated (n, width) uint8 buffer: the message vector, its
    iovecs and one control buffer per row are built once; a receive is one system call per up
    to 1024 frames and a few vectorised checks (length, truncation, VLAN tag)."""

    def __init__(self, buf: np.ndarray, auxdata: bool):
        self.buf = buf
        self.width = buf.shape[1]
        self.auxdata = auxdata
        self.vectors = mmsg.Vectors(buf, control=auxdata)

    def receive(self, fd: int, lens: np.ndarray | None = None) -> tuple[int, int, int]:
        """Frames waiting on `fd` into buf's rows, the good ones first; (rows filled, tagged
        frames dropped, frames of another length dropped). With `lens`, frames of up to the
        rows' width, their lengths into `lens`."""
        vec, n = self.vectors, len(self.buf)
        rows = tagged = other = 0
        while rows < n:
            want = min(n - rows, mmsg.MAX)
            got = vec.recv(fd, rows, want)
            if not got:
                break
            good = (vec.flags[rows : rows + got] & socket.MSG_TRUNC) == 0  # a longer frame is cut to its row
            if lens is None:
                good &= vec.lens[rows : rows + got] == self.width
            n_vlan = 0
            if self.auxdata:
                vlan = vec.aux_valid(rows, got) & (((vec.status[rows : rows + got] & TP_STATUS_VLAN_VALID) != 0)
                                                   | (vec.control["tci"][rows : rows + got] != 0))
                n_vlan = int(np.count_nonzero(vlan))
                good &= ~vlan
            keep = int(np.count_nonzero(good))
            tagged += n_vlan
            other += got - keep - n_vlan
            if keep < got:  # close the gaps: good rows stay contiguous
                self.buf[rows : rows + keep] = self.buf[rows : rows + got][good]
            if lens is not None:
                lens[rows : rows + keep] = vec.lens[rows : rows + got][good]
            rows += keep
            if got < want:
                break
        return rows, tagged, other


def waiting_rows(s: socket.socket, width: int, most: int) -> tuple[rxring.RxRing, np.ndarray] | None:
    """The frames waiting in `s`'s ring, read where the kernel put them: (the ring, rows of a view
    of its memory), when at least one waits and recv_rows_untagged would take them all as they are
    (good frames of exactly `width` bytes; RxRing.waiting_rows); the caller hands the slots back
    with ring.release(len(rows)). None otherwise (no ring, frames queued before it, nothing or
    anything else waiting): recv_rows_untagged then copies, sorts out and raises as it does."""
    r = _rings.get(s)
    if r is None or r.ring is None or r.queued:
        return None
    rows = r.ring.waiting_rows(width, most)
    return None if rows is None else (r.ring, rows)


def recv_rows_untagged(s: socket.socket, buf: np.ndarray, receiver: RowReceiver | None = None,
                       lens: np.ndarray | None = None) -> tuple[int, int, int]:
    """Receive frames of exactly buf.shape[1] bytes straight into the rows of `buf` (no bytes
    object per frame), as recv_batch_untagged does; returns (rows filled, tagged frames dropped,
    frames of another length dropped). With `lens` (one per row of `buf`), frames of up to
    buf.shape[1] bytes, their lengths into `lens`. From the socket's ring where it has one; else
    with `receiver` (over the same buffer) by recvmmsg, else frame by frame."""
    width = buf.shape[1]
    rows = tagged = other = 0
    queued, ring = _queued(s, len(buf))
    for f in queued:
        if len(f) == width or (lens is not None and len(f) < width):
            buf[rows, : len(f)] = np.frombuffer(f, np.uint8)
            if lens is not None:
                lens[rows] = len(f)
            rows += 1
        else:
            other += 1
    if ring is not None:
        n, t, o = ring.receive_rows(buf, rows, lens)
        if not (rows or n or t or o):
            _raise_pending_error(s)
        return rows + n, tagged + t, other + o
    if receiver is not None and _MMSG and not rows:
        return receiver.receive(s.fileno(), lens)
    mv = memoryview(buf).cast("B")
    recvmsg_into = s.recvmsg_into
    limit = len(buf)
    while rows < limit:
        try:
            n, anc, flags, _ = recvmsg_into([mv[rows * width : (rows + 1) * width]], AUX_SPACE)
        except (BlockingIOError, InterruptedError):
            break
        if anc and was_tagged(anc):
            tagged += 1
        elif flags & socket.MSG_TRUNC or (n != width and lens is None):
            other += 1
        else:
            if lens is not None:
                lens[rows] = n
            rows += 1
    return rows, tagged, other


class LinkWatch:
    """An agent's link (`ip link set down`, a pulled cable, a vanished interface): the first
    ENETDOWN/ENXIO/ENODEV of a send or receive is one line and each one a wait that doubles while
    the link stays down; `alive` (a frame through again: the caller decides what proves it) is one line more. Other errors re-raise."""

    def __init__(self, prog: str, log=None, clock=time.monotonic, sleep=time.sleep):
        self.prog = prog
        self.log = log
        self.clock = clock
        self.sleep = sleep
        self.down_since: float | None = None
        self.backoff = LINK_BACKOFF[0]
        self.downs = 0  # times the link went down

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def failed(self, exc: OSError) -> None:
        if exc.errno not in LINK_ERRNOS:
            raise exc
        if self.down_since is None:
            self.down_since = self.clock()
            self.downs += 1
            print(f"{self.prog}: link down ({exc.strerror}); retrying every {LINK_BACKOFF[0]}-{LINK_BACKOFF[1]} s",
                  file=self.log or sys.stderr, flush=True)
        self.sleep(self.backoff)
        self.backoff = min(self.backoff * 2, LINK_BACKOFF[1])

    def alive(self) -> None:
        """A frame went through: the link is back, if it was down."""
        if self.down_since is not None:
            print(f"{self.prog}: link back after {self.clock() - self.down_since:.1f} s", file=self.log or sys.stderr,
                  flush=True)
            self.down_since, self.backoff = None, LINK_BACKOFF[0]


class Faults:
    """Seeded fault injection on an agent's own paths (tests): drop on send and receive;
    duplicate and reorder on send (a reordered frame goes out after the next batch)."""

    def __init__(self, drop_send: float = 0.0, drop_recv: float = 0.0, seed: int = 0, dup: float = 0.0,
                 reorder: float = 0.0):
        for p in (drop_send, drop_recv, dup, reorder):
            if not 0.0 <= p < 1.0:
                raise ValueError(f"fault probability must be in [0, 1), got {p}")
        self.drop_send = drop_send
        self.drop_recv = drop_recv
        self.dup = dup
        self.reorder = reorder
        self.rng = random.Random(seed)
        self.held: list[bytes] = []
        self.dropped_send = self.dropped_recv = self.duplicated = self.reordered = 0

    def copies(self, frame) -> int:
        """How many times to send `frame` now (0: dropped or held back for later)."""
        r = self.rng.random
        if self.drop_send and r() < self.drop_send:
            self.dropped_send += 1
            return 0
        if self.reorder and r() < self.reorder:
            self.reordered += 1
            self.held.append(bytes(frame))
            return 0
        if self.dup and r() < self.dup:
            self.duplicated += 1
            return 2
        return 1

    def release(self, send) -> int:
        """Send the frames held back now (an agent with nothing else to send: a reordered frame goes
        after later ones, not seconds later, which its receivers would time as a round trip)."""
        held, self.held = self.held, []
        _send_each(send, held)
        return len(held)

    def filter_recv(self, frames: list[bytes]) -> list[bytes]:
        if not self.drop_recv:
            return frames
        kept = [f for f in frames if self.rng.random() >= self.drop_recv]
        self.dropped_recv += len(frames) - len(kept)
        return kept


_tx = threading.local()  # each thread's mmsg.SendVector


def _send_mmsg(fd: int, frames: np.ndarray, rows, lens=None) -> tuple[int, int]:
    """_send_plain by sendmmsg: this thread's reused message vector gets the addresses (kept per
    buffer, mmsg.row_addresses) and lengths of just the rows asked, then one system call per up to
    1024 frames; a frame the kernel refuses (full queue, link down) is counted and skipped, as by
    _send_plain."""
    at = mmsg.row_addresses(frames)
    if type(rows) is range and rows.step > 0 and rows.start >= 0 and (not rows or rows[-1] < len(at)):
        pick = slice(rows.start, rows.stop, rows.step)  # the same rows, as a slice: no index array
        n = len(rows)
    else:
        pick = np.asarray(rows, dtype=np.intp).reshape(-1)
        n = len(pick)
    if not n:
        return 0, 0
    vec = getattr(_tx, "vec", None)
    if vec is None:
        vec = _tx.vec = mmsg.SendVector()
    vec.reserve(n)
    vec.base[:n] = at[pick]
    if lens is None:
        vec.set_lengths(n, frames.shape[1])
    else:
        vec.lens[:n] = np.asarray(lens)[pick]
        vec.uniform = (0, 0)
    return n, len(mmsg.send_at(fd, vec.address, n, SEND_ERRNOS))


def _send_each_row(s: socket.socket, frames: np.ndarray, rows, lens=None) -> tuple[int, int]:
    if _MMSG:
        return _send_mmsg(s.fileno(), frames, rows, lens)
    return _send_plain(s.send, frames, rows, lens)


def _send_plain(send, frames: np.ndarray, rows, lens=None) -> tuple[int, int]:
    """send_rows without fault injection: slices of one flat memoryview (no numpy row objects),
    one try block for the whole batch (re-entered only after a failed send)."""
    width = frames.shape[1]
    mv = memoryview(frames).cast("B")
    rows = list(rows)
    sizes = [width] * len(rows) if lens is None else [int(lens[r]) for r in rows]
    failed = 0
    i = 0
    while i < len(rows):
        try:
            for i in range(i, len(rows)):
                o = rows[i] * width
                send(mv[o : o + sizes[i]])
            break
        except OSError as exc:
            if exc.errno not in SEND_ERRNOS:
                raise
            failed += 1
            i += 1
    return len(rows), failed


def send_rows(s: socket.socket, frames: np.ndarray, rows, faults: Faults | None = None,
              lens=None) -> tuple[int, int]:
    """Send frames[rows] (each its first lens[row] bytes, if given); returns (sent, failed). A full
    queue counts as a loss (retransmission covers it). Rows (a range, list or index array) of
    equal length and header leave as UDP GSO super-frames where `s` has a sender (udpgso)."""
    if faults is None and frames.flags.c_contiguous:
        g = udpgso.sender(s)
        if g is not None:
            pick = np.asarray(rows, dtype=np.intp).reshape(-1)
            if len(pick) > 1:
                done, failed = g.send(frames, pick, SEND_ERRNOS, lens)
                if done < len(pick):  # the kernel will not segment: the rest frame by frame
                    failed += _send_each_row(s, frames, pick[done:], lens)[1]
                return len(pick), failed
        return _send_each_row(s, frames, rows, lens)
    sent = failed = 0
    send = s.send
    held = []
    if faults is not None:
        held, faults.held = faults.held, []
    for r in rows:
        frame = frames[r] if lens is None else frames[r, : int(lens[r])]
        n = 1 if faults is None else faults.copies(frame)
        sent += 1  # as far as the sender knows, it left
        for _ in range(n):
            try:
                send(frame)
            except OSError as exc:
                if exc.errno not in (errno.ENOBUFS, errno.EAGAIN, errno.ENETDOWN):
                    raise
                failed += 1
    _send_each(send, held)  # frames held back by the previous call now go after this batch
    return sent, failed


def _send_each(send, frames: list[bytes]) -> None:
    for frame in frames:
        try:
            send(frame)
        except OSError:
            pass
