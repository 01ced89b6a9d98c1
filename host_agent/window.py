"""One step of one worker as a pure state machine: the slot window, retransmission timeouts after
RFC 6298 with back-off and fast retransmit, and the deadline. host_agent.worker runs it on a socket."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mindp import listed, progress

from . import fused
from .optim import ConfigError

#: due()'s scan for first sends and on_params' array work each in one compiled call (with numba),
#: else in numpy calls, some 15 and 25 a pump: the pump thread's largest Python cost beside the
#: worker's training thread.
COMPILED = not fused.NUMPY_ONLY


@dataclass(frozen=True)
class RtoConfig:
    """Retransmission timing (seconds). RTO follows RFC 6298 from round trips of chunks sent once."""

    # RFC 6298 2.1. Also the least a chunk waits (doubled per resend) while nothing at all was
    # answered since it was sent (Window._hold), until resends prove frames lost (RttEstimator.hold):
    # a window late as a whole waits for a peer or the node (a step's start, a commit), which the
    # round trips between such stalls do not measure; a loss takes single chunks, which later
    # chunks' answers show (fast retransmit) or which time out after the RTO once something was
    # answered. Before the first round trip such a window waits the longest any timer does
    # (RttEstimator.cap): see Window._hold.
    initial: float = 1.0
    min: float = 0.02
    # Cap of the timeouts' back-off, not of the measured RTO: when round trips are longer (more
    # workers than cores, each slot waiting for the slowest), retransmitting before an answer can
    # come only feeds a storm, so the cap rises to the measured RTO (itself at most deadline / 4,
    # a few tries before the step fails).
    max: float = 2.0
    # Fail the step after this long without any new parameter chunk: mindp.progress's stall limit, as
    # for every wait in the project (a software switch tracing every packet on a busy laptop can
    # go 15 s without answering, and nothing is stuck).
    deadline: float = progress.STALL
    # Fast retransmit: a chunk sent once is resent when the parameters of a chunk this many places
    # later (and sent no earlier) arrived (0: off). Chunks are sent, aggregated and answered in
    # order, so a later chunk's answer means this one's gradient, sum or parameters were lost.
    fast_after: int = 3
    # A chunk found overdue so is resent only if still unanswered this many smoothed round trips
    # later (RFC 8985's reordering window). A chunk is answered when its last worker sent it, and
    # peers send in orders of their own: a chunk spanning two tensors leaves once both are put,
    # which a peer may do in another order or pump (BMv2, cnn: chunks 80 and 116 answered up to
    # 0.34 round trips after 83 and 119; 10-18 spurious resends a run at LOSS=0 with no wait, 0-4
    # with a quarter). At most the RTO's floor: under loss the round trips include peers'
    # recoveries, and a longer wait slowed recovery further (BMv2 cnn at LOSS=0.02).
    reorder: float = 1.0
    # At most this many chunks resent per timeout, the oldest; the others wait one RTO more. A
    # window that times out whole is rarely lost whole: its answers are late (a slow peer, a busy
    # switch), and resending it all makes them later (each resend of a completed chunk is
    # multicast to every worker again). Losses inside the window go by fast retransmit.
    burst: int = 16
    # The RTO is at least this many times the longest round trip of this step and the previous one
    # (0: off). A chunk's answer waits for every worker's gradient and for the node: a peer that
    # starts a step late (slower, descheduled), a node committing the previous step or reading a
    # page stall every outstanding chunk, step after step, for far longer than the thousands of
    # round trips in between, which bring RFC 6298's estimate down to a few ms, so every such
    # stall timed out a burst of chunks that were only late (BMv2: ~16 a step at LOSS=0). Scaled
    # by the learnt hold (RttEstimator.hold / initial): resends proved needed shrink it as they
    # shrink the hold, a spurious one restores it.
    peak: float = 2.0

    def __post_init__(self):
        times = (self.initial, self.min, self.max, self.deadline)
        if not all(isinstance(t, (int, float)) and math.isfinite(t) and t > 0 for t in times):
            raise ConfigError(f"retransmission times and the deadline must be finite and > 0, got {times}")
        if (self.min > self.max or self.fast_after < 0 or self.burst < 1 or not 0 <= self.peak < math.inf
                or not 0 <= self.reorder < math.inf):
            raise ConfigError(f"need rto min <= max (got {self.min} > {self.max}), fast_after >= 0, burst >= 1, "
                              f"a finite peak >= 0 and reorder >= 0 (got {self.fast_after}, {self.burst}, "
                              f"{self.peak}, {self.reorder})")


class RttEstimator:
    """RFC 6298's smoothed round trip and variance, the longest round trip of the current and the
    previous step (`peaks`): the RTO covers both (RtoConfig.peak); and the hold of a window late as
    a whole (`hold`), learnt from the answers to resends."""

    def __init__(self, cfg: RtoConfig):
        self.cfg = cfg
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.rto = cfg.initial
        self.measured = 0.0  # srtt + 4 rttvar or peak x the longest recent round trip, floored at min
        self.peaks = [0.0, 0.0]  # the longest round trip of the previous step, of this step
        self.step: int | None = None
        self._backed_off_at = float("-inf")
        self.hold = cfg.initial  # the least a window late as a whole waits (Window._hold)

    @property
    def cap(self) -> float:
        """The most any timeout backs off to: the configured cap, or the measured RTO if longer.
        Before the first round trip is measured, at least a quarter of the deadline: a window of chunks
        that all time out before their first answer yields no sample (Karn), so a low cap would
        resend it forever without learning the round trip."""
        if self.srtt is None:
            return max(self.cfg.max, self.cfg.deadline / 4)
        return max(self.cfg.max, self.measured)

    def on_timeout(self, now: float) -> None:
        """Back the RTO itself off (RFC 6298 5.5), at most once per RTO: a burst of timeouts of
        one window is one congestion signal, and a retransmission storm would feed itself."""
        if now - self._backed_off_at >= self.rto:
            self.rto = min(self.cap, self.rto * 2)
            self._backed_off_at = now

    def start_step(self, step: int) -> None:
        """A new step: the step before the previous one leaves the peak (a one-off stall raises the
        RTO for two steps, not for ever)."""
        if step == self.step:
            return
        self.step = step
        self.peaks = [self.peaks[1], 0.0]
        if self.srtt is not None:
            self._update()

    def sample(self, rtt: float, longest: float | None = None) -> None:
        """A round trip (RFC 6298 2.2-2.3); `longest`: the longest of the batch it came with, if longer."""
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        self.peaks[1] = max(self.peaks[1], rtt, longest or 0.0)
        self._update()

    def _update(self) -> None:
        peak = self.cfg.peak * self.hold / self.cfg.initial * max(self.peaks)
        self.measured = min(self.cfg.deadline / 4,
                            max(self.cfg.min, self.srtt + max(0.001, 4 * self.rttvar), peak))
        self.rto = min(self.cap, self.measured)

    def resends_answered(self, needed: int, spurious: int) -> None:
        """Answers to chunks this worker resent. A flagged one says a frame was lost (a resend
        completed the chunk): each halves the hold, since on a lossy network a window late as a
        whole is mostly a lost last frame, which the hold only delays (a small model's step is a
        few frames: every loss cost >= `initial`). An unflagged one proves the resend spurious (the
        first sends completed the chunk: the window was only late) and restores the hold to
        `initial`, as TCP's Eifel response restores its state (RFC 4015). So without evidence of
        loss (LOSS=0) the hold stays whole.

        The RTO's peak (RtoConfig.peak) follows the same evidence: a one-off stall (a peer stopped
        or restarted mid-step) kept every later loss of a long step waiting twice the stall (make
        stress: 4 workers, 4 slots, 10 % loss, a worker stopped and one killed in a 240-chunk
        step: resends at 2.4-5.2 s, the step past the 15-min cap) while each of those resends
        proved a frame lost."""
        if spurious:
            self.hold = self.cfg.initial
        elif needed:
            self.hold = max(self.cfg.min, self.hold / 2 ** needed)
        else:
            return
        if self.srtt is not None:
            self._update()

    def state(self) -> tuple[float, float, float]:
        """(srtt or NaN before the first round trip, rttvar, hold): what a restarted worker takes
        back (host_agent.resume) instead of learning the path again."""
        return (math.nan if self.srtt is None else self.srtt, self.rttvar, self.hold)

    def restore(self, state) -> None:
        """Take back what state() gave, before any round trip of this process. The hold matters
        most: a worker killed on a lossy path and started again waited `initial` for each late
        window until resends proved frames lost again (make stress: silences of 0.5-2 s)."""
        srtt, rttvar, hold = (float(v) for v in state)
        if not (math.isfinite(hold) and self.cfg.min <= hold <= self.cfg.initial):
            return  # an empty or foreign record: learn afresh
        self.hold = hold
        if math.isfinite(srtt) and srtt > 0 and math.isfinite(rttvar) and rttvar >= 0:
            self.srtt, self.rttvar = srtt, rttvar
            self._update()

    @property
    def lossy(self) -> bool:
        """Resends proved frames lost since the last one proved spurious (a shortened hold): only
        then do the rules for losses apply (Window.peer_behind, the held timers' return to the
        RTO); without that evidence (LOSS=0) every wait stays as long as a stall may take."""
        return self.hold < self.cfg.initial

    def backoff(self, attempts: int) -> float:
        """Timeout of a chunk sent `attempts` times: doubled per retransmission, capped."""
        return min(self.cap, self.rto * 2 ** (attempts - 1))


class StepTimeout(RuntimeError):
    """A step gave up: no new parameters for the deadline. Names the missing chunks."""

    def __init__(self, job: int, worker: int, step: int, missing: list[int], waited: float):
        self.step = step
        self.missing = missing
        super().__init__(f"job {job} worker {worker} step {step}: no parameters for {len(missing)} chunk(s) "
                         f"after {waited:.1f} s without progress: {listed(missing, 16)}")


class Window:
    """One step of one worker: which chunk to send when, which ones are done.

    A chunk may be sent once it is ready (produced) and, for c >= slots, once
    the parameters of chunk c - slots arrived (they share a slot: docs/DESIGN.md
    invariant 3). Chunks of different slots go in any order, so a model whose
    tensors are produced last-first still sends each chunk as soon as it is
    ready. An outstanding chunk is sent again, flagged RETRANSMIT, when its
    timeout expires, or once, early, when the parameters of a chunk
    `fast_after` places later (and sent after it) arrived before its own and
    its own did not follow within the reordering window.
    """

    def __init__(self, step: int, n_chunks: int, slots: int, rtt: RttEstimator, now: float,
                 shard_his: np.ndarray | None = None):
        self.step = step
        self.n = n_chunks
        self.slots = slots
        self.rtt = rtt
        rtt.start_step(step)
        self.ready = np.zeros(n_chunks, dtype=bool)
        self.done = np.zeros(n_chunks, dtype=bool)
        self.attempts = np.zeros(n_chunks, dtype=np.int32)
        self.first_sent = np.zeros(n_chunks, dtype=np.float64)
        self.sent_at = np.zeros(n_chunks, dtype=np.float64)  # of the last send
        self.expiry = np.full(n_chunks, np.inf)  # per chunk sent and unanswered, when it expires; else inf
        self._earliest = float("inf")  # no outstanding chunk expires before this (a lower bound)
        # Per slot, the next chunk to send in it: slot uses go strictly in chunk order.
        self.next_in_slot = np.arange(min(slots, n_chunks), dtype=np.int64)
        self._new = np.empty(len(self.next_in_slot), dtype=np.int64)  # _first_sends' chunks
        self._overdue = np.empty(n_chunks, dtype=np.int64)  # _answered's
        self.n_sent = 0
        self._changed = True  # something became ready or done since the last scan for new chunks
        self.n_done = 0
        self.last_progress = now
        self.heard = False  # a chunk of this step was answered: every peer is in it
        self.heard_at = float("inf")  # when first
        self.behind = False  # before that, a peer was seen still in the previous step (peer_behind)
        self.timeouts = 0
        self.fast_retransmits = 0
        self.fast_due: list[tuple[float, int]] = []  # (when, chunk) found overdue by a later chunk's parameters
        # Shards (optimizer nodes owning contiguous chunk ranges, last chunk of each inclusive)
        # answer independently, so only a later chunk of the same shard says one was lost.
        self._his = np.asarray([n_chunks - 1] if shard_his is None else shard_his, dtype=np.int64)
        self._fast_checked = np.concatenate(([0], self._his[:-1] + 1))  # per shard: checked below
        self._flush = False  # the next timeouts resend every expired chunk (the link came back)
        self._held = False  # on a lossy network, a timer was pushed past the RTO by the hold (_hold)

    def set_ready(self, chunks) -> None:
        self.ready[chunks] = True
        self._changed = True

    def resume(self, answered: np.ndarray) -> None:
        """Chunks answered before a restart (host_agent.resume) count as sent and done. In a slot they
        are a prefix of its uses (c + S leaves only after c's parameters), so each slot goes on at
        its first unanswered chunk, the one whose cell the switch still holds."""
        answered = np.asarray(answered, dtype=bool)
        self.done |= answered
        self.attempts[answered] = 1
        self.n_done = int(np.count_nonzero(self.done))
        for j in range(len(self.next_in_slot)):
            c = j
            while c < self.n and self.done[c]:
                c += self.slots
            self.n_sent += (c - j) // self.slots
            self.next_in_slot[j] = c
        self._changed = True

    @property
    def complete(self) -> bool:
        return self.n_done == self.n

    def sent(self, chunk: int) -> bool:
        return bool(self.attempts[chunk])

    def due(self, now: float) -> tuple[list[int], list[int]]:
        """(chunks to send for the first time, chunks to send again), marked as sent now."""
        new: list[int] = []
        if self._changed and self.n_sent < self.n:
            self._changed = False
            exp = now + self.rtt.backoff(1)
            new = self._scan_first_sends(now, exp)
            if new:
                self.n_sent += len(new)
                self._earliest = min(self._earliest, exp)
        expired = []
        if now >= self._earliest:  # expiries only grow or leave, so the bound stays valid
            late = np.flatnonzero(self.expiry <= now)
            if len(late) and not self._flush:
                late = self._hold(late, now)
            if len(late) > self.rtt.cfg.burst and not self._flush:
                self.expiry[late[self.rtt.cfg.burst:]] = now + self.rtt.rto
                late = late[: self.rtt.cfg.burst]
            self._flush = False
            expired = late.tolist()
            self._earliest = float(self.expiry.min()) if self.n else float("inf")
        if expired:
            self.rtt.on_timeout(now)
        gone = set(expired)
        fast, wait = [], []
        for at, c in self.fast_due:  # still unanswered, not resent meanwhile by its timer
            if self.expiry[c] != np.inf and self.attempts[c] == 1 and c not in gone:
                (fast if at <= now else wait).append((at, c))
        self.fast_due = wait
        fast = [c for _, c in fast]
        again = expired + fast
        for c in again:
            self.attempts[c] += 1
            self.sent_at[c] = now
            self.expiry[c] = exp = now + self.rtt.backoff(int(self.attempts[c]))
            self._earliest = min(self._earliest, exp)
        self.timeouts += len(expired)
        self.fast_retransmits += len(fast)
        return new, again

    def _scan_first_sends(self, now: float, exp: float) -> list[int]:
        """Each slot's next chunk that is ready and whose slot's previous chunk is done, in chunk
        order, marked sent at `now` (expiring at `exp`), its slot moved on."""
        if COMPILED:
            return self._new[: _first_sends(self.next_in_slot, self.ready, self.done, self.attempts, self.first_sent,
                                            self.sent_at, self.expiry, self.slots, now, exp, self._new)].tolist()
        c = self.next_in_slot
        cc = np.minimum(c, self.n - 1)
        ok = (c < self.n) & self.ready[cc] & ((cc < self.slots) | self.done[np.maximum(cc - self.slots, 0)])
        if not ok.any():
            return []
        sel = np.sort(c[ok])
        self.attempts[sel] = 1
        self.first_sent[sel] = self.sent_at[sel] = now
        self.expiry[sel] = exp
        self.next_in_slot[ok] += self.slots
        return sel.tolist()

    def after_own_resend(self, new: list[int]) -> list[int]:
        """Of chunks sent for the first time, those whose slot's previous chunk this worker had to
        resend before its parameters came: they leave late, after this worker's own recovery,
        which a peer that sent them at once must not time as a round trip. Flagged RETRANSMIT, their
        sum is flagged (the switch keeps the flag) and no worker samples its answer; unflagged,
        every loss recovered by one worker (its RTO) lengthened the others' round trips, so their
        RTOs (RtoConfig.peak) and the next recoveries, until the cap: 4 workers at LOSS=0.05 went
        seconds a chunk."""
        if not (self.timeouts or self.fast_retransmits) or not new:  # (the usual pump: nothing resent)
            return []
        prev = np.asarray(new, dtype=np.int64) - self.slots
        late = prev >= 0
        late[late] = self.attempts[prev[late]] > 1
        return (prev[late] + self.slots).tolist()

    def _hold(self, late: np.ndarray, now: float) -> np.ndarray:
        """Of the chunks whose timers expired, those to resend now; the others' timers move on.
        A timer was set at its send from the RTO then; the RTO has grown since where this step's
        round trips grew (RtoConfig.peak): it counts from the send at today's RTO. While nothing was
        answered since a chunk was sent (the whole window late) it waits at least the learnt hold
        (RttEstimator.hold: `initial` until resends prove frames lost, and while a peer is behind:
        peer_behind), doubled per resend; in a first step (no round trip measured yet), until the
        first answer, it waits the cap (a quarter of the deadline) per try. The workers' first
        steps start seconds apart (each builds and evaluates the model on shared cores), a wait no
        timer can tell from a loss, with nothing to resend for: a loss takes single frames, which
        the first answers show (fast retransmit, and the timers from then on). Only a window lost
        whole (every frame of a small one, a switch restarted) waits that long, a few tries a
        deadline."""
        rtt, att = self.rtt, self.attempts[late]
        at = self.sent_at[late]
        due = at + np.minimum(rtt.cap, rtt.rto * 2.0 ** (att - 1))
        whole = self.last_progress <= at
        if whole.any():
            learnt = rtt.cfg.initial if self.behind and not self.heard else rtt.hold
            hold = (rtt.cap if rtt.srtt is None and not self.heard else
                    np.minimum(rtt.cfg.deadline / 4, learnt * 2.0 ** (att[whole] - 1)))
            due[whole] = np.maximum(due[whole], at[whole] + hold)
            if (rtt.lossy or self.behind) and not (rtt.srtt is None and not self.heard):
                self._held = True
        wait = due > now
        self.expiry[late[wait]] = due[wait]
        return late[~wait]

    def link_back(self, now: float, just_sent: list[int]) -> None:
        """The link came back: every frame sent while it was down was lost, so each chunk still
        outstanding (but `just_sent`, which proved the link) is due again now, not at its timeout
        backed off through the outage (up to the RTO's max, which may exceed the step's
        deadline); the deadline restarts."""
        out = self.expiry != np.inf
        out[just_sent] = False
        self.expiry[out] = now
        if out.any():
            self._earliest = now
            self._flush = True  # all of them at once: known lost, not late
        self.last_progress = now

    def peer_behind(self) -> None:
        """Parameters of an earlier step came: resent ones (flagged RETRANSMIT; a worker leaves a
        step only with all its parameters), so a peer's resend of it was answered and a peer is
        still recovering that step (a lost frame): this step's first chunks wait for it. Their
        round trips measure that recovery, not this worker's path: no samples (through
        RtoConfig.peak they made each loss's wait longer for every peer, and each longer recovery
        longer round trips again: RTOs of 0.7-2 s at LOSS=0.02), and a window late as a whole
        meanwhile waits the full `initial`, being late for a known reason. Once something of the
        step is answered every peer is in it, and this no longer applies. Only on a lossy network
        (RttEstimator.lossy): the node's stall resends are flagged frames of the previous step too
        (a 25M gpt's steps leave it a second without sums), and at LOSS=0 the round trips of a
        step's start are what the peak must learn."""
        if not self.heard and self.rtt.lossy:
            self.behind = True

    def on_param(self, chunk: int, now: float, sample: bool = True) -> bool:
        """Parameters for `chunk` arrived; False if already had them. `sample`: False when a
        retransmission (any worker's) completed the chunk or was answered (the RETRANSMIT flag), so
        its round trip includes a timeout."""
        return bool(self.on_params(np.array([chunk]), now, np.array([sample]))[0])

    def on_params(self, chunks: np.ndarray, now: float, sample: np.ndarray) -> np.ndarray:
        """A batch of arrived parameter chunks: which entries are fresh (not had before, first in
        the batch). One round-trip sample per batch, from the freshest eligible chunk, with the
        batch's longest for the peak.

        Karn's rule by the flag: an answer whose RETRANSMIT flag is clear was completed by first
        sends only and is not the answer to a resend (those are flagged), so it times a round trip
        from the chunk's first send even when this worker resent it meanwhile: it proves that
        resend spurious and says how long the answer really took, as TCP's timestamps do (Eifel,
        RFC 3522). Excluding every resent chunk instead left the estimate blind to exactly the
        stalls that caused the resends: they recurred every step. Answers to this worker's resends
        teach the hold of a window late as a whole (RttEstimator.resends_answered)."""
        if COMPILED and len(self._his) == 1:
            # (contiguous, as warm() compiled it: param_rx passes a column of its output rows)
            return self._on_params_compiled(np.ascontiguousarray(chunks, dtype=np.int64), now,
                                            np.ascontiguousarray(sample, dtype=bool))
        chunks = np.asarray(chunks, dtype=np.int64)
        if len(chunks) < 2 or (chunks[1:] > chunks[:-1]).all():  # each once (the usual batch): no sort
            fresh = ~self.done[chunks]
        else:
            fresh = np.zeros(len(chunks), dtype=bool)
            uniq, first = np.unique(chunks, return_index=True)
            fresh[first[~self.done[uniq]]] = True
        fc = chunks[fresh]
        if not len(fc):
            return fresh
        if not self.heard:
            self.heard, self.heard_at = True, now
        flagged = ~np.asarray(sample, dtype=bool)[fresh]
        # This worker's round trips: unflagged, and not spent waiting for a peer behind (peer_behind).
        timed = ~flagged & ~(self.behind & (self.first_sent[fc] < self.heard_at))
        resent = self.attempts[fc] > 1
        if resent.any():
            self.rtt.resends_answered(int(np.count_nonzero(resent & flagged)), int(np.count_nonzero(resent & timed)))
        self.done[fc] = True
        self.n_done += len(fc)
        self.last_progress = now
        self._changed = True
        eligible = fc[timed]
        self.expiry[fc] = np.inf
        if len(eligible):
            sent = self.first_sent[eligible]
            self.rtt.sample(now - float(sent.max()), now - float(sent.min()))
        if self._held:
            self._release_held()
        gap = self.rtt.cfg.fast_after
        if gap:
            at = now + min(self.rtt.cfg.reorder * (self.rtt.srtt or 0.0), self.rtt.cfg.min)
            if len(self._his) == 1:  # one node owns every chunk (np.unique's sort cost more than the rest)
                tops = [(0, int(fc.max()))]
            else:
                owner = np.searchsorted(self._his, fc, side="left")
                tops = [(s, int(fc[owner == s].max())) for s in np.unique(owner).tolist() if s < len(self._his)]
            for shard, top in tops:
                lo, hi = int(self._fast_checked[shard]), top - gap + 1
                if hi > lo:
                    # The shard's chunks below `top` sent no later than it are overdue; each is checked once.
                    overdue = lo + np.flatnonzero(~self.done[lo:hi] & (self.attempts[lo:hi] == 1)
                                                  & (self.first_sent[lo:hi] <= self.first_sent[top]))
                    self.fast_due += [(at, c) for c in overdue.tolist()]
                    self._fast_checked[shard] = hi
        return fresh

    def _on_params_compiled(self, chunks: np.ndarray, now: float, sample: np.ndarray) -> np.ndarray:
        """on_params of a window whose chunks one node owns, its array work in one compiled call
        (_answered); the round-trip estimator's and the hold's updates as on_params makes them."""
        fresh = np.empty(len(chunks), dtype=bool)
        gap = self.rtt.cfg.fast_after
        got = _answered(chunks, sample, self.done, self.attempts, self.first_sent, self.expiry, self.behind,
                        self.heard_at if self.heard else now, gap, int(self._fast_checked[0]), fresh, self._overdue)
        n_fresh, resent, resent_flagged, resent_timed, timed, oldest, newest, checked, n_overdue = got
        if not n_fresh:
            return fresh
        if not self.heard:
            self.heard, self.heard_at = True, now
        if resent:
            self.rtt.resends_answered(resent_flagged, resent_timed)
        self.n_done += n_fresh
        self.last_progress = now
        self._changed = True
        if timed:
            self.rtt.sample(now - newest, now - oldest)
        if self._held:
            self._release_held()
        if gap:
            at = now + min(self.rtt.cfg.reorder * (self.rtt.srtt or 0.0), self.rtt.cfg.min)
            self.fast_due += [(at, c) for c in self._overdue[:n_overdue].tolist()]
            self._fast_checked[0] = checked
        return fresh

    def _release_held(self) -> None:
        """The silence the hold waited out ended: on a lossy network the held timers go by the RTO
        again (a frame lost meanwhile, a tail one no later answer shows, waited the hold)."""
        self._held = False
        out = np.flatnonzero(self.expiry != np.inf)
        if len(out):
            self.expiry[out] = np.minimum(self.expiry[out], self.sent_at[out] + np.minimum(
                self.rtt.cap, self.rtt.rto * 2.0 ** (self.attempts[out] - 1)))
            self._earliest = min(self._earliest, float(self.expiry[out].min()))

    def wake_at(self) -> float:
        """When something is next due: a fast retransmit, the earliest expiry, or the deadline."""
        fast = min((at for at, _ in self.fast_due), default=float("inf"))
        return min(self.last_progress + self.rtt.cfg.deadline, self._earliest, fast)

    def stalled(self, now: float) -> bool:
        return now - self.last_progress > self.rtt.cfg.deadline

    def missing(self) -> list[int]:
        return [int(c) for c in np.flatnonzero(~self.done)]


def warm() -> None:
    """Compile (or load from numba's cache) the window's kernels now, as gradframes.warm does
    put()'s: not in a worker's first pumps, where a compile on a loaded machine outlasts its
    peers' step deadline."""
    if COMPILED:
        w = Window(0, 2, 1, RttEstimator(RtoConfig()), 0.0)
        w.set_ready([0, 1])
        w.on_params(np.array(w.due(0.0)[0], dtype=np.int64), 0.0, np.ones(1, dtype=bool))


if COMPILED:
    from numba import njit

    @njit(nogil=True, cache=True)
    def _first_sends(next_in_slot, ready, done, attempts, first_sent, sent_at, expiry, slots, now, exp, out):
        """due()'s first sends: each slot's next chunk that is ready and whose slot's previous
        chunk is done, into out[:k] in chunk order, marked sent at `now` (expiring at `exp`), its
        slot moved on; returns k."""
        n = len(ready)
        k = 0
        for j in range(len(next_in_slot)):
            c = next_in_slot[j]
            if c < n and ready[c] and (c < slots or done[c - slots]):
                out[k] = c
                k += 1
                next_in_slot[j] = c + slots
        out[:k].sort()
        for i in range(k):
            c = out[i]
            attempts[c] = 1
            first_sent[c] = now
            sent_at[c] = now
            expiry[c] = exp
        return k

    @njit(nogil=True, cache=True)
    def _answered(chunks, sample, done, attempts, first_sent, expiry, behind, heard_at, gap, checked, fresh, overdue):
        """on_params' array work for a window one node owns: `fresh` (each entry not had before and
        first in the batch), the fresh chunks marked done and unexpiring, the counts and first-send
        times the estimator takes, and the chunks a fast retransmit finds overdue (each looked at
        once: from `checked` up to `gap` below the freshest) into `overdue`. Returns (fresh,
        resent, resent and flagged, resent and timed, timed, the oldest and newest first send of
        the timed, where the fast retransmit's check now starts, overdue)."""
        n_fresh = resent = resent_flagged = resent_timed = timed = 0
        oldest, newest = np.inf, -np.inf
        top = -1
        for i in range(len(chunks)):
            c = chunks[i]
            fresh[i] = not done[c]
            if not fresh[i]:
                continue
            done[c] = True  # (a later entry of the same chunk is then not fresh)
            n_fresh += 1
            top = max(top, c)
            flagged = not sample[i]
            is_timed = not flagged and not (behind and first_sent[c] < heard_at)
            if attempts[c] > 1:
                resent += 1
                resent_flagged += flagged
                resent_timed += is_timed
            if is_timed:
                timed += 1
                oldest = min(oldest, first_sent[c])
                newest = max(newest, first_sent[c])
            expiry[c] = np.inf
        n_overdue = 0
        if gap and n_fresh and top - gap + 1 > checked:
            hi = top - gap + 1
            for c in range(checked, hi):
                if not done[c] and attempts[c] == 1 and first_sent[c] <= first_sent[top]:
                    overdue[n_overdue] = c
                    n_overdue += 1
            checked = hi
        return n_fresh, resent, resent_flagged, resent_timed, timed, oldest, newest, checked, n_overdue
