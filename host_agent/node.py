"""The optimizer node: applies each (step, chunk) sum exactly once, out of core.

`NodeCore` is the pure state machine (sums in, parameter chunks out, no socket);
`OptimizerNode` runs it on a raw socket; `main` is the `mindp-optimizer` CLI.
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import pathlib
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from mindp import codec
from mindp.protocol import MAX_WORKERS, K, Flag, Kind
from mindp.topology import Topology, TopologyError

from . import agent_args, fused, lr, optim, probe, rawsock, shards, state
from .agent_args import finite
from .optim import ConfigError, OptimizerConfig
from .pager import PagerError, StorageError
from .rawsock import LINK_BACKOFF, LINK_ERRNOS
from .worker import RtoConfig


class NodeCore:
    """Sums -> parameter chunks, with the state in a `state.Store`.

    A sum of the current step for a chunk not yet applied is applied (or, if it
    carries NONFINITE, the chunk is carried over unchanged and `on_nonfinite` is
    called); a sum already applied, or of the last committed step, is answered by
    resending that chunk's parameters; older and malformed sums are counted and
    dropped. When the step's last chunk is applied the step is committed (durable)
    before its parameters are returned for sending.

    The job's membership may change between steps (the controller adds or removes
    workers): a sum's `nworkers`, the contributions the switch counted, is trusted
    within 1..max_workers and is the divisor of that chunk's mean; `n_workers` is
    only the count the job started with.
    """

    def __init__(self, store: state.Store, job_id: int, n_workers: int, slots: int,
                 on_nonfinite: Callable[[int, int], None] | None = None, max_workers: int = MAX_WORKERS):
        self.store = store
        self.cfg = store.cfg
        self.job_id = job_id
        self.n_workers = n_workers
        self.max_workers = max_workers
        self.slots = slots
        self.on_nonfinite = on_nonfinite
        self.rates = lr.Rates(self.cfg.lr, self.cfg.schedule)  # the lr of each step, its number from the state
        fused.warm(self.cfg)  # compile the kernel now, not on the first sum
        # A shard owns chunks lo..hi of the job's chunk space: headers carry job-wide chunk
        # numbers (slots and versions follow the whole model), the store holds records 0..hi-lo.
        self.lo, self.hi = store.chunks
        self.n = store.n_chunks
        self.n_total = store.layout.n_chunks
        self.last_count = store.layout.chunk_count(self.hi)  # every other chunk holds K elements
        self.stats = collections.Counter()
        self.nonfinite: list[tuple[int, int]] = []
        # Per slot, the header of the last fresh answer: a worker lacking the parameters of chunk c
        # never sends c + slots (its window), so no later chunk of c's slot is applied, and a chunk
        # some worker still waits for is the last applied of its slot (see recent_params).
        self.recent = np.zeros(slots, dtype=codec.HEADER_DTYPE)
        self._recent_bytes = self.recent.view(np.uint8).reshape(slots, -1)
        self.recent_set = np.zeros(slots, dtype=bool)
        if store.resumed_chunks:
            self.stats["resumed_chunks"] = store.resumed_chunks
        if store.step_complete:
            store.commit()

    @property
    def committed(self) -> int:
        return self.store.committed

    def _valid(self, h: np.ndarray) -> np.ndarray:
        ok, bad = fused.check_sums(h, self.job_id, self.max_workers, self.lo, self.hi, self.n_total, self.slots,
                                   self.last_count)
        for reason, n in zip(fused.CHECKS, bad.tolist()):
            if n:
                self.stats[f"rejected_{reason}"] += n
        return ok

    def handle(self, headers: np.ndarray, sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A batch of SUM headers and (n, K) int64 sums -> PARAM headers and (m, K) fp16 to send."""
        self.stats["sums"] += len(headers)
        if not self.store.step_nonfinite:
            usual = self._handle_in_order(headers, sums)
            if usual is not None:
                return usual
        ok = self._valid(headers)
        cur = self.store.current
        idx = np.flatnonzero(ok)
        steps = headers["step"][idx].astype(np.int64)
        chunks = headers["chunk"][idx].astype(np.int64) - self.lo  # the store's record numbers
        is_cur = steps == cur
        fresh = np.flatnonzero(is_cur & ~self.store.applied[chunks])
        # The first sum of each fresh chunk is applied; any other sum of this or the last step is
        # a duplicate, answered from the stored parameters.
        uniq = chunks[fresh]
        if len(uniq) > 1 and not (uniq[1:] > uniq[:-1]).all():  # else: in chunk order, each once (usual)
            uniq, first = np.unique(uniq, return_index=True)
        else:
            first = np.arange(len(uniq))
        apply_rows = idx[fresh[first]]
        answer = is_cur | (steps == cur - 1)
        answer[fresh[first]] = False
        resend = idx[answer]
        if len(idx) > np.count_nonzero(is_cur):
            self.stats["stale"] += int((steps < cur - 1).sum())
            self.stats["future"] += int((steps > cur).sum())
        if not len(uniq) and not len(resend):
            return np.zeros(0, dtype=headers.dtype), np.zeros((0, K), dtype=np.float16)
        # The answers' headers: the applied rows', then the resent rows'.
        hdr = take_rows(headers, np.concatenate((apply_rows, resend)) if len(resend) else apply_rows)
        out_vals: list[np.ndarray] = []
        prev_skipped = self.store.last_skipped
        if len(uniq):  # uniq is sorted: runs of consecutive chunks are applied together
            applied_hdr = hdr[: len(uniq)]
            self._learn_nonfinite(cur, uniq, applied_hdr)
            # Sums that arrived in chunk order (the usual case) go to the kernel without a copy.
            in_order = len(apply_rows) == len(sums) and bool((apply_rows == np.arange(len(sums))).all())
            out_vals.append(self._apply(cur, uniq, applied_hdr["nworkers"].astype(np.float64),
                                        sums if in_order else sums[apply_rows]))
            self._commit_if_complete()
        if len(resend):
            self.stats["resent"] += len(resend)
            out_vals.append(np.stack([self._params_of(int(headers["step"][i]), int(headers["chunk"][i]))
                                      for i in resend]))
        # A sum's RETRANSMIT (completed by a retransmitted gradient) stays on its parameters so
        # that workers take no round-trip sample from them; resent parameters carry it always.
        hdr["flags"] &= np.uint8(Flag.NONFINITE | Flag.RETRANSMIT)
        if len(resend):
            hdr["flags"][-len(resend):] |= np.uint8(Flag.RETRANSMIT)
        # Every answer sent after the node learned that a step is non-finite says so.
        cur_nf = self.store.step_nonfinite if self.store.current == cur else self.store.last_skipped
        skipped = ((hdr["step"] == cur) & cur_nf) | ((hdr["step"] == cur - 1) & prev_skipped)
        hdr["flags"][skipped] |= np.uint8(Flag.NONFINITE)
        hdr["nworkers"] = 0
        hdr["worker"] = 0
        hdr["kind"] = Kind.PARAM
        if len(uniq):
            self._remember(cur, uniq, hdr[: len(uniq)])
        return hdr, out_vals[0] if len(out_vals) == 1 else np.concatenate(out_vals)

    def _handle_in_order(self, headers: np.ndarray, sums: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """The usual batch (valid sums of the current step for consecutive chunks not yet applied,
        none NONFINITE) with its checks and answer headers in one compiled pass; None otherwise."""
        cur = self.store.current
        usual = fused.in_order_batch(headers, self.job_id, self.max_workers, self.lo, self.hi, self.n_total,
                                     self.slots, self.last_count, cur, self.store.applied)
        if usual is None:
            return None
        hdr, nworkers = usual
        lo = int(headers["chunk"][0]) - self.lo
        chunks = range(lo, lo + len(hdr))  # (sorted and consecutive: no array needed)
        out = self._apply(cur, chunks, nworkers, sums)
        self._commit_if_complete()
        self._remember(cur, chunks, hdr)
        return hdr, out

    def _commit_if_complete(self) -> None:
        if self.store.step_complete:
            self.store.commit()
            self.stats["steps"] += 1

    def _remember(self, step: int, chunks: np.ndarray | range, applied: np.ndarray) -> None:
        """After sorted `chunks` of `step` were applied (answer headers `applied`): each slot's last
        answer (for recent_params), and the pages to read ahead."""
        if chunks[-1] - chunks[0] == len(chunks) - 1:
            # Consecutive chunks: the last `slots` rows, one per slot (chunk % slots, checked), in
            # slot order from the first of them's: copied as bytes in at most two slices.
            n = min(len(chunks), self.slots)
            first = (self.lo + chunks[-1] + 1 - n) % self.slots
            rows = applied[len(applied) - n :].view(np.uint8).reshape(n, -1)
            m = min(n, self.slots - first)
            self._recent_bytes[first : first + m] = rows[:m]
            self._recent_bytes[: n - m] = rows[m:]
            self.recent_set[first : first + m] = True
            self.recent_set[: n - m] = True
        else:
            slot = applied["slot"].astype(np.intp)
            _, last = np.unique(slot[::-1], return_index=True)  # each slot's last row, at most `slots`
            rows = take_rows(applied, len(applied) - 1 - last)
            slot = rows["slot"].astype(np.intp)
            as_void(self.recent)[slot] = as_void(rows)
            self.recent_set[slot] = True
        self.store.prefetch_from(0 if self.store.current != step else int(chunks[-1]) + 1)

    def recent_params(self) -> tuple[np.ndarray, np.ndarray]:
        """The parameters of each slot's last applied chunk (of the current or the last committed
        step; at most `slots`), flagged RETRANSMIT, to send again when sums stop coming: after a
        switch restart the workers that got a chunk's parameters will not resend its gradient, so
        the ones that missed them can only learn them from the node."""
        cur = self.store.current
        hdr = self.recent[self.recent_set]
        hdr = hdr[(hdr["step"].astype(np.int64) >= cur - 1) & (hdr["step"].astype(np.int64) <= cur)]
        if not len(hdr):
            return np.zeros(0, dtype=codec.HEADER_DTYPE), np.zeros((0, K), dtype=np.float16)
        hdr["flags"] |= np.uint8(Flag.RETRANSMIT)
        skipped = ((hdr["step"] == cur) & self.store.step_nonfinite) | ((hdr["step"] == cur - 1) & self.store.last_skipped)
        hdr["flags"][skipped] |= np.uint8(Flag.NONFINITE)
        return hdr, np.stack([self._params_of(int(h["step"]), int(h["chunk"])) for h in hdr])

    def skip_step(self, step: int) -> bool:
        """Another shard of the job saw a non-finite chunk in `step`: the whole step is a no-op here
        too. The current step is marked (as by a NONFINITE sum); the committed one is committed again
        as skipped (no chunk of the next step can be applied yet: workers send none before every
        shard acknowledged). False for a step this node has not reached (not acknowledged)."""
        if step == self.store.current:
            if not self.store.step_nonfinite:
                self.store.mark_nonfinite()
                self.stats["nonfinite_steps"] += 1
        elif step == self.store.committed:
            if self.store.skip_committed():
                self.stats["nonfinite_steps"] += 1
        elif step > self.store.current:
            return False
        return True

    def _learn_nonfinite(self, step: int, chunks: np.ndarray, headers: np.ndarray) -> None:
        """A NONFINITE sum makes the whole step a no-op (dynamic loss scaling): the step commits as
        skipped with the state before it. Chunks already applied need no revert: their source copy
        is untouched and the skipped step's commit keeps pointing at it."""
        flagged = chunks[(headers["flags"] & Flag.NONFINITE) != 0]
        if not len(flagged):
            return
        if not self.store.step_nonfinite:
            self.store.mark_nonfinite()
            self.stats["nonfinite_steps"] += 1
        for c in (flagged + self.lo).tolist():
            self.nonfinite.append((step, c))
            self.stats["nonfinite_chunks"] += 1
            if self.on_nonfinite:
                self.on_nonfinite(step, c)

    def _apply(self, step: int, chunks: np.ndarray | range, nworkers: np.ndarray, sums: np.ndarray) -> np.ndarray:
        """Sorted unique `chunks` of `step` updated with `sums` averaged over `nworkers` (float64,
        one per chunk) -> their fp16 parameters."""
        store = self.store
        src, dst = store.copy_after(step - 1), store.copy_after(step)
        out = np.empty((len(chunks), K), dtype=np.float16)
        pos = 0
        # State mapped whole (in RAM): a run of consecutive chunks is one kernel call across pages,
        # marked applied page by page; streamed, each page's records are one call.
        span = store.n_chunks if store.pages.mapped else store.page_chunks
        for lo, hi in page_runs(chunks, span):
            n = hi - lo
            if store.step_nonfinite:  # answered with the parameters before the step
                out[pos : pos + n] = store.records(src, lo, hi)[:, state.MASTER].astype(np.float16)
            else:  # one fused pass: old record in, new record and fp16 parameters out
                new = store.records(dst, lo, hi, write=True)
                old = store.records(src, lo, hi)
                # Adam's bias correction counts updates, not steps: a skipped step is none.
                fused.update_records(self.cfg, old, new, sums[pos : pos + n], nworkers[pos : pos + n], store.updates,
                                     out[pos : pos + n], lr=self.rates.at(step))
            for a, b in [(lo, hi)] if store.pages.mapped else page_cuts(lo, hi, store.page_chunks):
                store.mark_applied(a, b)
            if not store.pages.mapped:  # a batch spans pages: keep the reads ahead of this one
                store.prefetch_from(hi)
            pos += n
        self.stats["applied"] += len(chunks)
        return out

    def _params_of(self, step: int, chunk: int) -> np.ndarray:
        """The parameters of job-wide `chunk` after `step`."""
        chunk -= self.lo
        rec = self.store.records(self.store.copy_after(step), chunk, chunk + 1)
        return rec[0, state.MASTER].astype(np.float16)


def as_void(a: np.ndarray) -> np.ndarray:
    """Structured rows seen as opaque bytes: numpy copies these with memcpy, not field by field."""
    return a.view(np.dtype((np.void, a.dtype.itemsize)))


def take_rows(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """a[rows] (a copy) for a structured array, ten times faster than numpy's field-wise take."""
    return as_void(a)[rows].view(a.dtype)


def page_cuts(lo: int, hi: int, page_chunks: int):
    """Chunks [lo, hi) cut at page boundaries: [lo, hi) runs within one page each."""
    cuts = list(range((lo // page_chunks + 1) * page_chunks, hi, page_chunks))
    return zip([lo, *cuts], [*cuts, hi])


def page_runs(chunks: np.ndarray | range, page_chunks: int):
    """Sorted unique chunks -> [lo, hi) runs of consecutive chunks within one page, without a
    Python object per chunk."""
    lo, hi = int(chunks[0]), int(chunks[-1]) + 1
    if hi - lo == len(chunks):  # consecutive (the usual case): cut at page boundaries only
        return page_cuts(lo, hi, page_chunks)
    brk = np.flatnonzero((np.diff(chunks) != 1) | (np.diff(chunks // page_chunks) != 0)) + 1
    starts = np.concatenate(([0], brk))
    ends = np.concatenate((brk, [len(chunks)]))
    return zip(chunks[starts].tolist(), (chunks[ends - 1] + 1).tolist())


#: Frames the node takes per poll at most (its receive buffer, 5 MB; the socket's buffer holds
#: more, rawsock.prepare). Each batch costs ~100 us besides the kernel (header pass, a kernel call
#: waking its threads, bookkeeping, its share of the commit): at 4096 sums a batch that was a third
#: of a 4M-element step's time, at 16384 about a quarter of the kernel's.
RECV_ROWS = 16384


@dataclass
class NodeAddress:
    mac: str
    ip: str


class OptimizerNode:
    """NodeCore on a raw socket: SUM frames in, PARAM frames out to the switch (broadcast address)."""

    #: Resends of one stall: at 1, 3, 7, ... times stall_resend seconds without a sum.
    STALL_RESENDS = 6

    def __init__(self, core: NodeCore, sock, addr: NodeAddress, faults: rawsock.Faults | None = None,
                 stall_resend: float = 1.0, sources: list[tuple[str, str]] | None = None,
                 agreement: shards.NonfiniteAgreement | None = None):
        """agreement: a shard's non-finite agreement with the job's other shards (host_agent.shards)."""
        self.core = core
        self.agreement = agreement
        self.sock = sock
        self.addrs = codec.Addresses(addr.mac, "ff:ff:ff:ff:ff:ff", addr.ip, "255.255.255.255")
        self.faults = faults
        self.stats = core.stats
        self.stall_resend = stall_resend
        self.mac = bytes.fromhex(addr.mac.replace(":", ""))
        self.ip = socket.inet_aton(addr.ip)
        self.sources = None if sources is None else {(bytes.fromhex(m.replace(":", "")), socket.inet_aton(i))
                                                      for m, i in sources}
        self.auxdata = rawsock.enable_auxdata(sock)
        # Sums come in by recvmmsg straight into the rows of one buffer, a burst per poll.
        self.rx = np.zeros((RECV_ROWS, codec.frame_len(Kind.SUM)), dtype=np.uint8)
        self.receiver = rawsock.RowReceiver(self.rx, True) if rawsock.MMSG and self.auxdata else None
        self._src_keys = None if self.sources is None else [int.from_bytes(m + i, "big") for m, i in self.sources]
        self._stop = False
        self._last_sum = time.monotonic()
        self._stall_resends = 0
        self._down_since: float | None = None
        self._backoff = LINK_BACKOFF[0]

    def stop(self) -> None:
        self._stop = True

    def poll(self, timeout: float) -> int:
        """Wait up to `timeout` for frames, handle one batch; returns frames received. A link that
        went down (ENETDOWN/ENXIO/ENODEV) is reported in one line and retried with backoff;
        frames lost meanwhile are recovered by the workers' retransmissions and the stall resend."""
        try:
            n = self._poll(timeout)
        except OSError as exc:
            if exc.errno not in LINK_ERRNOS:
                raise
            self._link_down(exc)
            return 0
        if n and self._down_since is not None:
            print(f"mindp-optimizer: link back after {time.monotonic() - self._down_since:.1f} s", file=sys.stderr,
                  flush=True)
            self._down_since, self._backoff = None, LINK_BACKOFF[0]
        return n

    def _link_down(self, exc: OSError) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
            self.stats["link_down"] += 1
            print(f"mindp-optimizer: link down ({exc.strerror}); retrying every {LINK_BACKOFF[0]}-{LINK_BACKOFF[1]} s",
                  file=sys.stderr, flush=True)
        time.sleep(self._backoff)
        self._backoff = min(self._backoff * 2, LINK_BACKOFF[1])

    def _poll(self, timeout: float) -> int:
        peers = [self.agreement.sock] if self.agreement else []
        ready, _, _ = select.select([self.sock, *peers], [], [], timeout)
        if self.agreement:  # notices, acknowledgements, resends; answers the peers released
            for hdr, vals in self.agreement.poll():
                self._send(hdr, vals, held=False)
        if self.sock not in ready:
            return 0
        if self.receiver is not None and not self.faults:
            n, tagged, other = rawsock.recv_rows_untagged(self.sock, self.rx, self.receiver)
            self.stats["rejected_tagged"] += tagged
            self.stats["rejected_length"] += other
            rows = self.rx[:n]
            return self._handle(rows[self._rows_from_switch(rows)])
        if self.auxdata:
            frames, tagged = rawsock.recv_batch_untagged(self.sock)
            if tagged:
                self.stats["rejected_tagged"] += tagged
        else:
            frames = rawsock.recv_batch(self.sock)
        frames = self._from_switch(frames)
        if self.faults:
            frames = self.faults.filter_recv(frames)
        return self._handle(frames)

    def _handle(self, frames) -> int:
        """Received frames (bytes, or rows of SUM length) -> answers sent; returns how many."""
        dec = codec.decode(frames, Kind.SUM)
        for reason, n in dec.rejects.items():
            self.stats[f"rejected_{reason}"] += n
        if len(dec.headers):
            self._last_sum = time.monotonic()
            self._stall_resends = 0
            self._send(*self.core.handle(dec.headers, dec.elements))
        return len(frames)

    def _rows_from_switch(self, rows: np.ndarray) -> np.ndarray:
        """_from_switch over rows of SUM length, vectorised: which rows to keep."""
        def field(lo: int, hi: int) -> np.ndarray:
            wide = np.zeros((len(rows), 16), dtype=np.uint8)
            wide[:, 16 - (hi - lo) :] = rows[:, lo:hi]
            return wide.view(">u8").reshape(-1, 2)
        mine = (field(0, 6) == np.frombuffer(self.mac.rjust(16, b"\0"), ">u8")).all(axis=1) \
            & (field(30, 34) == np.frombuffer(self.ip.rjust(16, b"\0"), ">u8")).all(axis=1)
        if self._src_keys is not None:
            # (MAC, IP) as one 80-bit key in two 64-bit words, compared with each possible source.
            key = np.zeros((len(rows), 16), dtype=np.uint8)
            key[:, 6:12] = rows[:, 6:12]
            key[:, 12:16] = rows[:, 26:30]
            words = key.view(">u8").reshape(-1, 2)
            known = np.zeros(len(rows), dtype=bool)
            for k in self._src_keys:
                known |= (words[:, 0] == k >> 64) & (words[:, 1] == k & 0xFFFFFFFFFFFFFFFF)
            mine &= known
        if not mine.all():
            self.stats["rejected_source"] += int(np.count_nonzero(~mine))
        return mine

    def _from_switch(self, frames: list) -> list:
        """SUM-sized frames are sums only if addressed to us (MAC and IP, as the switch rewrites
        them) from a host the job may have as a worker (`sources`, if known); others are counted."""
        size = codec.frame_len(Kind.SUM)
        keep = []
        for f in frames:
            if len(f) == size and (f[0:6] != self.mac or f[30:34] != self.ip
                                   or (self.sources is not None and (bytes(f[6:12]), bytes(f[26:30])) not in self.sources)):
                self.stats["rejected_source"] += 1
            else:
                keep.append(f)
        return keep

    def _send(self, hdr: np.ndarray, vals: np.ndarray, held: bool = True) -> int:
        if self.agreement and held:  # a shard holds NONFINITE answers until every shard knows
            hdr, vals = self.agreement.outgoing(hdr, vals)
        if not len(hdr):
            return 0
        out = codec.encode(Kind.PARAM, hdr, vals, self.addrs)
        sent, failed = rawsock.send_rows(self.sock, out, range(len(out)), self.faults)
        self.stats["params_sent"] += sent
        self.stats["send_errors"] += failed
        return sent

    def check_stall(self, now: float) -> None:
        """No sum for stall_resend s (then 3x, 7x, ...): send the recent parameters again. Covers
        a switch that lost its partial sums (restart) while some workers had a chunk's parameters
        and others not, and a lost last parameter chunk of the run."""
        if not self.stall_resend or self._stall_resends >= self.STALL_RESENDS:
            return
        if now - self._last_sum < self.stall_resend * (2 ** (self._stall_resends + 1) - 1):
            return
        self._stall_resends += 1
        self.stats["stall_resends"] += self._send(*self.core.recent_params())

    def serve(self, steps: int | None = None, linger: float = 5.0, idle_timeout: float | None = None) -> None:
        """Serve until `steps` steps are committed and no sum came for `linger` s (late resends
        are answered meanwhile), until stop(), or until idle for `idle_timeout` s."""
        self.core.store.prefetch_from(0)
        last = time.monotonic()
        while not self._stop:
            if self.poll(0.05):
                last = time.monotonic()
            now = time.monotonic()
            self.check_stall(now)
            idle = now - last
            if steps is not None and self.core.committed + 1 >= steps and idle >= linger:
                return
            if idle_timeout is not None and idle >= idle_timeout:
                return


# --- CLI ------------------------------------------------------------------------

#: Default linger: twice the workers' largest RTO plus a second, so that a worker whose last
#: parameters were lost retransmits (and is answered) before the node exits.
LINGER = 2 * RtoConfig.max + 1.0

def parse_size(text: str) -> int:
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    unit = t[-1] if t and t[-1] in units else ""
    try:
        value = float(t[: len(t) - len(unit)])
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"bad size {text!r} (e.g. 64M, 1G)")
    return int(value * units[unit])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mindp-optimizer", description="mindp optimizer node (out-of-core AdamW/SGD)")
    p.add_argument("--iface", default="eth0", help="interface facing the switch")
    p.add_argument("--topology", help="topology JSON (mindp.topology); gives the job's workers, slots and our addresses")
    p.add_argument("--job", type=int, default=1, help="job id")
    p.add_argument("--workers", type=int, help="worker count (without --topology)")
    p.add_argument("--slots", type=int, help="the job's slot count (without --topology)")
    p.add_argument("--max-workers", type=int, default=MAX_WORKERS,
                   help="largest worker count a sum may carry (the job's membership may change between steps)")
    p.add_argument("--mac", help="our MAC (without --topology)")
    p.add_argument("--ip", help="our IPv4 address (without --topology)")
    p.add_argument("--shard", type=int, help="with --topology: which of the job's optimizer shards this node is (0..M-1)")
    p.add_argument("--chunks", help="without --topology: the chunk range LO:HI (inclusive) this shard owns")
    p.add_argument("--peers", help="without --topology: the other shards' IPv4 addresses, comma-separated")
    p.add_argument("--state-dir", required=True, help="directory of the out-of-core state (resumed if present)")
    p.add_argument("--ram-budget", type=parse_size, default=parse_size("256M"), help="resident state budget")
    p.add_argument("--page-chunks", type=int, default=state.DEFAULT_PAGE_CHUNKS, help="chunks per page")
    agent_args.add_model_args(p)
    p.add_argument("--optimizer", choices=optim.KINDS, default="adamw")
    p.add_argument("--lr", type=finite, default=1e-3)
    p.add_argument("--weight-decay", type=finite, default=0.01)
    p.add_argument("--momentum", type=finite, default=0.9)
    p.add_argument("--eps", type=finite, default=OptimizerConfig.eps, help="AdamW epsilon")
    p.add_argument("--optimizer-spec", metavar="FILE",
                   help="the optimizer as JSON (OptimizerConfig.to_dict: kind, lr, schedule...; written by a "
                        "mindp.torch script's describe run) instead of --optimizer/--lr/...; a state that exists "
                        "keeps its own")
    p.add_argument("--steps", type=int, help="exit after this many steps are committed (and late resends settle)")
    p.add_argument("--linger", type=finite, default=LINGER,
                   help="seconds of quiet after the last step before exiting (more than the workers' largest RTO, "
                        "so a worker whose last parameters were lost is still answered)")
    p.add_argument("--idle-timeout", type=finite, help="exit after this many seconds without a sum")
    p.add_argument("--stall-resend", type=finite, default=1.0,
                   help="seconds without a sum before the recent parameters are sent again (0: never)")
    p.add_argument("--export", help="write the final master parameters to this .npz")
    p.add_argument("--stats", help="write counters as JSON here at exit")
    p.add_argument("--plan", action="store_true",
                   help="print the residency plan for this state and --ram-budget and the step time it predicts "
                        "(measures the disk, memory and update rate: a few seconds), then exit")
    agent_args.add_fault_args(p, send_reorder=True)
    return p


def _job_from_args(args) -> tuple[int, int, NodeAddress]:
    if args.topology:
        topo = Topology.load(args.topology)
        jobs = {j.job_id: j for j in topo.jobs}
        if args.job not in jobs:
            raise TopologyError(f"job {args.job} is not in {args.topology}")
        job = jobs[args.job]
        host = topo.host(job.optimizers[args.shard or 0])
        return job.n_workers, job.slots, NodeAddress(host.mac, host.ip)
    missing = [f"--{n}" for n in ("workers", "slots", "mac", "ip") if getattr(args, n) is None]
    if missing:
        raise ConfigError(f"without --topology, give {' '.join(missing)}")
    return args.workers, args.slots, NodeAddress(args.mac, args.ip)


def shard_from_args(args) -> tuple[tuple[int, int] | None, list[str]]:
    """This node's chunk range (None: the whole model) and the IPv4 addresses of the job's other
    shards: from the topology's optimizer list with --shard I, or --chunks LO:HI and --peers."""
    if args.topology:
        topo = Topology.load(args.topology)
        job = topo.job(args.job)
        if args.chunks or args.peers:
            raise ConfigError("with --topology the shards come from the job's optimizer list: give --shard I")
        if not job.sharded:
            if args.shard not in (None, 0):
                raise ConfigError(f"job {args.job} has one optimizer node: no --shard {args.shard}")
            return None, []
        ranges = topo.shard_ranges(job)
        if args.shard is None or not 0 <= args.shard < len(ranges):
            raise ConfigError(f"job {args.job} has {len(ranges)} optimizer shards: give --shard 0..{len(ranges) - 1}")
        lo, hi, _ = ranges[args.shard]
        return (lo, hi), [topo.host(h).ip for i, (_, _, h) in enumerate(ranges) if i != args.shard]
    if args.shard is not None:
        raise ConfigError("--shard needs --topology (or give --chunks LO:HI)")
    peers = [p for p in (args.peers or "").split(",") if p]
    if peers and not args.chunks:
        raise ConfigError("--peers needs --chunks")
    return (shards.parse_chunks(args.chunks) if args.chunks else None), peers


def sum_sources(args) -> list[tuple[str, str]] | None:
    """(MAC, IP) a sum may come from: the last contributor's, so any topology host but the
    optimizers (a worker may be added to the job later); None (unchecked) without a topology."""
    if not args.topology:
        return None
    topo = Topology.load(args.topology)
    optimizers = {o for j in topo.jobs for o in j.optimizers}
    return [(h.mac, h.ip) for h in topo.hosts.values() if h.name not in optimizers]


def config_from_args(args) -> OptimizerConfig:
    """The optimizer the command line asks for (a state created from now on takes it)."""
    if args.optimizer_spec:
        try:
            return OptimizerConfig.from_dict(json.loads(pathlib.Path(args.optimizer_spec).read_text()))
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            raise ConfigError(f"--optimizer-spec {args.optimizer_spec}: {exc}") from None
    return OptimizerConfig(kind=args.optimizer, lr=args.lr, weight_decay=args.weight_decay, momentum=args.momentum,
                           eps=args.eps)


def open_state(args, chunks: tuple[int, int] | None = None) -> state.Store:
    """The state directory (created if absent); `chunks`: a shard's range, checked against the
    directory's."""
    cfg = config_from_args(args)
    if not state.exists(args.state_dir):
        seed = agent_args.init_seed(args.init, args.layout)
        init = optim.load_npz(args.init) if seed is None else None
        layout = agent_args.read_layout(args.layout) if args.layout else optim.layout_of(init)
        state.create(args.state_dir, layout, state.init_pieces(layout, init, seed or 0), cfg, args.page_chunks,
                     chunks)
    store = state.Store(args.state_dir, args.ram_budget)
    if (store.chunks if store.sharded else None) != chunks:
        held = "all chunks" if not store.sharded else "chunks {}:{}".format(*store.chunks)
        want = "all chunks" if chunks is None else "chunks {}:{}".format(*chunks)
        store.close()
        raise ConfigError(f"{args.state_dir} holds {held}, not {want}")
    if store.cfg != cfg and not args.optimizer_spec:  # a script's spec: the state it already holds wins
        store.close()
        raise ConfigError(f"{args.state_dir} was created with {store.cfg}, not {cfg}")
    wanted = agent_args.requested_layout(args.layout, args.init)
    if wanted is not None and optim.layout_to_json(wanted) != optim.layout_to_json(store.layout):
        store.close()
        raise ConfigError(f"{args.state_dir} holds another model than --init/--layout describe")
    return store


def proc_status_kb(field: str) -> int:
    """A memory figure of this process from /proc/self/status, in KiB."""
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def print_plan(args) -> int:
    """--plan: the state's residency within --ram-budget and the predicted step time (docs/STATE.md)."""
    try:
        if state.exists(args.state_dir):
            meta = json.loads((pathlib.Path(args.state_dir) / "meta.json").read_text())
            layout, page_chunks = optim.layout_from_json(meta["layout"]), int(meta["page_chunks"])
            lo, hi = meta.get("chunks", (0, layout.n_chunks - 1))
            cfg, lanes = OptimizerConfig.from_dict(meta["optimizer"]), state.record_lanes(meta)
        else:
            layout = agent_args.requested_layout(args.layout, args.init)
            if layout is None:
                raise ConfigError("--plan for a state not yet created needs --layout or --init FILE.npz")
            page_chunks, lo, hi = args.page_chunks, 0, layout.n_chunks - 1
            cfg = config_from_args(args)
            lanes = cfg.lanes
        slots = args.slots or (Topology.load(args.topology).job(args.job).slots if args.topology else 64)
        print(probe.report(args.state_dir, args.ram_budget, hi - lo + 1, page_chunks, slots, cfg, lanes), flush=True)
    except (ConfigError, TopologyError, OSError, ValueError, KeyError, TypeError) as exc:
        print(f"mindp-optimizer: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.plan:
        return print_plan(args)
    try:
        kernel = fused.selected()  # a MINDP_KERNEL this CPU cannot run is refused before any state is touched
        chunks, peers = shard_from_args(args)
        n_workers, slots, addr = _job_from_args(args)
        for name in ("linger", "idle_timeout", "stall_resend"):
            if getattr(args, name) is not None and getattr(args, name) < 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 0 seconds")
        if not 1 <= args.max_workers <= MAX_WORKERS:
            raise ConfigError(f"--max-workers must be in 1..{MAX_WORKERS}")
        store = open_state(args, chunks)
        if chunks and args.topology and Topology.load(args.topology).job(args.job).chunks != store.layout.n_chunks:
            store.close()
            raise ConfigError(f"job {args.job}'s topology says {Topology.load(args.topology).job(args.job).chunks} "
                              f"chunks, the model has {store.layout.n_chunks}: the shards' ranges would not match")
        sock = rawsock.open_raw(args.iface)
        guard = rawsock.udp_guard()
        agreement = shards.NonfiniteAgreement(args.job, peers, None) if peers else None
    except (ConfigError, TopologyError, rawsock.SocketError, PagerError, ValueError, OSError) as exc:
        print(f"mindp-optimizer: {exc}", file=sys.stderr)
        return 2
    skipped = []
    core = NodeCore(store, args.job, n_workers, slots, on_nonfinite=lambda s, c: skipped.append((s, c)),
                    max_workers=args.max_workers)
    faults = None
    if args.drop_send or args.drop_recv or args.dup_send or args.reorder_send:
        faults = agent_args.faults_from_args(args)
    if agreement:
        agreement.skip = core.skip_step
    node = OptimizerNode(core, sock, addr, faults, args.stall_resend, sum_sources(args), agreement)
    signal.signal(signal.SIGTERM, lambda *_: node.stop())
    rss_start = proc_status_kb("VmRSS")
    owned = f"chunks {store.chunks[0]}..{store.chunks[1]} of {store.layout.n_chunks}" if store.sharded else \
        f"{store.n_chunks} chunks"
    print(f"mindp-optimizer: job {args.job}, {n_workers} workers, {owned}, "
          f"resuming after step {store.committed} ({store.resumed_chunks} chunks of the next step applied), "
          f"kernel {kernel}",
          flush=True)
    try:
        node.serve(args.steps, args.linger, args.idle_timeout)
    except KeyboardInterrupt:
        pass
    except StorageError as exc:  # disk full / EIO: nothing after the last commit is trusted; restart resumes
        print(f"mindp-optimizer: {exc}", file=sys.stderr, flush=True)
        return 3
    stats = dict(core.stats, committed=store.committed, nonfinite=skipped, peak_pages=store.pages.peak_pages,
                 page_bytes=store.pages.page_bytes, rss_start_kb=rss_start, vm_hwm_kb=proc_status_kb("VmHWM"))
    if args.export:
        store.export(args.export)
    store.close()
    if guard:
        guard.close()
    if agreement:
        stats.update(agreement.stats)
        agreement.close()
    if args.stats:
        pathlib.Path(args.stats).write_text(json.dumps(stats, indent=1) + "\n")
    print(f"mindp-optimizer: stopped after step {stats['committed']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
