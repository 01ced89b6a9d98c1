"""The packet loop: one thread polls every port, runs each frame through the
engine and sends the results, with optional fault injection and packet-in/out
for the CPU port."""
from __future__ import annotations

import collections
import logging
import os
import select
import time

from .engine import Engine
from .faults import LinkFaults
from .ports import Port

log = logging.getLogger("softswitch")
BATCH = 64


class DataPlane:
    def __init__(self, engine: Engine, ports: dict[int, Port], faults: LinkFaults | None = None,
                 cpu_port: int | None = None, packet_in=None):
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
        try:
            while not self.stopping:
                timeout = 0.001 if self.faults and self.faults.held else 0.2
                for fd, _ in ep.poll(timeout):
                    if fd == self._wake_r:
                        try:
                            os.read(self._wake_r, 4096)
                        except BlockingIOError:
                            pass
                        continue
                    port = by_fd[fd]
                    for frame in port.recv_batch(BATCH):
                        self.receive(frame, port.number)
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

    def receive(self, frame: bytes, port: int) -> None:
        self.engine.stats.rx += 1
        if self.faults:
            for fr in self.faults.apply(("in", port), frame):
                self._process(fr, port)
        else:
            self._process(frame, port)

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
