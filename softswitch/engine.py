"""v1model packet processing over a compiled program: parser, ingress, the packet
replication engine, egress, checksum update and deparser, as simple_switch does.

Pure logic: bytes and a port in, a list of (port, bytes) out. Ports, P4Runtime
and threads live elsewhere.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass

from mindp import gcpause

from .batch import Batch
from .compiler import INSTANCE_NORMAL, INSTANCE_REPLICATION, CompiledProgram

log = logging.getLogger("softswitch")
trace_log = logging.getLogger("softswitch.trace")
PIPELINES = ("compiled", "python")


def default_pipeline() -> str:
    """MINDP_SOFTSWITCH_PIPELINE=python forces the Python path where no --pipeline is given; a value
    that is neither raises ValueError (taken as `compiled`, a mistyped "Python" went unnoticed)."""
    mode = os.environ.get("MINDP_SOFTSWITCH_PIPELINE", "").strip() or "compiled"
    if mode not in PIPELINES:
        raise ValueError(f"MINDP_SOFTSWITCH_PIPELINE={mode!r}: one of {', '.join(PIPELINES)}")
    return mode


class Groups(dict):
    """Multicast groups (group -> [(port, rid)]) with a version that moves on every write, so the
    compiled path knows when to rebuild its copy."""

    version = 0

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.version += 1

    def __delitem__(self, key):
        super().__delitem__(key)
        self.version += 1

    def clear(self):
        super().clear()
        self.version += 1

    def pop(self, *args):
        self.version += 1
        return super().pop(*args)

    def update(self, *args, **kwargs):
        super().update(*args, **kwargs)
        self.version += 1

    def setdefault(self, key, default=None):
        self.version += 1
        return super().setdefault(key, default)

    def popitem(self):
        self.version += 1
        return super().popitem()

    def __ior__(self, other):
        self.update(other)
        return self


@dataclass
class Stats:
    rx: int = 0
    tx: int = 0
    dropped: int = 0  # by the program (egress_spec == drop port at the end of ingress or egress)
    no_program: int = 0  # received before any pipeline was set
    mcast_empty: int = 0  # multicast to a group with no replicas
    errors: int = 0  # an exception inside the program: packet dropped


class Engine:
    """`pipeline` "compiled" runs batches on the program compiled to native code (softswitch.native)
    where it can be, "python" always on the generated Python; both share the program's state."""

    def __init__(self, program: CompiledProgram | None = None, pipeline: str | None = None,
                 settle_gc: bool = False):
        self.program: CompiledProgram | None = None
        self.settle_gc = settle_gc  # the switch process: each program loaded leaves the collector's passes
        self.pipeline = pipeline or default_pipeline()
        if self.pipeline not in PIPELINES:
            raise ValueError(f"pipeline {self.pipeline!r}: one of {', '.join(PIPELINES)}")
        self._pre = Groups()
        self.stats = Stats()
        self.lock = threading.RLock()  # control-plane writes hold it; the compiled path syncs under it
        self.native = None
        self._t0 = time.monotonic()
        self._logged_error = False
        if program is not None:
            self.load(program)

    @property
    def pre(self) -> Groups:
        """mcast group -> [(port, rid)]"""
        return self._pre

    @pre.setter
    def pre(self, groups: dict) -> None:
        self._pre = groups if isinstance(groups, Groups) else Groups(groups)

    def load(self, program: CompiledProgram) -> None:
        """Install a program; its tables, registers and counters start empty. One
        assignment swaps it in, so a packet in flight sees the old or the new one."""
        from . import native
        self.pre = Groups()
        self._run = _Runner(program, self)
        self.native = native.attach(program, self) if self.pipeline == "compiled" else None
        if self.native is not None:
            log.info("pipeline compiled to native code")
        self.program = program
        if self.settle_gc:
            gcpause.settle()

    def process(self, data: bytes, port: int) -> list[tuple[int, bytes]]:
        if self.program is None:
            self.stats.no_program += 1
            return []
        out: list[tuple[int, bytes]] = []
        try:
            self._process(data, port, out)
        except Exception as exc:  # a bug or an unforeseen construct: drop, count, keep running
            self.stats.errors += 1
            if not self._logged_error:
                log.error("packet dropped: %s: %s (further errors only counted)", type(exc).__name__, exc)
                self._logged_error = True
            return []
        return out

    def run_batch(self, rx: Batch, start: int, tx: Batch) -> int:
        """Frames start.. of `rx` through `process`, in order, their outputs appended to `tx`; the
        first frame not processed (< rx.n when tx might not hold the next packet's outputs).
        An output that no slot holds is a counted error."""
        native = self.native
        if native is not None and rx.slot == tx.slot and not trace_log.isEnabledFor(logging.DEBUG):
            return native.run_batch(rx, start, tx)
        most = max(1, max(map(len, list(self.pre.values())), default=0))  # list: one step, safe from P4Runtime's thread
        for i in range(start, rx.n):
            if tx.n and tx.n + most > tx.capacity:
                return i
            for port, frame in self.process(rx.frame(i), int(rx.ports[i])):
                if not tx.append(frame, port):
                    self.stats.errors += 1
        return rx.n

    def _process(self, data: bytes, port: int, out: list) -> None:
        self._run.process(data, port, out)


class _Runner:
    """The per-packet path of one program, with everything it needs bound once. When the
    "softswitch.trace" logger is at DEBUG (checked once per packet) the packet runs through
    the traced compile of the program instead, which logs each step."""

    def __init__(self, p: CompiledProgram, engine: Engine):
        s = p.slots
        self.program = p
        self.engine = engine
        self.stats = engine.stats
        self._plain = self._stages(p.ns)
        self._traced = None
        self._init = p.init
        self._drop = p.drop_port
        self._ip = s["ingress_port"]
        self._es = s["egress_spec"]
        self._ep = s["egress_port"]
        self._it = s["instance_type"]
        self._pl = s["packet_length"]
        self._mg = s.get("mcast_grp")
        self._rid = s.get("egress_rid")
        self._its = s.get("ingress_global_timestamp")
        self._ets = s.get("egress_global_timestamp")
        self._ilen = p.layout.ilen
        self._plen = p.layout.plen
        self._t0 = engine._t0

    @staticmethod
    def _stages(ns: dict) -> tuple:
        return ns["parse"], ns["pipe_ingress"], ns["pipe_egress"], ns["deparse"], ns.get("_trace")

    def process(self, data: bytes, port: int, out: list) -> None:
        stages = self._plain
        if trace_log.isEnabledFor(logging.DEBUG):
            if self._traced is None:
                self._traced = self._stages(self.program.traced())
            stages = self._traced
            tracer = stages[4]
            tracer.packet += 1
            trace_log.debug("pkt %d: %d bytes in on port %d", tracer.packet, len(data), port)
        parse, ingress, egress, deparse, tracer = stages
        f = self._init[:]
        n = len(data)
        f[self._ip] = port
        f[self._pl] = n
        f[self._ilen] = n
        f[self._plen] = n
        if self._its is not None:
            f[self._its] = int((time.monotonic() - self._t0) * 1e6)
        off = parse(f, data)
        ingress(f)
        mg = f[self._mg] if self._mg is not None else 0
        if mg:
            f[self._it] = INSTANCE_REPLICATION
            replicas = self.engine.pre.get(mg)
            if not replicas:
                self.stats.mcast_empty += 1
                if tracer:
                    trace_log.debug("pkt %d: dropped: multicast group %d has no replicas", tracer.packet, mg)
                return
            if tracer:
                trace_log.debug("pkt %d: multicast group %d to ports %s", tracer.packet, mg,
                                ", ".join(str(p) for p, _ in replicas))
            for eport, rid in replicas:
                g = f[:]
                if self._rid is not None:
                    g[self._rid] = rid
                self._egress_one(g, eport, data, off, out, egress, deparse, tracer)
            return
        es = f[self._es]
        if es == self._drop:
            self.stats.dropped += 1
            if tracer:
                trace_log.debug("pkt %d: dropped at the end of ingress (egress_spec = drop port %d)",
                                tracer.packet, es)
            return
        f[self._it] = INSTANCE_NORMAL
        self._egress_one(f, es, data, off, out, egress, deparse, tracer)

    def _egress_one(self, f: list, port: int, data: bytes, off: int, out: list, egress, deparse, tracer) -> None:
        f[self._ep] = port
        f[self._es] = self._drop + 1
        f[self._pl] = f[self._plen]
        if self._ets is not None:
            f[self._ets] = int((time.monotonic() - self._t0) * 1e6)
        egress(f)
        if f[self._es] == self._drop:
            self.stats.dropped += 1
            if tracer:
                trace_log.debug("pkt %d: dropped in egress for port %d (mark_to_drop)", tracer.packet, port)
            return
        frame = deparse(f, data, off)
        if tracer:
            trace_log.debug("pkt %d: out on port %d, %d bytes", tracer.packet, port, len(frame))
        out.append((port, frame))
