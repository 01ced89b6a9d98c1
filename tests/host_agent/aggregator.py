"""A tiny in-test aggregator (the unit-test seam the issue allows): exact sums per
(step, chunk) on raw sockets at the root ends of the hosts' veths, with seeded
loss, duplication and reordering. A gradient counts only at its worker's port, as the
switch admits it (P4.md's admission.workers: ingress port, job, worker). Other frames
(ARP, the step digest's UDP) it forwards as a learning-free L2 switch: by destination
MAC, broadcasts to every other port. It is not the switch; the with-switch tests use
the real one."""
from __future__ import annotations

import random
import select
import threading

import numpy as np

from host_agent import rawsock
from mindp import codec
from mindp.fixedpoint import fp16_to_fixed
from mindp.protocol import UDP_PORT, Flag, Kind
from mindp.harness.testbed import raw_socket
from mindp.topology import Host


class Aggregator:
    def __init__(self, job: int, workers: dict[int, Host], optimizer: Host, ports: dict[int, str],
                 drop=0.0, dup=0.0, reorder=0.0, seed=0):
        self.job = job
        self.workers = workers
        self.optimizer = optimizer
        self.socks = {port: raw_socket(iface) for port, iface in ports.items()}
        for s in self.socks.values():
            rawsock.prepare(s)
        self.port_of = {h.name: h.port for h in [*workers.values(), optimizer]}
        self.port_of_mac = {bytes.fromhex(h.mac.replace(":", "")): h.port for h in [*workers.values(), optimizer]}
        self.rng = random.Random(seed)
        self.drop, self.dup, self.reorder = drop, dup, reorder
        self.cells: dict[tuple[int, int], dict] = {}
        self.held: list[tuple[int, bytes]] = []
        self.stats = {"grads": 0, "sums": 0, "resent_sums": 0, "params": 0, "dropped": 0, "duplicated": 0,
                      "reordered": 0, "forwarded": 0, "refused": 0}
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.thread.join()
        for s in self.socks.values():
            s.close()

    def _emit(self, port: int, frame: bytes) -> None:
        if self.rng.random() < self.drop:
            self.stats["dropped"] += 1
            return
        if self.rng.random() < self.reorder:
            self.stats["reordered"] += 1
            self.held.append((port, frame))
            return
        self._send(port, frame)
        if self.rng.random() < self.dup:
            self.stats["duplicated"] += 1
            self._send(port, frame)

    def _send(self, port, frame):
        try:
            self.socks[port].send(frame)
        except OSError:
            pass

    def _grads(self, frames: list[bytes], port: int | None = None) -> None:
        """GRAD frames that came in at `port` (None: any port)."""
        dec = codec.decode(frames, Kind.GRAD)
        for h, g in zip(dec.headers, dec.elements):
            if h["job"] != self.job:
                continue
            w = self.workers.get(int(h["worker"]))
            if port is not None and (w is None or w.port != port):  # another worker's, or a stray
                self.stats["refused"] += 1
                continue
            self._grad(h, g)

    def _grad(self, h, g) -> None:
        self.stats["grads"] += 1
        key = (int(h["step"]), int(h["chunk"]))
        cell = self.cells.setdefault(key, {"bits": 0, "sum": np.zeros(len(g), np.int64), "nf": False})
        bit = 1 << int(h["worker"])
        complete = cell["bits"] == (1 << len(self.workers)) - 1
        if cell["bits"] & bit:
            if not complete:
                return
            flags = Flag.RETRANSMIT
            self.stats["resent_sums"] += 1
        else:
            fixed, nf = fp16_to_fixed(g)
            cell["sum"] += fixed
            cell["nf"] |= bool(nf.any())
            cell["bits"] |= bit
            if cell["bits"] != (1 << len(self.workers)) - 1:
                return
            flags = h["flags"] & Flag.RETRANSMIT  # completed by a retransmission: as the P4 does
            self.stats["sums"] += 1
        hdr = h.copy()
        hdr["nworkers"] = len(self.workers)
        hdr["flags"] = flags | (Flag.NONFINITE if cell["nf"] else 0)
        opt = self.optimizer
        src = self.workers[int(h["worker"])]
        out = codec.encode(Kind.SUM, np.array([hdr]), cell["sum"][None, :],
                           codec.Addresses(src.mac, opt.mac, src.ip, opt.ip))
        self._emit(opt.port, out[0].tobytes())

    def _param(self, frame: bytes) -> None:
        dec = codec.decode([frame], Kind.PARAM)
        if not len(dec.headers) or dec.headers[0]["job"] != self.job:
            return
        self.stats["params"] += 1
        for w in self.workers.values():
            f = bytearray(frame)
            f[0:6] = bytes.fromhex(w.mac.replace(":", ""))
            f[30:34] = bytes(int(x) for x in w.ip.split("."))
            f[24:26] = b"\0\0"
            f[24:26] = codec.ipv4_checksum(bytes(f[14:34])).to_bytes(2, "big")
            self._emit(w.port, bytes(f))

    def _forward(self, port: int, frames: list[bytes]) -> list[bytes]:
        """Forwards the frames that are not mindp's (by destination MAC); returns mindp's."""
        mindp = []
        for f in frames:
            if len(f) >= 38 and f[12:14] == b"\x08\x00" and f[23] == 17 and int.from_bytes(f[36:38], "big") == UDP_PORT:
                mindp.append(f)
                continue
            self.stats["forwarded"] += 1
            dst = bytes(f[0:6])
            for p in ([self.port_of_mac[dst]] if dst in self.port_of_mac else self.socks):
                if p != port:
                    self._send(p, bytes(f))
        return mindp

    def _from_port(self, port: int, frames: list[bytes]) -> None:
        """mindp frames that came in at `port`: gradients from workers, parameters from the node."""
        if port != self.optimizer.port:
            self._grads(frames, port)
        else:
            for frame in frames:
                self._param(frame)

    def _run(self):
        by_fd = {s.fileno(): port for port, s in self.socks.items()}
        while not self._stop.is_set():
            ready, _, _ = select.select(list(self.socks.values()), [], [], 0.02)
            for s in ready:
                port = by_fd[s.fileno()]
                self._from_port(port, self._forward(port, rawsock.recv_batch(s)))
            if self.held and (not ready or len(self.held) > 8):
                self.rng.shuffle(self.held)
                held, self.held = self.held, []
                for port, frame in held:
                    self._send(port, frame)
