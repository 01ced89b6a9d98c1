"""sendmmsg/recvmmsg through ctypes over the rows of a numpy buffer: one system call moves up to
1024 frames, and the message vector (struct mmsghdr, iovecs, per-message control buffers) is
built once with numpy, so no Python object is made per frame.

Shared by the agents' raw sockets (host_agent.rawsock), the embedded switch's ports (sending:
softswitch.ports) and the benches' loops (mindp.harness.loadgen). `CALLS` is None where libc lacks the
calls, pointers are not 64-bit, or MINDP_NO_MMSG=1; callers then loop over send/recvmsg_into.
"""
from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct
import weakref

import numpy as np

SOL_PACKET = 263
PACKET_AUXDATA = 8
MAX = 1024  # UIO_MAXIOV: messages per sendmmsg/recvmmsg call
# struct tpacket_auxdata: tp_status, tp_len, tp_snaplen, tp_mac, tp_net, tp_vlan_tci, tp_vlan_tpid
AUXDATA = struct.Struct("=IIIHHHH")
AUX_SPACE = socket.CMSG_SPACE(AUXDATA.size)
AUX_LEN = socket.CMSG_LEN(AUXDATA.size)

# struct mmsghdr on 64-bit Linux: struct msghdr (56 bytes) then msg_len, padded to 64.
MMSGHDR = np.dtype({"names": ["name", "namelen", "iov", "iovlen", "control", "controllen", "flags", "len"],
                    "formats": ["u8", "u4", "u8", "u8", "u8", "u8", "i4", "u4"],
                    "offsets": [0, 8, 16, 24, 32, 40, 48, 56], "itemsize": 64})
IOVEC = np.dtype({"names": ["base", "len"], "formats": ["u8", "u8"], "itemsize": 16})
# struct cmsghdr (len, level, type) then struct tpacket_auxdata, as recvmmsg leaves it per message.
CMSG_AUX = np.dtype({"names": ["len", "level", "type", "status", "tci", "tpid"],
                     "formats": ["u8", "i4", "i4", "u4", "u2", "u2"],
                     "offsets": [0, 8, 12, 16, 32, 34], "itemsize": AUX_SPACE})


def _libc_calls():
    if ctypes.sizeof(ctypes.c_void_p) != 8 or os.environ.get("MINDP_NO_MMSG") == "1":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        send, recv = libc.sendmmsg, libc.recvmmsg
    except (OSError, AttributeError):
        return None
    send.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
    recv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
    return send, recv


CALLS = _libc_calls()  # (sendmmsg, recvmmsg) or None


def _addresses(base: int, n: int, stride: int) -> np.ndarray:
    return np.uint64(base) + np.arange(n, dtype=np.uint64) * np.uint64(stride)


class SendVector:
    """A sendmmsg vector reused from send to send: message i always sends iovec i (wired once), so a
    send writes only the base and length of its own messages' iovecs. Grows to the largest send.
    Not shared between threads (host_agent.rawsock keeps one per thread)."""

    def __init__(self, n: int = 64):
        self._build(n)

    def _build(self, n: int) -> None:
        self.capacity = n
        self.iov = np.zeros(n, IOVEC)
        self.base, self.lens = self.iov["base"], self.iov["len"]
        self.msgs = np.zeros(n, MMSGHDR)
        self.msgs["iov"] = _addresses(self.iov.ctypes.data, n, IOVEC.itemsize)
        self.msgs["iovlen"] = 1
        self.address = self.msgs.ctypes.data
        self.uniform = (0, 0)  # (length, count): iovecs 0..count-1 all have that length

    def reserve(self, n: int) -> None:
        """Room for n messages (their iovecs' contents are then unset)."""
        if n > self.capacity:
            self._build(max(n, 2 * self.capacity))

    def set_lengths(self, n: int, length: int) -> None:
        """Messages 0..n-1 send `length` bytes each (written only where not already so)."""
        have, count = self.uniform
        if have != length or count < n:
            self.lens[:n] = length
            self.uniform = (length, max(n, count) if have == length else n)


_rows: dict[int, tuple] = {}  # id(buffer) -> (weakref to it, its shape, its rows' addresses)
_ROWS_KEPT = 16


def row_addresses(buf: np.ndarray) -> np.ndarray:
    """The address of each row of C-contiguous `buf` (uint64), kept per buffer object: a weak
    reference proves the buffer is the one the addresses were taken from (an array's data never
    moves while it lives; a resize changes its shape, also checked), so a freed buffer whose id is
    reused never gets stale addresses; its entry goes when it does."""
    key = id(buf)
    hit = _rows.get(key)
    if hit is not None and hit[0]() is buf and hit[1] == buf.shape:
        return hit[2]
    if len(_rows) >= _ROWS_KEPT:  # the oldest go (a copy of the keys: another thread may send too)
        for old in list(_rows)[: len(_rows) - _ROWS_KEPT + 1]:
            _rows.pop(old, None)
    addresses = _addresses(buf.ctypes.data, buf.shape[0], buf.strides[0])
    _rows[key] = (weakref.ref(buf, lambda _, key=key, rows=_rows: rows.pop(key, None)), buf.shape, addresses)
    return addresses


class Vectors:
    """A message vector over the rows of `buf` (n, width): message i reads or writes row i. With
    `control`, each message has room for a PACKET_AUXDATA control message (`self.control`)."""

    def __init__(self, buf: np.ndarray, control: bool = False):
        n, width = buf.shape
        self.buf = buf
        self.width = width
        self.iov = np.zeros(n, IOVEC)
        self.iov["base"] = _addresses(buf.ctypes.data, n, width)
        self.iov["len"] = width
        self.msgs = np.zeros(n, MMSGHDR)
        self.msgs["iov"] = _addresses(self.iov.ctypes.data, n, IOVEC.itemsize)
        self.msgs["iovlen"] = 1
        self.control = np.zeros(n, CMSG_AUX) if control else None
        if control:
            self.msgs["control"] = _addresses(self.control.ctypes.data, n, AUX_SPACE)
        # views of the fields read or written per call, made once (a field lookup costs more than its slice)
        self.lens = self.msgs["len"]
        self.flags = self.msgs["flags"]
        self.iov_lens = self.iov["len"]
        self.status = self.control["status"] if control else None

    def recv(self, fd: int, start: int, count: int) -> int:
        """Receive up to `count` waiting frames into rows start.. without blocking; how many came
        (0 when none waits). Each message's `len`, `flags` and control buffer tell the rest."""
        if self.control is not None:  # in: room for the control message; out: what it used
            self.msgs["controllen"][start:start + count] = AUX_SPACE
        got = CALLS[1](fd, self.msgs.ctypes.data + start * MMSGHDR.itemsize, min(count, MAX),
                       socket.MSG_DONTWAIT, None)
        if got < 0:
            err = ctypes.get_errno()
            if err in (errno.EAGAIN, errno.EINTR):
                return 0
            raise OSError(err, os.strerror(err))
        return got

    def aux_valid(self, start: int, got: int) -> np.ndarray:
        """Which of messages start..start+got carry PACKET_AUXDATA (their `status`, `tci` and
        `tpid` in `control` are this receive's, not left from an earlier one)."""
        aux = self.control[start:start + got]
        return ((self.msgs["controllen"][start:start + got] >= AUX_LEN) & (aux["level"] == SOL_PACKET)
                & (aux["type"] == PACKET_AUXDATA))


def send(fd: int, msgs: np.ndarray, refused: tuple[int, ...] | None = None) -> list[int]:
    """sendmmsg every message of `msgs` (a contiguous MMSGHDR array), up to 1024 per call; the
    positions of the messages the kernel refused. A refused message is skipped, not retried twice:
    with `refused`, only those errnos are; any other raises."""
    return send_at(fd, msgs.ctypes.data, len(msgs), refused)


def send_at(fd: int, base: int, n: int, refused: tuple[int, ...] | None = None) -> list[int]:
    """send over the n contiguous MMSGHDRs at address `base` (kept by the caller: an array's
    .ctypes.data costs microseconds)."""
    failed = []
    i = 0
    while i < n:
        r = CALLS[0](fd, base + i * MMSGHDR.itemsize, min(n - i, MAX), 0)
        if r < 0:
            err = ctypes.get_errno()
            if err == errno.EINTR:
                continue
            if refused is not None and err not in refused:
                raise OSError(err, os.strerror(err))
            failed.append(i)
            r = 1
        i += r
    return failed
