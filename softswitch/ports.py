"""Switch ports: AF_PACKET raw sockets bound to interfaces, and pcap capture files.

Frames move in batches: `receive` takes up to a batch of waiting frames from the port's receive
ring (mindp/rxring.py) into the slots of a `Batch`, `send_batch` sends a port's share of an
output batch with one sendmmsg (mindp.mmsg; a loop over send where libc lacks it). `send` sends one
frame (packet-in/out, fault injection).

The kernel strips a received frame's outer VLAN tag (802.1Q or 802.1ad) before a packet socket sees
it and reports the tag beside the frame; a port puts the tag back in the frame's slot, so the P4
parser (and the pcap) see the bytes that were on the wire, as BMv2 does.
"""
from __future__ import annotations

import logging
import socket
import struct
import time

import numpy as np

from mindp import mmsg
from mindp import vnet as vn
from mindp.netutil import mtu_problem, packet_socket
from mindp.rxring import SOL_PACKET, TAG, RxRing

from .batch import Batch

PACKET_IGNORE_OUTGOING = 23  # Linux >= 4.20: do not hand our own transmissions back
SO_RCVBUFFORCE = 33  # root may pass net.core.rmem_max
SNAPLEN = 262144  # a pcap's snapshot length: libpcap's maximum, so no frame (up to a slot) is cut
log = logging.getLogger("softswitch")


class PortError(OSError):
    pass


class Port:
    """One switch port on a network interface."""

    def __init__(self, number: int, iface: str, pcap_dir: str | None = None):
        self.number = number
        self.iface = iface
        self.rx = self.tx = self.tx_errors = 0
        self.rx_truncated = 0  # frames longer than a batch slot: dropped
        self.rx_cut = 0  # super-frames from the host cut into their frames (mindp/vnet.py), each in rx
        self._txv = None  # (batch buffer, its message vector) for sendmmsg
        self.pcap_errors = 0  # failed capture writes; the first one ends this port's capture
        too_small = mtu_problem(iface)
        if too_small:
            raise PortError(f"port {number}: {too_small}")
        try:
            s = packet_socket(iface)
        except PermissionError:
            raise PortError(f"port {number}: raw sockets need root (CAP_NET_RAW)") from None
        except OSError as exc:
            raise PortError(f"port {number}: interface {iface!r}: {exc.strerror}") from None
        try:
            s.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
            self.filter_outgoing = False
        except OSError:
            self.filter_outgoing = True  # old kernel: drop PACKET_OUTGOING frames by hand
        try:  # frames too long for the ring (a host's super-frames, up to 64 KB) wait here
            s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 32 << 20)
        except OSError:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
        s.setblocking(False)
        try:
            self.ring = RxRing(s, vnet=vn.kernel_supports())
        except OSError as exc:
            s.close()
            raise PortError(f"port {number}: interface {iface!r}: receive ring: {exc.strerror or exc}") from None
        self.sock = s
        # A socket with virtio_net_hdrs takes one before each frame it sends as well: the port
        # sends through a plain one then.
        self.tx_sock = sender(iface, vnet=False) if self.ring.vnet else s
        if self.tx_sock is None:
            self.ring.close()
            s.close()
            raise PortError(f"port {number}: interface {iface!r}: no socket to send on")
        self.paged_sock = sender(iface, vnet=True)
        self.pcap_in = self.pcap_out = None
        if pcap_dir:
            try:
                self.pcap_in = Pcap(f"{pcap_dir}/{iface}_in.pcap")
                self.pcap_out = Pcap(f"{pcap_dir}/{iface}_out.pcap")
            except OSError as exc:  # the port works without its capture
                self._capture_failed(exc)

    def fileno(self) -> int:
        return self.sock.fileno()

    def receive(self, batch: Batch, limit: int) -> int:
        """Up to `limit` waiting frames into `batch` from slot batch.n on (ingress port: this
        one); how many came. A frame too long for a slot is a counted drop (`rx_truncated`)."""
        start = batch.n
        want = min(limit, batch.capacity - start)
        if want <= 0:
            return 0
        got, too_long, cut = self.ring.receive(batch.buf, batch.lens, start, want, batch.slot - TAG,
                                               self.filter_outgoing)
        self.rx_truncated += too_long
        self.rx_cut += cut
        batch.ports[start:start + got] = self.number
        batch.n = start + got
        self.rx += got
        if self.pcap_in:
            try:
                for i in range(start, start + got):
                    self.pcap_in.write(batch.buf[i, :batch.lens[i]])
            except OSError as exc:
                self._capture_failed(exc)
        return got

    def clear_error(self) -> int:
        """Read (and so clear) the socket's pending error: ENETDOWN when the link went down. A ring
        receive never reads it, and until it is read epoll reports the socket ready."""
        return self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)

    def _vectors(self, batch: Batch) -> mmsg.Vectors:
        """The message vector over `batch`'s slots, built once per batch buffer."""
        if self._txv is None or self._txv[0] is not batch.buf:
            self._txv = (batch.buf, mmsg.Vectors(batch.buf))
        return self._txv[1]

    def send_batch(self, batch: Batch, rows: np.ndarray | None = None) -> int:
        """Send frames `rows` of `batch` (all it holds when None), in order; how many left. A frame
        the kernel refuses (full queue, link down, too big) is a counted drop (`tx_errors`)."""
        n = batch.n if rows is None else len(rows)
        if not n:
            return 0
        failed = self._send_mmsg(batch, rows) if mmsg.CALLS else self._send_plain(batch, rows)
        sent = n - len(failed)
        self.tx += sent
        self.tx_errors += len(failed)
        if self.pcap_out:
            skip = set(failed)
            try:
                for j, i in enumerate(range(n) if rows is None else rows.tolist()):
                    if j not in skip:
                        self.pcap_out.write(batch.buf[i, :batch.lens[i]])
            except OSError as exc:
                self._capture_failed(exc)
        return sent

    def _send_mmsg(self, batch: Batch, rows: np.ndarray | None) -> list[int]:
        vec = self._vectors(batch)
        if rows is None:  # the common case (one egress port): views, no gather
            n = batch.n
            vec.iov_lens[:n] = batch.lens[:n]
            msgs = vec.msgs[:n]
        else:
            vec.iov_lens[rows] = batch.lens[rows]
            msgs = vec.msgs[rows]
        return mmsg.send(self.tx_sock.fileno(), msgs)

    def _send_plain(self, batch: Batch, rows: np.ndarray | None) -> list[int]:
        failed = []
        for j, i in enumerate(range(batch.n) if rows is None else rows.tolist()):
            try:
                self.tx_sock.send(batch.buf[i, :batch.lens[i]])
            except OSError:
                failed.append(j)
        return failed

    def send(self, frame: bytes) -> bool:
        try:
            self.tx_sock.send(frame)
        except OSError:  # ENOBUFS, link down, too big: a counted drop
            self.tx_errors += 1
            return False
        self.tx += 1
        if self.pcap_out:
            try:
                self.pcap_out.write(frame)
            except OSError as exc:
                self._capture_failed(exc)
        return True

    def flush_pcaps(self) -> None:
        try:
            for p in (self.pcap_in, self.pcap_out):
                if p:
                    p.flush()
        except OSError as exc:
            self._capture_failed(exc)

    def _capture_failed(self, exc: OSError) -> None:
        """A full disk or an I/O error ends this port's capture, not the packet loop."""
        self.pcap_errors += 1
        log.error("port %d (%s): pcap: %s; capture of this port stopped", self.number, self.iface,
                  exc.strerror or exc)
        self._close_pcaps()

    def _close_pcaps(self) -> None:
        for p in (self.pcap_in, self.pcap_out):
            if p:
                try:
                    p.close()
                except OSError:
                    self.pcap_errors += 1
        self.pcap_in = self.pcap_out = None

    def close(self) -> None:
        self.ring.close()
        self.sock.close()
        if self.tx_sock is not self.sock:
            self.tx_sock.close()
        if self.paged_sock:
            self.paged_sock.close()
        self._close_pcaps()


def sender(iface: str, vnet: bool) -> socket.socket | None:
    """A socket that only sends on `iface`: with `vnet`, each frame after a virtio_net_hdr
    (PACKET_VNET_HDR), the C packet loop's way out for frames of a page or more (io.h says why);
    None where the kernel has no such option (the frames then take the port's other socket)."""
    try:
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    except OSError:
        return None
    try:
        if vnet:
            s.setsockopt(SOL_PACKET, vn.PACKET_VNET_HDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
        s.bind((iface, 0))  # protocol 0: it receives nothing
    except OSError:
        s.close()
        return None
    return s


class Pcap:
    """A classic pcap file (Ethernet link type) that Wireshark and tcpdump -r open."""

    HEADER = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, SNAPLEN, 1)

    def __init__(self, path: str):
        self.f = open(path, "wb")
        try:
            self.f.write(self.HEADER)
            self.f.flush()
        except OSError:
            self.f.close()
            raise

    def write(self, frame) -> None:
        """One record; `frame`: bytes or a uint8 array (a batch slot's frame)."""
        t = time.time()
        sec = int(t)
        self.f.write(struct.pack("<IIII", sec, int((t - sec) * 1e6), len(frame), len(frame)))
        self.f.write(frame)

    def flush(self) -> None:
        self.f.flush()

    def close(self) -> None:
        self.f.close()
