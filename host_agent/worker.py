"""The worker agent: push a step's gradients, get the step's fp16 parameters back.

`WorkerAgent` runs each step's `Window` (host_agent.window: the slot window, retransmission
timeouts, deadline) on a raw socket with the fast codec; `main` is the `mindp-worker` CLI.
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from mindp import codec, rxring, schedule
from mindp.layout import Layout
from mindp.protocol import HEADER_DTYPE, MAX_WORKERS, PARAM_CHUNKS_MAX, K, Flag, Kind, param_frame_len
from mindp.readable import readable
from mindp.switch_constants import MAX_JOB_ID
from mindp.topology import Topology, TopologyError

from . import agent_args, digest, fused, gradframes, param_rx, rawsock, reference, shards, window
from .optim import ConfigError
from .pumper import Pumper
from .resume import ResumeFile
from .window import RtoConfig, RttEstimator, StepTimeout, Window

FLAGS_OFFSET = codec.PREFIX_LEN + HEADER_DTYPE.fields["flags"][1]
STEP_OFFSET = codec.PREFIX_LEN + HEADER_DTYPE.fields["step"][1]
VER_OFFSET = codec.PREFIX_LEN + HEADER_DTYPE.fields["ver"][1]


slot_and_version = schedule.slots_and_versions  # the slot schedule lives in mindp.schedule only


@dataclass(frozen=True)
class WorkerConfig:
    job_id: int
    worker_id: int
    slots: int
    mac: str
    ip: str
    optimizer_mac: str
    optimizer_ip: str
    rto: RtoConfig = field(default_factory=RtoConfig)
    first_step: int = 0
    # A sharded job's optimizer nodes: (lo, hi, mac, ip) per chunk range; the PARAM of chunk c is
    # taken only from the node owning c. Empty: every PARAM from optimizer_mac/ip.
    shards: tuple[tuple[int, int, str, str], ...] = ()
    # Receive coalescing, as a NIC's rx-usecs: woken by parameters while at least `coalesce_min`
    # chunks are unanswered (a stream of them is on its way), the agent waits `coalesce` seconds
    # before reading, so that one read takes a batch. It pays where a step has many small frames
    # (at K = 32 the gpt's workers read ~800 times a step, ~50 frames each, a read's cost mostly
    # per read); at K = 1,024 they read ~20 times a step and seldom have that many chunks out. A
    # model with fewer chunks never waits: for it the wait would only add latency. 0: off.
    coalesce: float = 0.0005
    coalesce_min: int = 256
    # Sends go in buckets, as DDP's allreduces do: put() sends (and takes what came) once at least
    # this many chunks became ready since it last did, or a quarter of the step's chunks if fewer
    # (a small model's sends still overlap its backward); wait() sends the rest. Each bucket wakes
    # the pump thread, the switch, the node and the pumps again, each paying its wake-up and per-call
    # work: where the network shares the training's cores, fewer and larger buckets leave the
    # training more CPU (docs/PERFORMANCE.md). 1: every put.
    bucket: int = 512
    # Streaming: from a step's start to wait(), a thread of the agent's takes the answers as they
    # come and sends each slot's next chunk at once (host_agent.pumper), where put()'s pumps alone
    # left most of a large model's chunks for wait(); put() then only nudges it once a bucket is
    # ready. Only where a step's chunks outnumber its window (slots): a step that fits leaves whole
    # from put()'s pumps, and the thread's hand-offs at each step's start and end cost the MLP a
    # sixth of its steps/s. False: never (put() pumps itself, wait() sends the rest).
    stream: bool = True

    def __post_init__(self) -> None:  # here, not in WorkerAgent: a bad option is told before any I/O
        if not 0 <= self.job_id <= MAX_JOB_ID:  # the switch's per-job registers, as a topology's jobs
            raise ConfigError(f"job id {self.job_id} outside 0..{MAX_JOB_ID}")
        if not 0 <= self.worker_id < MAX_WORKERS:  # a bit each in the switch's worker bitmap
            raise ConfigError(f"worker id {self.worker_id} outside 0..{MAX_WORKERS - 1}")
        if self.slots < 1:
            raise ConfigError("slots must be >= 1")
        if self.bucket < 1:
            raise ConfigError("bucket must be >= 1 (chunks)")

    @classmethod
    def from_topology(cls, topo: Topology, job_id: int, worker_id: int, **kw) -> WorkerConfig:
        jobs = {j.job_id: j for j in topo.jobs}
        if job_id not in jobs:
            raise TopologyError(f"job {job_id} is not in the topology")
        job = jobs[job_id]
        if worker_id not in job.workers:
            raise TopologyError(f"job {job_id} has no worker {worker_id}")
        me, opt = topo.host(job.workers[worker_id]), topo.host(job.optimizers[0])
        if job.sharded:
            kw.setdefault("shards", tuple(shards.ranges_of(topo, job_id)))
        return cls(job_id, worker_id, job.slots, me.mac, me.ip, opt.mac, opt.ip, **kw)


class WorkerAgent:
    """A worker's network agent for one job: one step at a time, in order."""

    def __init__(self, cfg: WorkerConfig, layout: Layout, sock, faults: rawsock.Faults | None = None,
                 on_nonfinite=None, initial: dict | None = None, resume: ResumeFile | None = None):
        """on_nonfinite(step, chunks): called after a step whose parameters came back flagged
        NONFINITE (the node skipped the whole step): the hook for dynamic loss scaling.
        initial: the fp16 parameters held before the first step; a non-finite step returns the
        parameters held before it (without them, a first step's answers are taken as they came).
        resume: the worker's resume file (host_agent.resume): the step, the parameters before it and
        the chunks of it already answered come from there, and it is kept current."""
        self.cfg = cfg
        self.layout = layout
        self.sock = sock
        sock.setblocking(False)  # the agent waits in poll(), never in recv()
        self.faults = faults
        self.step = cfg.first_step
        self.on_nonfinite = on_nonfinite
        self.nonfinite_chunks: list[int] = []  # of the last completed step
        self.current: np.ndarray | None = None  # flat fp16 parameters held now (n_chunks * K)
        # The buffer the step before the current one was received into, for the next step: a fresh
        # one a step cost a page fault a 4 KiB of it (~630 a step at 1.3M parameters). wait()
        # returns copies (Layout.unflatten), so nothing outside the agent holds it.
        self.spare: np.ndarray | None = None
        if initial is not None:
            self.current = np.zeros(layout.n_chunks * K, dtype=np.float16)
            self.current[: layout.total] = layout.flatten(initial, dtype=np.float16)
        self.resume = resume
        self.resume_aux = None  # (step, skipped) -> values kept with the next step in the resume file
        if resume is not None:
            self.step = resume.step
            self.current = resume.before(self.step)
        self.rtt = RttEstimator(cfg.rto)
        if resume is not None:
            self.rtt.restore(resume.rtt)
        self.link = rawsock.LinkWatch(f"mindp-worker {cfg.job_id}/{cfg.worker_id}")
        self.stats = collections.Counter()
        self.step_times: list[float] = []
        self.addrs = codec.Addresses(cfg.mac, cfg.optimizer_mac, cfg.ip, cfg.optimizer_ip)
        # PARAM frames come from the job's optimizer node only (the switch forwards them unchanged),
        # in a sharded job from the node owning their chunk.
        self.param_sources = shards.ParamSources(list(cfg.shards)) if cfg.shards else None
        self.digest: digest.Client | None = None  # check_digests() turns the step digest's check on
        # The lrs of the step about to start, a parameter group each, told the node with its digest
        # query (a script that sets its lr itself: its optimizer's as the step's first gradient
        # leaves); None: none.
        self.step_lr: Callable[[], tuple[float, ...]] | None = None
        # A PARAM frame carries 1..PARAM_CHUNKS_MAX chunks: received one a row (a burst) into rows of
        # the longest, their lengths beside, then checked and taken chunk by chunk (param_rx).
        self.rx = np.zeros((4096, param_frame_len(PARAM_CHUNKS_MAX)), dtype=np.uint8)
        self.rx_lens = np.zeros(len(self.rx), dtype=np.int64)
        self.auxdata = rawsock.enable_auxdata(sock)
        self.receiver = rawsock.RowReceiver(self.rx, self.auxdata) if rawsock.MMSG else None
        self.kernel = fused.selected()  # for the gradients' fp16 rounding, as the node's (raises KernelError)
        gradframes.warm(self.kernel)
        window.warm()
        n = layout.n_chunks
        self.spec_of = {s.name: s for s in layout.specs}
        self.bucket = min(cfg.bucket, max(1, n // 4))
        self.counts = np.array([layout.chunk_count(c) for c in range(n)], dtype=np.uint16) if n else np.zeros(0)
        self.param_rx = param_rx.ParamReceiver(cfg.job_id, self.counts, cfg.optimizer_mac, cfg.optimizer_ip,
                                               self.param_sources, len(self.rx))
        self.pumper = Pumper(sock, cfg.coalesce, cfg.coalesce_min) if cfg.stream and n > cfg.slots else None
        # Held by every pump and by put() marking chunks ready (re-entered: the thread holds it
        # around its pump's own).
        self.lock = threading.RLock() if self.pumper is None else self.pumper.lock
        # Every chunk's GRAD frame, built once: a step rewrites only its step, ver, flags and body.
        chunks = np.arange(n)
        self.frames = codec.encode(Kind.GRAD, codec.header_array(
            n, job=cfg.job_id, worker=cfg.worker_id, chunk=chunks, slot=slot_and_version(0, chunks, n, cfg.slots)[0],
            count=self.counts), np.zeros((n, K), np.float16), self.addrs)
        # Chunks each tensor touches, to know when a chunk is fully produced.
        self.tensor_chunks = {}
        self.pending0 = np.zeros(n, dtype=np.int32)
        for spec in layout.specs:
            off = layout.offsets[spec.name]
            if spec.size:
                lo, hi = off // K, (off + spec.size - 1) // K + 1
                self.tensor_chunks[spec.name] = (lo, hi)
                self.pending0[lo:hi] += 1

    def check_digests(self, sock=None) -> None:
        """Check every step's parameters against the optimizer nodes' step digests (host_agent.digest)
        and repair them where they differ; `sock`: a UDP socket in this host's network namespace
        (default: one opened here)."""
        cfg = self.cfg
        ranges = [(lo, hi, ip) for lo, hi, _, ip in cfg.shards] or [(0, self.layout.n_chunks - 1, cfg.optimizer_ip)]
        if self.layout.n_chunks:
            self.digest = digest.Client(sock or digest.open_socket(), cfg.job_id,
                                        f"mindp-worker {cfg.job_id}/{cfg.worker_id}",
                                        [digest.Source(lo, hi, ip) for lo, hi, ip in ranges])

    @property
    def rejected(self) -> int:
        """Frames received and rejected so far, every reason (stats' rejected_<reason>)."""
        return sum(v for k, v in self.stats.items() if k.startswith("rejected_"))

    def push(self, grads: dict) -> dict[str, np.ndarray]:
        """Send this step's gradients (all tensors), return the step's new fp16 parameters."""
        h = self.start_step()
        for name, g in grads.items():
            h.put(name, g)
        return h.wait()

    def start_step(self) -> StepHandle:
        """Overlap form: put() tensors as they are produced (sending starts at once), then wait()."""
        return StepHandle(self)

    def close(self) -> None:
        """End the pumping thread (the socket stays the caller's)."""
        if self.pumper:
            self.pumper.close()
            self.pumper = None


def _count(stats: collections.Counter, key: str, n: int) -> None:
    if n:
        stats[key] += int(n)  # a numpy count would not go into --stats' JSON


class StepHandle:
    def __init__(self, agent: WorkerAgent):
        self.agent = agent
        if agent.pumper:  # a step abandoned before its wait() (backward raised) is pumped no more
            agent.pumper.park()
        lay = agent.layout
        self.bad = np.zeros(lay.n_chunks, dtype=np.uint8)  # chunks given a non-finite gradient
        if agent.resume is None:  # else received straight into the resume file (below)
            self.params = agent.spare if agent.spare is not None else np.zeros(lay.n_chunks * K, dtype=np.float16)
            agent.spare = None
        self.pending = agent.pending0.copy()
        self.put_names: set[str] = set()
        self.nonfinite: set[int] = set()
        self.t0 = time.monotonic()
        self.window = Window(agent.step, lay.n_chunks, agent.cfg.slots, agent.rtt, self.t0,
                             agent.param_sources.his if agent.param_sources is not None else None)
        self._encode()
        self._just_sent: list[int] = []  # by the last pump (chunks first sent, then resent)
        self.unsent = 0  # chunks made ready since the last pump (WorkerConfig.bucket)
        # The digest query, held by the node until the step is applied; with the step's lr it goes
        # as the first gradient does (a script sets its lr before backward, not before zero_grad).
        self.asked = not agent.digest
        if agent.digest and agent.step_lr is None:
            self._ask()
        if agent.resume is not None:
            self.params = agent.resume.answers(agent.step)
            answered, nonfinite = agent.resume.answered_in(agent.step)
            if answered.any():
                self.window.resume(answered)
                self.nonfinite.update(np.flatnonzero(nonfinite).tolist())
                agent.stats["resumed_chunks"] += int(np.count_nonzero(answered))
        if agent.pumper:
            agent.pumper.follow(self)

    def _ask(self) -> None:
        a = self.agent
        a.digest.ask(a.step, a.step_lr() if a.step_lr else None)
        self.asked = True

    def put(self, name: str, grad, scale: float = 1.0) -> None:
        """One named gradient (numpy or torch), divided by `scale` (a loss scale; float32 only); its
        chunks leave as soon as the window allows."""
        a = self.agent
        if not self.asked:
            self._ask()
        if name not in a.layout.offsets:
            raise KeyError(f"no tensor {name!r} in the layout")
        if name in self.put_names:
            raise ValueError(f"gradient {name!r} given twice in step {a.step}")
        spec = a.spec_of[name]
        g = gradframes.as_array(grad)
        if tuple(g.shape) != spec.shape:
            raise ValueError(f"{name}: gradient shape {g.shape} != layout {spec.shape}")
        self.put_names.add(name)
        # Rounded to fp16 straight into the chunks' frames: a chunk is sent only once all of it is in.
        gradframes.put(a.frames, a.layout.offsets[name], g, self.bad, a.kernel, scale)
        if name in a.tensor_chunks:
            lo, hi = a.tensor_chunks[name]
            self.pending[lo:hi] -= 1
            ready = np.flatnonzero(self.pending[lo:hi] == 0) + lo
            if len(ready):
                with a.lock:
                    bad = ready[self.bad[ready] != 0]
                    if len(bad):
                        a.frames[bad, FLAGS_OFFSET] = int(Flag.NONFINITE)
                    self.window.set_ready(ready)
                    self.unsent += len(ready)
                    if self.unsent >= a.bucket:
                        if a.pumper:
                            a.pumper.nudge()
                        else:
                            self.pump(0.0)

    def holds(self, name: str, grad, scale: float = 1.0) -> bool:
        """Whether this step's frames hold `grad` / `scale` as put() wrote the gradient `name` (fp16
        bits): False once it changed after it was put, by whatever means."""
        a = self.agent
        return gradframes.holds(a.frames, a.layout.offsets[name], gradframes.as_array(grad), a.kernel, scale)

    def _encode(self) -> None:
        """This step's fields into every chunk's frame, in place, once a step: put() writes the
        gradients, and the NONFINITE flag of a chunk given one. No frame of the step before is sent
        again once this one has begun (it ended with every chunk answered)."""
        a = self.agent
        w = self.window
        _, ver = slot_and_version(w.step, np.arange(w.n), w.n, a.cfg.slots)
        f = a.frames
        f[:, STEP_OFFSET : STEP_OFFSET + 4] = np.array([w.step], dtype=">u4").view(np.uint8)
        f[:, VER_OFFSET] = ver
        f[:, FLAGS_OFFSET] = 0

    def pump(self, timeout: float) -> None:
        """_pump, riding out a link that went down (ENETDOWN/ENXIO/ENODEV): one line, retried with
        backoff, one line when a frame is sent again; the step's deadline restarts then. Only a
        send proves the link is back: parameters queued before it went down are still received."""
        a = self.agent
        st = a.stats
        with a.lock:
            out, errors = st["sent"] + st["retransmitted"], st["send_errors"]
            try:
                self._pump(timeout)
            except OSError as exc:
                a.link.failed(exc)
                st["link_down"] = a.link.downs
                return
            if a.link.down and st["sent"] + st["retransmitted"] - out > st["send_errors"] - errors:
                a.link.alive()
                self.window.link_back(time.monotonic(), self._just_sent)

    def _pump(self, timeout: float) -> None:
        """Send what is due, wait up to `timeout` for frames, take the parameters that came."""
        a = self.agent
        now = time.monotonic()
        w = self.window
        timeouts, fast = w.timeouts, w.fast_retransmits
        new, again = w.due(now)
        self._just_sent = new + again
        a.stats["timeouts"] += w.timeouts - timeouts
        a.stats["fast_retransmits"] += w.fast_retransmits - fast
        if a.digest and w.timeouts > timeouts:  # a node restarted meanwhile holds no earlier query
            a.digest.ask(w.step)
        a.stats["pumps"] += 1
        self.unsent = 0
        errors = a.stats["send_errors"]
        if new:
            late = w.after_own_resend(new)
            if late:
                a.frames[late, FLAGS_OFFSET] |= np.uint8(Flag.RETRANSMIT)
            sent, failed = rawsock.send_rows(a.sock, a.frames, new, a.faults)
            a.stats["sent"] += sent
            a.stats["send_errors"] += failed
        if again:
            a.frames[again, FLAGS_OFFSET] |= np.uint8(Flag.RETRANSMIT)
            sent, failed = rawsock.send_rows(a.sock, a.frames, again, a.faults)
            a.stats["retransmitted"] += sent
            a.stats["send_errors"] += failed
        elif not new and a.faults is not None and a.faults.held:
            # A test's reordered frames go after later ones, or with this pump that sends none: not
            # with the next resend, which its peers would time as a round trip.
            a.faults.release(a.sock.send)
        if a.stats["send_errors"] > errors:
            rawsock.raise_if_link_down(a.sock)
        if timeout > 0:
            ready = readable([a.sock], timeout)
            if not ready:
                return
            if a.cfg.coalesce > 0 and w.n_sent - w.n_done >= a.cfg.coalesce_min:
                time.sleep(a.cfg.coalesce)
        if not a.faults and (a.auxdata or a.receiver):
            n, tagged, other = rawsock.recv_rows_untagged(a.sock, a.rx, a.receiver, a.rx_lens)
            _count(a.stats, "rejected_tagged", tagged)
            _count(a.stats, "rejected_length", other)
            if n:
                self._receive(a.rx[:n], a.rx_lens[:n])
            return
        if a.auxdata:
            frames, tagged = rawsock.recv_batch_untagged(a.sock)
            _count(a.stats, "rejected_tagged", tagged)
        else:
            frames = rawsock.recv_batch(a.sock)
        if a.faults:
            frames = a.faults.filter_recv(frames)
        if frames:
            self._receive(*self._as_rows(frames))

    def _as_rows(self, frames: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """Frames received one at a time into the receive buffer's rows, and their lengths; a mindp
        frame longer than a row is counted and left out."""
        a = self.agent
        width = a.rx.shape[1]
        fit = [f for f in frames if len(f) <= width]
        if len(fit) < len(frames):
            heads = [f[: rxring.MINDP_PREFIX] for f in frames if len(f) > width]
            _count(a.stats, "rejected_length", int(rxring.is_mindp(
                np.frombuffer(b"".join(heads), np.uint8).reshape(len(heads), -1), np.full(len(heads), width)).sum()))
        for row, f in zip(a.rx, fit):
            row[: len(f)] = np.frombuffer(f, np.uint8)
        a.rx_lens[: len(fit)] = [len(f) for f in fit]
        return a.rx[: len(fit)], a.rx_lens[: len(fit)]

    def _receive(self, rows: np.ndarray, lens: np.ndarray) -> None:
        """Frames received (the first lens[i] bytes of rows[i]) -> the step's parameters, checked."""
        a = self.agent
        a.stats["receives"] += 1
        self.nonfinite.update(a.param_rx.receive(rows, lens, self.window, self.params, a.stats, a.resume))

    def _digest_idle(self, timeout: float) -> bool:
        """Waiting for the step's digest: its answer, or frames on the raw socket (late duplicates,
        and the ENETDOWN of a link that went down, told in one line as in a step); True while the
        link is down (the digest's deadline waits for it, as the step's does)."""
        a = self.agent
        ready = readable([a.digest.sock, a.sock], timeout)
        if a.sock in ready:
            self.pump(0.0)
        return a.link.down

    def wait(self) -> dict[str, np.ndarray]:
        """Block until every parameter chunk of the step is in; raises StepTimeout past the deadline."""
        a = self.agent
        w = self.window
        if not self.asked:
            self._ask()
        if a.pumper:  # from here this thread pumps (a pump of the thread's that failed raises here)
            a.pumper.park()
        missing_grads = [s.name for s in a.layout.specs if s.name not in self.put_names]
        if missing_grads:
            raise ValueError(f"step {w.step}: no gradient given for {missing_grads}")
        while not w.complete:
            now = time.monotonic()
            if w.stalled(now) and not a.link.down:  # a link that is down is waited for
                a.stats["failed_steps"] += 1
                raise StepTimeout(a.cfg.job_id, a.cfg.worker_id, w.step, w.missing(), now - w.last_progress)
            self.pump(max(0.0, min(w.wake_at() - now, 0.05)))
        elapsed = time.monotonic() - self.t0
        a.step_times.append(elapsed)
        a.stats["steps"] += 1
        ring = rawsock.ring_of(a.sock)
        if ring is not None:  # frames the kernel dropped on a full ring (the pump fell behind)
            a.stats["ring_drops"] += ring.dropped()
        a.nonfinite_chunks = sorted(self.nonfinite)
        if self.nonfinite:
            # The node skipped the whole step; answers sent before it learned so may carry
            # parameters it has since reverted: keep what we held before the step.
            a.stats["nonfinite_steps"] += 1
            if a.current is not None:
                self.params = a.current
            if a.on_nonfinite:
                a.on_nonfinite(w.step, a.nonfinite_chunks)
        if a.resume is not None:
            skipped = bool(self.nonfinite)
            a.resume.complete(w.step, skipped, a.resume_aux(w.step, skipped) if a.resume_aux else None,
                              a.rtt.state())
            self.params = a.resume.answers(w.step)
        if a.digest:
            a.digest.idle = self._digest_idle
            a.digest.check(w.step, self.params, a.stats, max(a.rtt.rto, 0.05), a.cfg.rto.deadline)
        if a.current is not None and a.current is not self.params and a.resume is None:
            a.spare = a.current
        a.current = self.params
        a.step += 1
        return a.layout.unflatten(self.params[: a.layout.total])


# --- CLI ------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mindp-worker", description="mindp worker agent pushing synthetic gradients")
    p.add_argument("--iface", default="eth0")
    p.add_argument("--topology", help="topology JSON (mindp.topology)")
    p.add_argument("--job", type=int, default=1, help=f"job id (0..{MAX_JOB_ID})")
    p.add_argument("--worker", type=int, required=True, help=f"worker id in the job (0..{MAX_WORKERS - 1})")
    p.add_argument("--slots", type=int, help="the job's slot count (without --topology)")
    p.add_argument("--mac", help="our MAC (without --topology)")
    p.add_argument("--ip", help="our IPv4 address (without --topology)")
    p.add_argument("--opt-mac", help="optimizer node MAC (without --topology)")
    p.add_argument("--opt-ip", help="optimizer node IPv4 (without --topology)")
    agent_args.add_model_args(p)
    p.add_argument("--grad-seed", type=int, default=0, help="seed of the synthetic gradients")
    p.add_argument("--steps", type=int, default=1,
                   help="the job's step count: run until this step is done (not below --first-step)")
    p.add_argument("--first-step", type=int, default=0,
                   help="rejoin a live job at this step, --init being the parameters held before it")
    p.add_argument("--resume", metavar="FILE",
                   help="resume file, kept current at every received chunk: if it exists the worker goes on "
                        "where it was (step, parameters, chunks answered), whatever --first-step says")
    p.add_argument("--deadline", type=float, default=RtoConfig.deadline, help="seconds without progress before failing")
    p.add_argument("--out", help="write the final fp16 parameters to this .npz (its directory checked at start)")
    p.add_argument("--stats", help="write counters as JSON here at exit")
    agent_args.add_fault_args(p)
    return p


def open_resume(path: str | None, cfg: WorkerConfig, layout: Layout, init: dict) -> tuple[ResumeFile | None, bool]:
    """The worker's resume file (None without a path), created at cfg.first_step holding `init`."""
    if not path:
        return None, False
    before = layout.flatten(init, dtype=np.float32).astype(np.float16)
    return ResumeFile.open(path, cfg.job_id, cfg.worker_id, layout, before, cfg.first_step)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _main(args)
    except KeyboardInterrupt:  # before the steps (those say where they stopped)
        print(f"mindp-worker {args.worker}: interrupted", file=sys.stderr)
        return 130


def _main(args: argparse.Namespace) -> int:
    try:
        agent_args.check_output(args.out, "--out")
        agent_args.check_output(args.stats, "--stats")
        layout, init = agent_args.load_model(args.layout, args.init)
        rto = RtoConfig(deadline=args.deadline)
        if args.topology:
            cfg = WorkerConfig.from_topology(Topology.load(args.topology), args.job, args.worker, rto=rto)
        else:
            missing = [f"--{n.replace('_', '-')}" for n in ("slots", "mac", "ip", "opt_mac", "opt_ip")
                       if getattr(args, n) is None]
            if missing:
                raise ConfigError(f"without --topology, give {' '.join(missing)}")
            cfg = WorkerConfig(args.job, args.worker, args.slots, args.mac, args.ip, args.opt_mac, args.opt_ip, rto=rto)
        if args.first_step < 0:
            raise ConfigError("--first-step must be >= 0")
        if args.steps < args.first_step:  # no step to run, and --out would hold a step past the job's end
            raise ConfigError(f"--steps {args.steps} is below --first-step {args.first_step}: no step to run")
        cfg = replace(cfg, first_step=args.first_step)
        faults = agent_args.faults_from_args(args)
        resume, resumed = open_resume(args.resume, cfg, layout, init)
        agent = WorkerAgent(cfg, layout, rawsock.open_raw(args.iface), faults,
                            initial={n: a.astype(np.float16) for n, a in init.items()}, resume=resume)
        agent.check_digests()
        guard = rawsock.udp_guard()
    except (ConfigError, TopologyError, rawsock.SocketError, ValueError, OSError) as exc:
        print(f"mindp-worker: {exc}", file=sys.stderr)
        return 2
    grad_fn = reference.synthetic_grads(args.grad_seed)
    params = layout.unflatten(agent.current[: layout.total])
    code = 0
    try:
        if resumed:
            print(f"mindp-worker {args.worker}: resuming at step {agent.step} "
                  f"({int(np.count_nonzero(resume.answered_in(agent.step)[0]))} chunk(s) of it answered)", flush=True)
        else:
            print(f"mindp-worker {args.worker}: job {cfg.job_id}, {layout.n_chunks} chunk(s) in {cfg.slots} slot(s), "
                  f"from step {agent.step}", flush=True)
        while agent.step < args.steps:
            params = agent.push(grad_fn(args.worker, agent.step, params))
    except (StepTimeout, digest.DigestError) as exc:
        print(f"mindp-worker: {exc}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:  # the resume file holds every chunk received: --resume goes on from here
        print(f"mindp-worker {args.worker}: interrupted in step {agent.step}", file=sys.stderr)
        code = 130
    if guard:
        guard.close()
    if args.out and code != 0:
        print(f"mindp-worker: {args.out} not written: the run did not finish", file=sys.stderr)
    stats = dict(agent.stats, step_times=agent.step_times, rto=agent.rtt.rto)
    try:  # the directories were checked at start: a failure here is one removed or full since
        if args.out and code == 0:
            np.savez(args.out, **params)
        if args.stats:
            pathlib.Path(args.stats).write_text(json.dumps(stats, indent=1) + "\n")
    except OSError as exc:
        print(f"mindp-worker: {exc}", file=sys.stderr)
        code = code or 1
    print(f"mindp-worker {args.worker}: {agent.stats['steps']} steps, sent {agent.stats['sent']}, "
          f"retransmitted {agent.stats['retransmitted']}, duplicates {agent.stats['duplicates']}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
