"""The optimizer node's core: applies each (step, chunk) sum exactly once, out of core.

`NodeCore` is the pure state machine (sums in, parameter chunks out, no socket); node_socket's
`OptimizerNode` runs it on a raw socket; node's `main` is the `mindp-optimizer` CLI.
"""
from __future__ import annotations

import collections
import math
import sys
import time
from typing import Callable

import numpy as np

from mindp import codec
from mindp.protocol import MAX_WORKERS, K, Flag, Kind

from . import digest, fused, kernelpick, state
from .groups import GroupPlan


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
        self.groups = GroupPlan(self.cfg, store.layout)  # each tensor's lr and weight decay (a script's groups)
        self.told_lr = self.cfg.schedule.kind == "script"  # each step's lr comes with the workers' digest queries
        self.job_id = job_id
        self.n_workers = n_workers
        self.max_workers = max_workers
        self.slots = slots
        self.on_nonfinite = on_nonfinite
        # Called at each commit with (step, elements updated, seconds spent updating them, seconds the
        # commit took to make the step durable): the node's update rate and its disk's stalls per step
        # (make run's metrics.csv).
        self.on_commit: Callable[[int, int, float, float], None] | None = None
        self._step_chunks, self._step_seconds = 0, 0.0
        # True: handle() leaves a completed step's commit (its write-back and fsync) to
        # commit_if_complete(), which the socket calls once the step's last answers are sent, so the
        # workers' wait for them does not include the disk.
        self.defer_commit = False
        # (read once: each batch's look-up of MINDP_KERNEL cost more than the rest)
        self.kernel = kernelpick.update_kernel(self.cfg)
        fused.warm(self.cfg, self.kernel)  # compile the kernel now, not on the first sum
        # A shard owns chunks lo..hi of the job's chunk space: headers carry job-wide chunk
        # numbers (slots and versions follow the whole model), the store holds records 0..hi-lo.
        self.lo, self.hi = store.chunks
        self.n = store.n_chunks
        self.n_total = store.layout.n_chunks
        self.last_count = store.layout.chunk_count(self.hi)  # every other chunk holds K elements
        self.stats = collections.Counter()
        # The step digest (host_agent.digest): each applied chunk's hash is added as it is applied.
        self.digests = digest.Book(self.lo, self.hi, self._digest_from_state, self.stats)
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
            store.commit()  # its digest is read back from the state if a worker asks

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

    def learn_lr(self, step: int, lrs: tuple[float, ...]) -> None:
        """A worker told the lrs of `step`, a parameter group each (the "script" schedule: its
        script sets them): the first told are applied; others from another worker are counted and
        said in one line; lrs that are not positive numbers, or not one a group, are counted."""
        told = self.groups.told
        if not self.told_lr or step < self.store.current:
            return
        lrs = tuple(lrs)
        if len(lrs) != self.groups.n_groups or not all(math.isfinite(r) and r > 0 for r in lrs):
            self.stats["lr_rejected"] += 1
            if self.stats["lr_rejected"] == 1:
                print(f"mindp-optimizer: a worker told step {step}'s lrs {list(lrs)!r}, the node trains "
                      f"{self.groups.n_groups} parameter group(s) at positive lrs: not applied",
                      file=sys.stderr, flush=True)
        elif step not in told:
            for old in [s for s in told if s < self.store.current]:
                del told[old]
            told[step] = lrs
        elif told[step] != lrs:
            self.stats["lr_disagreements"] += 1
            if self.stats["lr_disagreements"] == 1:
                print(f"mindp-optimizer: the workers' scripts disagree on the lrs of step {step} "
                      f"({list(told[step])!r}, {list(lrs)!r}): the node applies the first told",
                      file=sys.stderr, flush=True)

    def handle(self, headers: np.ndarray, sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A batch of SUM headers and (n, K) int64 sums -> PARAM headers and (m, K) fp16 to send."""
        headers = fused.wire_order(headers)  # answers are remembered (for resends) as the wire's bytes
        self.stats["sums"] += len(headers)
        if self.told_lr and self.store.current not in self.groups.told:
            # The step's lr is not known yet (its query lost or late): its sums wait for the
            # workers' retransmissions, as lost ones do.
            early = headers["step"] == self.store.current
            if early.any():
                self.stats["sums_before_lr"] += int(early.sum())
                headers, sums = headers[~early], sums[~early]
                if not len(headers):
                    return np.zeros(0, dtype=headers.dtype), np.zeros((0, K), dtype=np.float16)
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
        if len(resend):  # read before a commit, which drops the copy of step cur - 1
            self.stats["resent"] += len(resend)
            out_vals.append(np.stack([self._params_of(int(headers["step"][i]), int(headers["chunk"][i]))
                                      for i in resend]))
        if len(uniq) and not self.defer_commit:
            self._commit_if_complete()
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
        if not self.defer_commit:
            self._commit_if_complete()
        self._remember(cur, chunks, hdr)
        return hdr, out

    def complete_digest(self) -> bool:
        """A complete step's digest, kept before its commit (digest.Book.complete): True if its held
        queries can be answered now, while the commit writes back."""
        return self.store.step_complete and self.digests.complete(self.store.current, self.store.step_nonfinite)

    def commit_if_complete(self) -> None:
        """The commit handle() left (defer_commit), if the step is complete; then the next step's
        first pages are read ahead."""
        if self.store.step_complete:
            self._commit_if_complete()
            self.store.prefetch_from(0)

    def _commit_if_complete(self) -> None:
        if self.store.step_complete:
            start = time.perf_counter()
            self.store.commit()
            durable = time.perf_counter() - start
            self.digests.commit(self.store.committed, self.store.last_skipped)
            self.stats["steps"] += 1
            if self.on_commit:
                self.on_commit(self.store.committed, self._step_chunks * K, self._step_seconds, durable)
            self._step_chunks, self._step_seconds = 0, 0.0

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
                self.digests.commit(step, True)
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
        t0 = time.perf_counter()
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
                self.groups.update(self.lo + lo, old, new, sums[pos : pos + n], nworkers[pos : pos + n], store.updates,
                                   out[pos : pos + n], step, self.kernel)
            for a, b in [(lo, hi)] if store.pages.mapped else page_cuts(lo, hi, store.page_chunks):
                store.mark_applied(a, b)
            if not store.pages.mapped:  # a batch spans pages: keep the reads ahead of this one
                store.prefetch_from(hi)
            pos += n
        self.stats["applied"] += len(chunks)
        # (np.asarray of a range makes a Python int of each chunk)
        job_chunks = np.arange(chunks.start, chunks.stop) if isinstance(chunks, range) else np.asarray(chunks)
        self.digests.add(job_chunks + self.lo, out)
        self._step_chunks += len(chunks)
        self._step_seconds += time.perf_counter() - t0
        return out

    def committed_params(self, step: int, chunks: range) -> np.ndarray | None:
        """The fp16 parameters of job-wide `chunks` after committed `step` (a digest repair); None
        for any other step."""
        if step != self.store.committed or step < 0:
            return None
        return np.stack([self._params_of(step, c) for c in chunks])

    def _digest_from_state(self, step: int) -> np.ndarray:
        """The block digests of committed `step` read back from the state, page by page."""
        store, blocks = self.store, self.digests.blocks
        acc = np.zeros(blocks.count, dtype=np.uint64)
        copy = store.copy_after(step)
        for lo, hi in page_cuts(0, store.n_chunks, store.page_chunks):
            params = store.records(copy, lo, hi)[:, state.MASTER].astype(np.float16)
            chunks = np.arange(lo, hi) + self.lo
            blocks.add(acc, chunks, digest.chunk_hashes(chunks, params))
        return acc

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
