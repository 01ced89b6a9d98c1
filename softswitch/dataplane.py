"""The packet loop: one thread polls every port; a ready port's waiting frames come in as one
batch (recvmmsg), go through the engine's run_batch, and leave grouped by egress port (one
sendmmsg per port). On the compiled pipeline that loop runs in C (softswitch/native/serve.py)
until the ports run dry, wherever it can serve exactly as this one. Fault injection, packet-out
(inject) and the frames fault injection held back take the per-frame path: engine.process, then
one send per frame. Packet-in goes to the CPU port's handler frame by frame."""
from __future__ import annotations

import collections
import logging
import os
import select
import time
from dataclasses import dataclass

import numpy as np

from mindp import mmsg

from .batch import Batch
from .engine import Engine, trace_log
from .faults import LinkFaults
from .native.serve import ServeLoop
from .ports import Port

log = logging.getLogger("softswitch")
BATCH = 64  # frames taken from a port per poll: one recvmmsg
TX_SLOTS = 256  # output frames per sendmmsg round: room for a batch and its replicas


@dataclass(frozen=True)
class RxCoalesce:
    """Receive coalescing, as a NIC's interrupt moderation: once the C loop has served at least
    `frames` frames, it serves again no sooner than `usecs` later, so a burst is taken in a few
    large batches rather than a wake-up a frame (each wake-up takes a core from a busy worker on
    a small machine). A frame after a quiet spell is served at once. usecs 0: off (the switch
    program's default is its command line's)."""
    usecs: int = 0
    frames: int = 1

    def __post_init__(self) -> None:
        if self.usecs < 0 or self.frames < 1:
            raise ValueError(f"receive coalescing: usecs {self.usecs} (>= 0), frames {self.frames} (>= 1)")


class DataPlane:
    def __init__(self, engine: Engine, ports: dict[int, Port], faults: LinkFaults | None = None,
                 cpu_port: int | None = None, packet_in=None, coalesce: RxCoalesce = RxCoalesce()):
        self.engine = engine
        self.ports = ports
        self.faults = faults if faults and faults.cfg.active else None
        self.cpu_port = cpu_port
        self.packet_in = packet_in
        self.no_port = 0  # frames sent to a port the switch does not have
        self._injected: collections.deque = collections.deque()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.stopping = False
        self.rx = Batch.empty(BATCH)
        self.tx = Batch.empty(TX_SLOTS)
        self._loop = None  # ServeLoop over the ports, made at the first serve
        self.coalesce = coalesce
        self.served_frames = 0  # by the last serve

    def inject(self, frame: bytes, port: int) -> None:
        """Packet-out (any thread): processed as if received on `port`."""
        self._injected.append((frame, port))
        self._wake()

    def stop(self) -> None:
        """Safe from a signal handler or another thread."""
        self.stopping = True
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass

    def run(self) -> None:
        ep = select.epoll()
        by_fd = {}
        for p in self.ports.values():
            ep.register(p.fileno(), select.EPOLLIN)
            by_fd[p.fileno()] = p
        ep.register(self._wake_r, select.EPOLLIN)
        last_flush = time.monotonic()
        hold = self.coalesce.usecs * 1e-6
        held_until = 0.0  # no serve before this (monotonic): the last one took a burst
        try:
            while not self.stopping:
                timeout = 0.001 if self.faults and self.faults.held else 0.2
                served = None  # the C loop not tried yet in this wake-up
                for fd, events in ep.poll(timeout):
                    if fd == self._wake_r:
                        try:
                            os.read(self._wake_r, 4096)
                        except BlockingIOError:
                            pass
                        continue
                    if events & select.EPOLLERR:  # link down: the socket reports it until it is read
                        by_fd[fd].clear_error()
                        if not events & select.EPOLLIN:
                            continue
                    if served is None:  # one call serves every port; where it cannot, none will
                        if held_until and (wait := held_until - time.monotonic()) > 0:
                            time.sleep(wait)
                        served = self.serve() is not None
                        held_until = time.monotonic() + hold if hold and served and \
                            self.served_frames >= self.coalesce.frames else 0.0
                    if not served:
                        self._port_ready(by_fd[fd])
                while self._injected:
                    frame, port = self._injected.popleft()
                    self._process(frame, port)
                if self.faults:
                    for (direction, port), frame in self.faults.expired():
                        if direction == "in":
                            self._process(frame, port)
                        else:
                            self._send(port, frame)
                now = time.monotonic()
                if now - last_flush > 0.5:
                    self.flush()
                    last_flush = now
        finally:
            ep.close()
            self.flush()

    def serve(self) -> int | None:
        """The C packet loop over every port until they run dry (a budget of receives at most);
        the receives made, or None where it cannot serve as this loop would: then `_port_ready`."""
        native = self.engine.native
        if native is None or self.faults or self.cpu_port is not None or mmsg.CALLS is None or \
                trace_log.isEnabledFor(logging.DEBUG):
            return None
        if self._loop is None:
            self._loop = ServeLoop(self.ports, self.rx, self.tx)
        loop = self._loop
        if not loop.usable():
            return None
        self.rx.n = self.tx.n = 0
        try:
            got = native.serve(loop)
        finally:
            rx, tx, no_port = loop.collect()
            self.served_frames = rx
            self.engine.stats.rx += rx
            self.engine.stats.tx += tx
            self.no_port += no_port
        return got

    def _port_ready(self, port: Port) -> None:
        rx = self.rx
        rx.n = 0
        n = port.receive(rx, BATCH)
        self.engine.stats.rx += n
        if self.faults:
            for i in range(n):
                for fr in self.faults.apply(("in", port.number), rx.frame(i)):
                    self._process(fr, port.number)
        elif n:
            self._forward(rx)

    def _forward(self, rx: Batch) -> None:
        tx = self.tx
        start = 0
        while start < rx.n:
            tx.n = 0
            nxt = self.engine.run_batch(rx, start, tx)
            if nxt == start and not tx.n:  # outputs of one packet more than tx holds: frame by frame
                self._process(rx.frame(start), int(rx.ports[start]))
                nxt = start + 1
            self._send_batch(tx)
            start = nxt

    def _send_batch(self, tx: Batch) -> None:
        """tx's frames out, one sendmmsg per egress port (order kept within each port)."""
        n = tx.n
        if not n:
            return
        ports = tx.ports[:n]
        first = int(ports[0])
        if (ports == first).all():
            groups = [(first, None)]
        else:
            groups = [(int(p), np.flatnonzero(ports == p)) for p in np.unique(ports)]
        for number, rows in groups:
            if number == self.cpu_port and self.packet_in is not None:
                for i in (range(n) if rows is None else rows.tolist()):
                    self.packet_in(tx.frame(i))
                continue
            port = self.ports.get(number)
            if port is None:
                self.no_port += n if rows is None else len(rows)
                continue
            self.engine.stats.tx += port.send_batch(tx, rows)

    def _process(self, frame: bytes, port: int) -> None:
        for out_port, out in self.engine.process(frame, port):
            if self.faults:
                for fr in self.faults.apply(("out", out_port), out):
                    self._send(out_port, fr)
            else:
                self._send(out_port, out)

    def _send(self, port: int, frame: bytes) -> None:
        if port == self.cpu_port and self.packet_in is not None:
            self.packet_in(frame)
            return
        p = self.ports.get(port)
        if p is None:
            self.no_port += 1
            return
        if p.send(frame):
            self.engine.stats.tx += 1

    def flush(self) -> None:
        for p in self.ports.values():
            p.flush_pcaps()

    def close(self) -> None:
        for p in self.ports.values():
            p.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
