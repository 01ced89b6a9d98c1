"""Switch ports: AF_PACKET raw sockets bound to interfaces, and pcap capture files.

The kernel strips a received frame's outer VLAN tag (802.1Q or 802.1ad) before a packet socket sees
it and reports the tag in PACKET_AUXDATA; a port puts the tag back, so the P4 parser (and the
pcap) see the bytes that were on the wire, as BMv2 does.
"""
from __future__ import annotations

import errno
import logging
import socket
import struct
import time

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_IGNORE_OUTGOING = 23  # Linux >= 4.20: do not hand our own transmissions back
PACKET_OUTGOING = 4
PACKET_AUXDATA = 8
TP_STATUS_VLAN_VALID = 1 << 4
TP_STATUS_VLAN_TPID_VALID = 1 << 6
ETH_P_8021Q = 0x8100
AUXDATA = struct.Struct("=IIIHHHH")  # struct tpacket_auxdata
AUX_SPACE = socket.CMSG_SPACE(AUXDATA.size)
MAX_FRAME = 65535
log = logging.getLogger("softswitch")


def restore_vlan(frame: bytes, ancillary: list) -> bytes:
    """`frame` with the VLAN tag the kernel took off put back after the MAC addresses."""
    for level, kind, data in ancillary:
        if level == SOL_PACKET and kind == PACKET_AUXDATA and len(data) >= AUXDATA.size:
            status, _, _, _, _, tci, tpid = AUXDATA.unpack_from(data)
            if status & TP_STATUS_VLAN_VALID:
                tpid = tpid if status & TP_STATUS_VLAN_TPID_VALID else ETH_P_8021Q
                return frame[:12] + struct.pack("!HH", tpid, tci) + frame[12:]
    return frame


class PortError(OSError):
    pass


class Port:
    """One switch port on a network interface."""

    def __init__(self, number: int, iface: str, pcap_dir: str | None = None):
        self.number = number
        self.iface = iface
        self.rx = self.tx = self.tx_errors = 0
        self.pcap_errors = 0  # failed capture writes; the first one ends this port's capture
        try:
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        except PermissionError:
            raise PortError(f"port {number}: raw sockets need root (CAP_NET_RAW)") from None
        try:
            s.bind((iface, 0))
        except OSError as exc:
            s.close()
            raise PortError(f"port {number}: interface {iface!r}: {exc.strerror}") from None
        try:
            s.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
            self.filter_outgoing = False
        except OSError:
            self.filter_outgoing = True  # old kernel: drop PACKET_OUTGOING frames by hand
        s.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
        s.setblocking(False)
        self.sock = s
        self.pcap_in = self.pcap_out = None
        if pcap_dir:
            try:
                self.pcap_in = Pcap(f"{pcap_dir}/{iface}_in.pcap")
                self.pcap_out = Pcap(f"{pcap_dir}/{iface}_out.pcap")
            except OSError as exc:  # the port works without its capture
                self._capture_failed(exc)

    def fileno(self) -> int:
        return self.sock.fileno()

    def recv_batch(self, limit: int) -> list[bytes]:
        frames = []
        sock = self.sock
        try:
            for _ in range(limit):
                data, ancillary, _, addr = sock.recvmsg(MAX_FRAME, AUX_SPACE)
                if self.filter_outgoing and addr[2] == PACKET_OUTGOING:
                    continue
                frames.append(restore_vlan(data, ancillary) if ancillary else data)
        except BlockingIOError:
            pass
        except OSError as exc:
            if exc.errno not in (errno.ENETDOWN, errno.ENXIO, errno.EAGAIN):
                raise
        self.rx += len(frames)
        if self.pcap_in:
            try:
                for fr in frames:
                    self.pcap_in.write(fr)
            except OSError as exc:
                self._capture_failed(exc)
        return frames

    def send(self, frame: bytes) -> bool:
        try:
            self.sock.send(frame)
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
        self.sock.close()
        self._close_pcaps()


class Pcap:
    """A classic pcap file (Ethernet link type) that Wireshark and tcpdump -r open."""

    HEADER = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, MAX_FRAME, 1)

    def __init__(self, path: str):
        self.f = open(path, "wb")
        try:
            self.f.write(self.HEADER)
            self.f.flush()
        except OSError:
            self.f.close()
            raise

    def write(self, frame: bytes) -> None:
        t = time.time()
        sec = int(t)
        self.f.write(struct.pack("<IIII", sec, int((t - sec) * 1e6), len(frame), len(frame)))
        self.f.write(frame)

    def flush(self) -> None:
        self.f.flush()

    def close(self) -> None:
        self.f.close()
