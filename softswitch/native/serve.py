"""The packet loop's fast path: io.h's `mindp_serve` receives, processes and sends batch after
batch in C until the ports run dry, where the Python loop (softswitch/dataplane.py) makes several
calls and numpy steps per batch. It covers the common case; anything else (fault injection, pcaps,
a CPU port, the per-packet trace, the Python pipeline, no sendmmsg) stays on the Python loop,
which the switch uses whenever `DataPlane.serve` returns None."""
from __future__ import annotations

import ctypes
import errno
import os

import numpy as np

from ..batch import Batch

WORDS = 24  # serve_t of io.h
COUNTS = 5  # its counters a port (SERVE_COUNTS)
BUDGET = 64  # batches per call: the control plane waits for the GIL at most this long


class ServeLoop:
    """The serve_t of `ports` over the batches `rx` and `tx`, kept alive while C holds addresses."""

    def __init__(self, ports: dict, rx: Batch, tx: Batch):
        self.ports = list(ports.values())
        self.fds = np.array([p.fileno() for p in self.ports], np.int32)
        self.send_fds = np.array([p.tx_sock.fileno() for p in self.ports], np.int32)
        self.paged_fds = np.array([p.paged_sock.fileno() if p.paged_sock else -1 for p in self.ports], np.int32)
        self.numbers = np.array([p.number for p in self.ports], np.int32)
        self.rings = np.array([p.ring.address for p in self.ports], np.uint64)
        self.heads = np.array([p.ring.head.ctypes.data for p in self.ports], np.uint64)
        # The C loop steps through every ring alike: the geometry each port's ring really has (a
        # ring's slots are whole blocks of them), one for all, or the loop is not usable.
        shapes = {(p.ring.frames, p.ring.frame) for p in self.ports}
        self.shape = shapes.pop() if len(shapes) == 1 else None
        vnets = {p.ring.vnet for p in self.ports}  # likewise every ring with virtio_net_hdrs, or none
        self.vnet = vnets.pop() if len(vnets) == 1 else None
        # ctypes, not numpy: read and cleared after every call, where numpy's per-call overhead
        # (any, tolist, .ctypes) was 13 of the 18 us a serve cost in Python, every wake-up
        self.counts = (ctypes.c_uint64 * (COUNTS * len(self.ports)))()  # per port: rx, tx, tx_errors, rx_truncated, rx_cut
        self.io = (ctypes.c_uint64 * 3)()  # rx, tx, frames for a port the switch lacks
        self._zero_counts = (0,) * len(self.counts)
        self.rx, self.tx = rx, tx
        self.words = np.zeros(WORDS, np.uint64)
        self._words = self.words.ctypes.data
        self._stats = None
        self._usable = False

    def address(self, stats_address: int) -> int:
        """serve_t's address, with the run_batch stats (the engine's runner's) at `stats_address`."""
        if self._stats != stats_address:
            rx, tx = self.rx, self.tx
            self.words[:] = [len(self.ports), BUDGET, self.fds.ctypes.data, self.numbers.ctypes.data,
                             ctypes.addressof(self.counts), self.rings.ctypes.data, self.heads.ctypes.data,
                             *self.shape, rx.buf.ctypes.data, rx.lens.ctypes.data,
                             rx.ports.ctypes.data, rx.slot, rx.capacity, tx.buf.ctypes.data, tx.lens.ctypes.data,
                             tx.ports.ctypes.data, tx.slot, tx.capacity, stats_address, ctypes.addressof(self.io),
                             self.paged_fds.ctypes.data, int(bool(self.vnet)), self.send_fds.ctypes.data]
            self._stats = stats_address
        return self._words

    def usable(self) -> bool:
        """Whether every port is one the C loop serves as the Python loop would: no capture, the
        kernel leaves out the switch's own transmissions, and all rings have one geometry and
        virtio_net_hdrs alike. Once true, true for good: a port's capture only ever stops
        (ports.py), and the rest is fixed when the port is made."""
        if not self._usable:
            self._usable = all(not (p.pcap_in or p.pcap_out or p.filter_outgoing) for p in self.ports) and \
                self.rx.slot == self.tx.slot and self.shape is not None and self.vnet is not None
        return self._usable

    def collect(self) -> tuple[int, int, int]:
        """Add the counts of the calls since the last collect to the ports; (rx, tx, no_port)."""
        counts = self.counts[:]
        if any(counts):
            for i, p in enumerate(self.ports):
                rx, tx, errors, truncated, cut = counts[COUNTS * i:COUNTS * i + COUNTS]
                if rx:
                    p.rx += rx
                if tx:
                    p.tx += tx
                if errors or truncated or cut:
                    p.tx_errors += errors
                    p.rx_truncated += truncated
                    p.rx_cut += cut
            self.counts[:] = self._zero_counts
        io = self.io
        got = rx, tx, no_port = io[0], io[1], io[2]
        if rx or tx or no_port:
            io[0] = io[1] = io[2] = 0
        return got


def error(code: int) -> OSError:
    """The OSError of mindp_serve's negative return, as the Python loop's receive raises it."""
    err = -code
    return OSError(err, os.strerror(err)) if err != errno.EINVAL else OSError(err, "serve_t out of bounds")
