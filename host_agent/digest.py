"""The step digest (docs/OPTIMIZER.md, "Step digest"): every committed step, the optimizer node
publishes a digest of the step's fp16 parameters; each worker checks its own against it, so a worker
that diverged (a wrong parameter taken, a buffer overwritten) is caught in the step it happens,
without a reference run, and repaired from the node.

The digest of a node's chunk range lo..hi is a vector of up to BLOCKS 64-bit block digests, each the
sum (mod 2^64) of its chunks' hashes: order-independent, so the node adds each chunk's hash as it
applies the chunk, in whatever order sums come, and never reads the state again. A chunk's hash is
a multilinear hash of its fp16 bytes (any one differing 64-bit word changes it: the multipliers are
odd) mixed with the chunk's number, so equal chunks at different places do not cancel.

It travels over plain UDP on DIGEST_PORT, beside the data plane (whose frames it does not touch):
a worker asks the node owning a chunk range for step s's digest (QUERY) as the step starts, again
while unanswered; the node answers at once for a committed step, else as soon as the step's last
chunk is applied, before its commit's write-back (DIGEST).
A worker whose blocks differ asks for those blocks' chunks (FETCH) and gets one CHUNK datagram per
chunk, compares them to its own to name the first differing chunks, and takes the node's.
"""
from __future__ import annotations

import collections
import socket
import struct
import sys
import time
from dataclasses import dataclass

import numpy as np

from mindp import listed
from mindp.netutil import bound_udp, ephemeral_udp
from mindp.protocol import K, UDP_PORT
from mindp.readable import readable

from . import fused

#: UDP port of the digest messages (node side; workers send from any port).
DIGEST_PORT = UDP_PORT + 2
#: What a worker's line says when its parameters differ from the step digest (read back from
#: logs by mindp-ctl stats --run and make soak).
MISMATCH_LINE = "parameters differ from the optimizer node's digest"
#: Block digests per node range: a mismatch is narrowed to 1/BLOCKS of the range before fetching.
BLOCKS = 64
#: Digests of this many recent committed steps are kept by the node.
KEEP = 16
#: Most queries of steps not yet committed held by the node (beyond: dropped and counted).
MAX_HELD = 4096

QUERY, DIGEST, FETCH, CHUNK = b"MINDPDQ1", b"MINDPDD1", b"MINDPDF1", b"MINDPDC1"
_QUERY = struct.Struct("!8sHI")  # magic, job, step
_QUERY_LRS = struct.Struct("!8sHIH")  # the same, then n: the step's lrs follow, n x float64 (a script's own)
#: Most lrs a query carries: a script's parameter groups (a layer-wise scale gives one a layer).
MAX_TOLD_LRS = 256
_DIGEST = struct.Struct("!8sHIBIIH")  # magic, job, step, status, lo, hi, blocks; then blocks x u64
_FETCH = struct.Struct("!8sHIII")  # magic, job, step, first chunk, chunks
_CHUNK = struct.Struct("!8sHIIB")  # magic, job, step, chunk, status; then K x fp16 (little-endian)
OK, GONE = 0, 1  # status: the digest/chunk follows; the step is no longer held by the node
_MULT = {}  # K -> per-word multipliers


def _told_lrs(data: bytes) -> tuple[float, ...] | None:
    """The lrs a query with lrs carries (1 to MAX_TOLD_LRS float64), else None."""
    if len(data) < _QUERY_LRS.size + 8:
        return None
    n = _QUERY_LRS.unpack_from(data)[3]
    if not 1 <= n <= MAX_TOLD_LRS or len(data) != _QUERY_LRS.size + 8 * n:
        return None
    return struct.unpack_from(f"!{n}d", data, _QUERY_LRS.size)


class DigestError(RuntimeError):
    """A worker could not check or repair a step against the node's digest (one line)."""


def _multipliers(words: int) -> np.ndarray:
    if words not in _MULT:
        _MULT[words] = np.random.default_rng(0x6D696E6470).integers(0, 1 << 63, words, dtype=np.uint64) * 2 + 1
    return _MULT[words]


_FMIX = (np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53))  # the finaliser's multipliers


def _fmix(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser, in place on a uint64 array."""
    for m in _FMIX:
        x ^= x >> np.uint64(33)
        x *= m
    x ^= x >> np.uint64(33)
    return x


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # mixes the chunk's number into its hash


def chunk_hashes(chunks, params: np.ndarray) -> np.ndarray:
    """(n,) job-wide chunk numbers and their (n, K) fp16 parameters -> (n,) uint64 hashes."""
    p = np.ascontiguousarray(params, dtype=np.float16)
    words = p.reshape(len(p), -1).view(np.uint64)
    h = words @ _multipliers(words.shape[1]) if len(p) else np.zeros(0, np.uint64)
    h ^= (np.asarray(chunks, dtype=np.uint64) + np.uint64(1)) * _GOLDEN
    return _fmix(h)


@dataclass(frozen=True)
class Blocks:
    """How a node's chunk range lo..hi (inclusive, job-wide numbers) is cut into block digests."""

    lo: int
    hi: int

    @property
    def size(self) -> int:
        return -(-(self.hi - self.lo + 1) // BLOCKS)

    @property
    def count(self) -> int:
        return -(-(self.hi - self.lo + 1) // self.size)

    def chunks_of(self, b: int) -> range:
        return range(self.lo + b * self.size, min(self.lo + (b + 1) * self.size, self.hi + 1))

    def add(self, acc: np.ndarray, chunks, hashes: np.ndarray) -> None:
        """acc[block] += hashes of sorted job-wide `chunks` (a run per block, no Python loop per chunk)."""
        if not len(hashes):
            return
        blk = (np.asarray(chunks, dtype=np.int64) - self.lo) // self.size
        starts = np.concatenate(([0], np.flatnonzero(np.diff(blk)) + 1))
        np.add.at(acc, blk[starts], np.add.reduceat(hashes, starts))

    def of(self, flat: np.ndarray) -> np.ndarray:
        """The block digests of a worker's flat fp16 parameters (n_chunks * K) over lo..hi."""
        acc = np.zeros(self.count, dtype=np.uint64)
        rows = flat.reshape(-1, K)[self.lo : self.hi + 1]
        self.add(acc, np.arange(self.lo, self.hi + 1), chunk_hashes(np.arange(self.lo, self.hi + 1), rows))
        return acc


if not fused.NUMPY_ONLY:
    from numba import njit

    @njit(nogil=True, cache=True)
    def _add_hashes(acc, chunks, words, mult, lo, size):
        """acc[block of chunk] += chunk_hashes(chunks, params) (params as uint64 words), row by row."""
        for i in range(words.shape[0]):
            h = np.uint64(0)
            for j in range(words.shape[1]):
                h += words[i, j] * mult[j]
            h ^= (np.uint64(chunks[i]) + np.uint64(1)) * _GOLDEN
            for m in _FMIX:
                h ^= h >> np.uint64(33)
                h *= m
            h ^= h >> np.uint64(33)
            acc[(chunks[i] - lo) // size] += h


class Book:
    """The node's digests: the current step's, summed chunk by chunk as they are applied, and the
    last KEEP committed steps'. `from_state(step)` reads a step's parameters back (only when the
    sums were not all seen by this process: a node restarted mid-step, or a skipped step whose
    previous digest is unknown)."""

    def __init__(self, lo: int, hi: int, from_state, stats: collections.Counter | None = None):
        self.blocks = Blocks(lo, hi)
        self.from_state = from_state
        self.acc = np.zeros(self.blocks.count, dtype=np.uint64)
        self.hashed = 0  # chunks of the current step added to acc
        self.done: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
        self.stats = collections.Counter() if stats is None else stats

    def add(self, chunks, params: np.ndarray) -> None:
        """Sorted job-wide `chunks` of the current step were applied, giving fp16 `params`."""
        if fused.NUMPY_ONLY:
            self.blocks.add(self.acc, chunks, chunk_hashes(chunks, params))
        else:  # chunk_hashes and Blocks.add in one compiled pass: ~45 us of numpy calls a node batch
            words = np.ascontiguousarray(params, dtype=np.float16).view(np.uint64)
            _add_hashes(self.acc, np.asarray(chunks, dtype=np.int64), words, _multipliers(words.shape[1]),
                        self.blocks.lo, self.blocks.size)
        self.hashed += len(params)

    def complete(self, step: int, skipped: bool) -> bool:
        """`step`'s last chunk was applied (skipped: its parameters are the previous step's): its
        digest is kept now, before the commit's write-back, since it does not depend on durability
        (a node killed before the commit re-applies the same sums to the same bits). False if this
        process cannot tell it without the state (it did not see the step, or the one before, whole)."""
        self.done.pop(step, None)
        if skipped and step - 1 in self.done:
            self._keep(step, self.done[step - 1].copy())
        elif not skipped and self.hashed == self.blocks.hi - self.blocks.lo + 1:
            self._keep(step, self.acc.copy())
        return step in self.done

    def commit(self, step: int, skipped: bool) -> None:
        """`step` committed (skipped: as in `complete`). A step whose chunks this process did not
        all see is read back from the state if a worker asks (`get`)."""
        self.complete(step, skipped)
        self.acc[:] = 0
        self.hashed = 0

    def _read(self, step: int) -> np.ndarray:
        self.stats["digests_read_back"] += 1
        return self.from_state(step)

    def _keep(self, step: int, blocks: np.ndarray) -> None:
        self.done[step] = blocks
        self.done.move_to_end(step)
        while len(self.done) > KEEP:
            self.done.popitem(last=False)

    def ready(self, step: int, committed: int) -> bool:
        """A query of `step` is answered now (its digest, or GONE), not held."""
        return step <= committed or step in self.done

    def get(self, step: int, committed: int) -> np.ndarray | None:
        """The block digests of committed `step` (read back if this process has none), or None."""
        if step not in self.done and step == committed and committed >= 0:
            self._keep(step, self._read(step))
        return self.done.get(step)


class Server:
    """The node's side: answers QUERY with the DIGEST of a step (held until its last chunk is
    applied, `Book.complete`, or it commits) and FETCH with the parameters of a committed step's chunks, one CHUNK each.
    `params_of(step, chunks) -> (n, K) fp16 or None` reads them (None: the step is not held)."""

    def __init__(self, job_id: int, book: Book, params_of, bind: str = "0.0.0.0", port: int = DIGEST_PORT,
                 on_lr=None, lr_from: frozenset[str] | None = None):
        """on_lr(step, lrs): a query carried the lrs of its step, a parameter group each (the
        workers' script sets them itself); lr_from: the addresses whose lrs are taken (the job's
        workers; None: any), any other host's are counted (lr_foreign) and left out, its query
        answered as any."""
        self.job_id = job_id
        self.book = book
        self.params_of = params_of
        self.on_lr = on_lr
        self.lr_from = lr_from
        self.sock = bound_udp(bind, port)
        self.held: dict[int, set] = collections.defaultdict(set)  # step -> addresses waiting for it
        self.stats = book.stats
        self.last_query = time.monotonic()  # a node told to end after its steps waits for queries to stop

    def poll(self, committed: int) -> None:
        """Answer what came; then any held query whose step's digest is now known."""
        while True:
            try:
                data, addr = self.sock.recvfrom(_QUERY_LRS.size + 8 * MAX_TOLD_LRS + 1)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                continue
            lrs = _told_lrs(data)
            if (len(data) == _QUERY.size or lrs is not None) and data[:8] == QUERY:
                _, job, step = _QUERY.unpack_from(data)
                if job != self.job_id:
                    self.stats["digest_rejected"] += 1
                    continue
                if lrs and self.on_lr:
                    if self.lr_from is None or addr[0] in self.lr_from:
                        self.on_lr(step, lrs)
                    else:
                        self.stats["lr_foreign"] += 1
                        if self.stats["lr_foreign"] == 1:
                            print(f"mindp-optimizer: {addr[0]} told step {step}'s lrs and is not one of job "
                                  f"{self.job_id}'s workers in the topology: left out", file=sys.stderr, flush=True)
                self.last_query = time.monotonic()
                if self.book.ready(step, committed):
                    self._answer(step, committed, addr)
                elif sum(map(len, self.held.values())) < MAX_HELD:
                    self.held[step].add(addr)
                else:
                    self.stats["digest_queries_dropped"] += 1
            elif len(data) == _FETCH.size and data[:8] == FETCH:
                _, job, step, first, n = _FETCH.unpack(data)
                if job != self.job_id:
                    self.stats["digest_rejected"] += 1
                else:
                    self.last_query = time.monotonic()
                    self._chunks(step, committed, first, n, addr)
            else:
                self.stats["digest_rejected"] += 1
        self.flush(committed)

    def flush(self, committed: int) -> None:
        """Answer the held queries whose step's digest is now known."""
        for step in [s for s in self.held if self.book.ready(s, committed)]:
            for addr in self.held.pop(step):
                self._answer(step, committed, addr)

    def _answer(self, step: int, committed: int, addr) -> None:
        b = self.book.blocks
        blocks = self.book.get(step, committed)
        status = OK if blocks is not None else GONE
        body = blocks.astype(">u8").tobytes() if blocks is not None else b""
        self._send(_DIGEST.pack(DIGEST, self.job_id, step, status, b.lo, b.hi, b.count) + body, addr)
        self.stats["digests_sent"] += 1

    def _chunks(self, step: int, committed: int, first: int, n: int, addr) -> None:
        b = self.book.blocks
        lo, hi = max(first, b.lo), min(first + n, b.hi + 1)
        vals = self.params_of(step, range(lo, hi)) if step == committed and lo < hi else None
        if vals is None:
            self._send(_CHUNK.pack(CHUNK, self.job_id, step, first, GONE), addr)
            return
        for c, v in zip(range(lo, hi), vals):
            self._send(_CHUNK.pack(CHUNK, self.job_id, step, c, OK) + v.astype("<f2").tobytes(), addr)
        self.stats["digest_chunks_sent"] += hi - lo

    def _send(self, data: bytes, addr) -> None:
        try:
            self.sock.sendto(data, addr)
        except OSError:  # a full buffer or an unreachable worker: it asks again
            self.stats["digest_send_errors"] += 1

    def close(self) -> None:
        self.sock.close()


@dataclass(frozen=True)
class Source:
    """A node a worker checks: its chunk range (inclusive) and IPv4 address."""

    lo: int
    hi: int
    ip: str


def open_socket() -> socket.socket:
    """A worker's digest socket (any port but mindp's own) in the current network namespace."""
    sock = ephemeral_udp()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.setblocking(False)
    return sock


class Client:
    """A worker's side: `ask(step)` as the step starts; `check(step, flat, ...)` once its parameters
    are all in: waits for each source's digest, compares, and repairs differing chunks in `flat`
    from the node. Counts digest_checks, digest_mismatches and digest_repaired_chunks in `stats`."""

    def __init__(self, sock: socket.socket, job_id: int, name: str, sources: list[Source], port: int = DIGEST_PORT):
        self.sock = sock
        self.job_id = job_id
        self.name = name  # "mindp-worker J/W", the mismatch line's prefix
        self.sources = sources
        self.port = port
        self.answers: dict[tuple[int, str], np.ndarray | None] = {}  # (step, ip) -> blocks (None: GONE)
        self.chunks: dict[tuple[int, int], np.ndarray | None] = {}  # (step, chunk) -> fp16 (None: GONE)
        self.asked_at = 0.0
        self.sent = self.send_errors = self.received = 0  # for DigestError's line
        self.idle = self._select
        self.link_down = False
        self.lrs: dict[int, tuple[float, ...]] = {}  # step -> the lrs its queries carry (a script's own)

    def _select(self, timeout: float) -> bool:
        """Wait up to `timeout` for an answer; True if the link is known to be down. The worker
        replaces it with one that also watches its raw socket (a link going down while it waits)."""
        readable([self.sock], timeout)
        return False

    def ask(self, step: int, lrs: tuple[float, ...] | None = None) -> None:
        """Query step's digest of every source not yet answered; `lrs`: the step's lrs (a parameter
        group each), told the nodes with each query of the step from now on (their optimizer applies
        them: a script's own)."""
        if lrs is not None:
            if not 1 <= len(lrs) <= MAX_TOLD_LRS:
                raise DigestError(f"{len(lrs)} parameter groups: a step's query tells 1 to {MAX_TOLD_LRS} lrs")
            self.lrs[step] = tuple(lrs)
        lrs = self.lrs.get(step)
        query = _QUERY.pack(QUERY, self.job_id, step) if lrs is None else \
            _QUERY_LRS.pack(QUERY, self.job_id, step, len(lrs)) + struct.pack(f"!{len(lrs)}d", *lrs)
        for s in self.sources:
            if (step, s.ip) not in self.answers:
                self._send(query, s.ip)
        self.asked_at = time.monotonic()

    def _send(self, data: bytes, ip: str) -> None:
        try:
            self.sock.sendto(data, (ip, self.port))
            self.sent += 1
        except OSError:  # ARP pending, a node restarting: asked again
            self.send_errors += 1

    def _read(self) -> None:
        while True:
            try:
                data, (ip, _) = self.sock.recvfrom(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # an ICMP unreachable reported on the socket
                continue
            self.received += 1
            if len(data) >= _DIGEST.size and data[:8] == DIGEST:
                _, job, step, status, lo, hi, n = _DIGEST.unpack_from(data)
                if job == self.job_id and (status != OK or len(data) == _DIGEST.size + 8 * n):
                    self.answers[(step, ip)] = (np.frombuffer(data, ">u8", n, _DIGEST.size).astype(np.uint64)
                                                if status == OK else None)
            elif len(data) >= _CHUNK.size and data[:8] == CHUNK:
                _, job, step, chunk, status = _CHUNK.unpack_from(data)
                owner = any(s.ip == ip and s.lo <= chunk <= s.hi for s in self.sources)  # no other host's
                if owner and job == self.job_id and (status != OK or len(data) == _CHUNK.size + 2 * K):
                    self.chunks[(step, chunk)] = (np.frombuffer(data, "<f2", K, _CHUNK.size).astype(np.float16)
                                                  if status == OK else None)

    def _wait(self, done, resend, interval: float, deadline: float, what: str) -> None:
        """Read answers until done(); resend() every `interval` s; DigestError after `deadline` s
        without an answer, not counting time the link is down (`idle` says so)."""
        last = time.monotonic()
        seen = len(self.answers) + len(self.chunks)
        while True:
            self._read()
            if done():
                return
            now = time.monotonic()
            if len(self.answers) + len(self.chunks) != seen or self.link_down:
                seen, last = len(self.answers) + len(self.chunks), now
            elif now - last > deadline:
                raise DigestError(f"{self.name}: no {what} from the optimizer node after {deadline:.0f} s "
                                  f"({self.sent} messages sent, {self.send_errors} refused, {self.received} received)")
            if now - self.asked_at >= interval:
                resend()
                self.asked_at = now
            self.link_down = self.idle(min(interval, 0.05))

    def check(self, step: int, flat: np.ndarray, stats, interval: float, deadline: float) -> None:
        """Check `flat` (the step's fp16 parameters, n_chunks * K) against the nodes' digests of
        `step`; repair chunks that differ (one line names them); DigestError if it cannot."""
        stats["digest_checks"] += 1
        bad = self._compare(step, flat, interval, deadline)
        if bad:
            # An answer that came before the step was complete may be outdated: a shard that committed
            # the step and then learned from another that it is non-finite commits it again as skipped.
            for s in self.sources:
                self.answers.pop((step, s.ip), None)
            bad = self._compare(step, flat, interval, deadline)
        if bad:
            self._repair(step, flat, stats, bad, interval, deadline)
        self._forget(step)

    def _compare(self, step: int, flat: np.ndarray, interval: float, deadline: float) -> list:
        """(source, its blocks, the blocks that differ) for each source whose digest `flat` misses."""
        self._wait(lambda: all((step, s.ip) in self.answers for s in self.sources), lambda: self.ask(step),
                   interval, deadline, f"digest of step {step}")
        bad: list[tuple[Source, Blocks, list[int]]] = []
        for s in self.sources:
            theirs = self.answers[(step, s.ip)]
            if theirs is None:
                raise DigestError(f"{self.name}: step {step}'s digest is no longer held by the optimizer node {s.ip}")
            blocks = Blocks(s.lo, s.hi)
            differ = np.flatnonzero(blocks.of(flat) != theirs).tolist()
            if differ:
                bad.append((s, blocks, differ))
        return bad

    def _repair(self, step: int, flat: np.ndarray, stats, bad, interval: float, deadline: float) -> None:
        stats["digest_mismatches"] += 1
        want = [(s, c) for s, blocks, differ in bad for b in differ for c in blocks.chunks_of(b)]

        def fetch() -> None:
            missing = [(s, c) for s, c in want if (step, c) not in self.chunks]
            for s, run in _runs(missing):
                self._send(_FETCH.pack(FETCH, self.job_id, step, run.start, len(run)), s.ip)

        fetch()
        self.asked_at = time.monotonic()
        self._wait(lambda: all((step, c) in self.chunks for _, c in want), fetch, interval, deadline,
                   f"parameters of step {step} to repair")
        rows = flat.reshape(-1, K)
        changed = []
        for _, c in want:
            theirs = self.chunks[(step, c)]
            if theirs is None:
                raise DigestError(f"{self.name}: step {step}: its parameters are no longer held by the optimizer node")
            if theirs.tobytes() != rows[c].tobytes():
                rows[c] = theirs
                changed.append(c)
        stats["digest_repaired_chunks"] += len(changed)
        print(f"{self.name}: step {step}: {MISMATCH_LINE} in {len(changed)} "
              f"chunk(s): {listed(changed, 8)}; taken again from the node", file=sys.stderr, flush=True)
        for s, blocks, differ in bad:
            if (blocks.of(flat)[differ] != self.answers[(step, s.ip)][differ]).any():
                raise DigestError(f"{self.name}: step {step}: parameters still differ from the optimizer node's "
                                  "digest after taking them again")

    def _forget(self, step: int) -> None:
        for key in [k for k in self.lrs if k <= step]:
            del self.lrs[key]
        for key in [k for k in self.answers if k[0] <= step]:
            del self.answers[key]
        for key in [k for k in self.chunks if k[0] <= step]:
            del self.chunks[key]

    def close(self) -> None:
        self.sock.close()


def _runs(items: list[tuple[Source, int]]):
    """(source, chunk) pairs in order -> (source, range) runs of consecutive chunks of one source."""
    run_src, run = None, None
    for s, c in items:
        if run is not None and s == run_src and c == run.stop:
            run = range(run.start, c + 1)
            continue
        if run is not None:
            yield run_src, run
        run_src, run = s, range(c, c + 1)
    if run is not None:
        yield run_src, run
