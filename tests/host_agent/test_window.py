"""The worker's per-step state machine: slot window, adaptive timeouts, back-off, deadline."""
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from host_agent import window as window_module
from host_agent.window import RtoConfig, RttEstimator, StepTimeout, Window
from host_agent.worker import slot_and_version
from mindp import schedule

PATHS = [True, False] if window_module.COMPILED else [False]


@pytest.fixture(autouse=True, params=PATHS, ids=lambda compiled: "compiled" if compiled else "numpy")
def due_path(request, monkeypatch):
    """Every test of the window on each of due()'s paths (compiled where numba is, and numpy)."""
    monkeypatch.setattr(window_module, "COMPILED", request.param)


def window(n=10, slots=4, **rto):
    return Window(0, n, slots, RttEstimator(RtoConfig(**rto)), now=0.0)


@pytest.mark.skipif(not window_module.COMPILED, reason="no numba: due() has one path")
@pytest.mark.parametrize("seed", range(6))
def test_both_paths_of_due_send_the_same_chunks_at_the_same_times(monkeypatch, seed):
    """Two windows fed the same readiness, answers (some lost, some twice, out of order, some flagged
    RETRANSMIT) and clock, one on each path of due() and on_params()."""
    rng = np.random.default_rng(seed)
    n, slots = int(rng.integers(1, 300)), int(rng.integers(1, 64))
    pair = {path: Window(0, n, slots, RttEstimator(RtoConfig(initial=0.05, min=0.01)), now=0.0) for path in PATHS}
    order = rng.permutation(n)
    now, made, outstanding = 0.0, 0, []
    while not pair[True].complete:
        now += float(rng.uniform(0.0, 0.02))
        if made < n:
            batch = order[made : made + int(rng.integers(1, 40))]
            made += len(batch)
        else:
            batch = order[:0]
        answered = [c for c in outstanding if rng.random() > 0.1]
        arrived = np.array(answered + [c for c in answered if rng.random() < 0.1], dtype=np.int64)
        if seed % 2:
            rng.shuffle(arrived)
        else:
            arrived.sort()
        sample = rng.random(len(arrived)) > 0.2
        out, fresh = {}, {}
        for path, w in pair.items():
            monkeypatch.setattr(window_module, "COMPILED", path)
            w.set_ready(batch)
            if len(arrived):
                fresh[path] = w.on_params(arrived, now, sample).tolist()
            out[path] = w.due(now)
        assert out[True] == out[False] and fresh.get(True) == fresh.get(False)
        assert pair[True].fast_due == pair[False].fast_due and pair[True].n_done == pair[False].n_done
        assert (pair[True].rtt.srtt, pair[True].rtt.rto) == (pair[False].rtt.srtt, pair[False].rtt.rto)
        outstanding = sorted(set(outstanding) - set(answered) | set(out[True][0]) | set(out[True][1]))
        assert now < 1000, "the step never completed"
    a, b = pair[True], pair[False]
    assert a.complete and b.complete and a.n_sent == b.n_sent
    for field in ("attempts", "first_sent", "sent_at", "expiry", "next_in_slot", "done", "_fast_checked"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field


def test_at_most_one_outstanding_chunk_per_slot():
    w = window()
    w.set_ready(range(10))
    new, again = w.due(0.0)
    assert new == [0, 1, 2, 3] and again == []
    assert w.due(0.01) == ([], [])
    w.on_param(1, 0.02)  # chunk 5 shares slot 1 with chunk 1: free now; chunk 4 still waits for 0
    assert w.due(0.02) == ([5], [])
    w.on_param(0, 0.03)
    assert w.due(0.03)[0] == [4]
    assert w.due(0.04) == ([], [])


def test_chunks_leave_in_any_order_as_produced_within_the_slot_rule():
    w = window(n=10, slots=4)
    w.set_ready([9, 8, 3])  # produced last-first: 9 and 8 wait for their slots' earlier uses
    assert w.due(0.0)[0] == [3]
    w.set_ready([7, 6, 5, 4, 2, 1, 0])
    assert w.due(0.0)[0] == [0, 1, 2]
    w.on_param(3, 0.01)
    assert w.due(0.01)[0] == [7]  # slot 3's next use
    for c in (0, 1, 2):
        w.on_param(c, 0.02)
    assert w.due(0.02)[0] == [4, 5, 6]
    w.on_param(4, 0.03)
    w.on_param(5, 0.03)
    assert w.due(0.03)[0] == [8, 9]
    assert w.n_sent == 10 and all(w.sent(c) for c in range(10))


def test_a_batch_of_parameters_is_fresh_once_per_chunk_in_order_or_not():
    w = window(n=10, slots=10)
    w.set_ready(range(10))
    w.due(0.0)
    assert w.on_params(np.array([1, 3, 4]), 0.01, np.ones(3, bool)).tolist() == [True, True, True]
    assert w.on_params(np.array([2, 3, 5]), 0.02, np.ones(3, bool)).tolist() == [True, False, True]  # 3 had
    assert w.on_params(np.array([7, 6, 7, 1, 6]), 0.03, np.ones(5, bool)).tolist() == [True, True, False, False, False]
    assert w.n_done == 7 and w.missing() == [0, 8, 9]


def test_chunks_wait_until_produced():
    w = window(slots=8)
    w.set_ready([0, 1, 3])
    assert w.due(0.0)[0] == [0, 1, 3]
    assert w.due(0.0)[0] == []
    w.set_ready([2])
    assert w.due(0.0)[0] == [2]


def test_timeout_retransmits_with_backoff_and_rtt_from_answers_to_first_sends_only():
    w = window(n=3, slots=3, initial=0.1, min=0.01, max=1.0)
    w.set_ready([0, 1, 2])
    w.due(0.0)
    # Chunk 2 completed by a peer's resend: no sample, but the peers are in the step (a first step
    # with nothing answered waits longer: test_a_first_step_...); the others go by their timers.
    assert w.on_param(2, 0.001, sample=False) and w.rtt.srtt is None
    assert w.due(0.099) == ([], [])
    assert w.due(0.1) == ([], [0, 1])  # first timeout: RTO 0.1
    assert w.rtt.rto == pytest.approx(0.2)  # the RTO itself backs off once for the burst
    assert w.due(0.49) == ([], [])  # second send of each: 0.2 * 2
    assert w.due(0.501) == ([], [0, 1])
    assert w.rtt.rto == pytest.approx(0.4) and w.timeouts == 4
    assert w.on_param(0, 0.51, sample=False) and w.rtt.srtt is None  # Karn: flagged RETRANSMIT, no sample
    # Unflagged: completed by first sends, not the answer to a resend: both resends were spurious
    # and the chunk's round trip from its first send is a sample (Eifel).
    assert w.on_param(1, 0.52) and w.rtt.srtt == pytest.approx(0.52)
    assert not w.on_param(0, 0.53)  # duplicate


def test_a_chunk_leaving_after_this_workers_own_resend_in_its_slot_is_marked_for_no_sample():
    """A worker that had to resend chunk c sends c + S late, after its own recovery; peers that sent
    c + S at once would time that recovery as a round trip, and through the RTO's peak every next
    recovery longer (4 workers at LOSS=0.05: RTOs of 2 s against 5 ms round trips). c + S goes
    flagged, so its sum and answer are, and nobody samples it; c + 2S goes unflagged again."""
    w = window(n=9, slots=3, initial=0.1, min=0.01, max=1.0)
    w.set_ready(range(9))
    assert w.due(0.0) == ([0, 1, 2], [])
    w.on_param(2, 0.001, sample=False)  # the peers are in the step: the others go by their timers
    assert w.due(0.002) == ([5], [])
    assert w.due(0.1) == ([], [0, 1])  # chunks 0 and 1 time out once ...
    w.on_param(1, 0.101, sample=False)  # ... chunk 1's answer comes (its resend's); 0's later still
    new, _ = w.due(0.102)
    assert new == [4] and w.after_own_resend(new) == [4]
    w.on_param(4, 0.105)
    new, _ = w.due(0.106)
    assert new == [7] and w.after_own_resend(new) == []  # 4 was sent once: 7 leaves unmarked
    w.on_param(0, 0.2, sample=False)
    assert w.after_own_resend(w.due(0.2)[0]) == [3]
    assert w.after_own_resend([0, 1, 2]) == []  # a slot's first chunk follows no other


def test_parameters_of_a_later_chunk_fast_retransmit_an_overdue_one_once():
    w = window(n=10, slots=10, initial=1.0, min=0.5, max=4.0)
    w.set_ready(range(10))
    w.due(0.0)
    for c in (0, 2, 3):
        w.on_param(c, 0.01)
    assert w.due(0.02) == ([], []) and w.wake_at() > 0.5  # chunk 1 is only 2 places behind
    w.on_param(4, 0.03)  # 3 places: its gradient, sum or parameters were lost, or it comes soon
    at = 0.03 + w.rtt.srtt  # the reordering window: a smoothed round trip
    assert w.wake_at() == pytest.approx(at) and w.due(at - 0.001) == ([], [])
    assert w.due(at) == ([], [1])
    assert w.fast_retransmits == 1 and w.timeouts == 0 and w.rtt.rto == 0.5  # floor; no back-off
    for c in (5, 6, 7, 8, 9):
        w.on_param(c, at + 0.01)
    assert w.due(at + 0.999) == ([], [])  # once per chunk: then its timer, doubled, takes over
    assert w.due(at + 1.0) == ([], [1]) and w.timeouts == 1


def test_fast_retransmit_compares_chunks_of_one_shard_only():
    """Two optimizer nodes answer independently: shard 1's answers overtaking shard 0's are not a loss."""
    w = Window(0, 10, 10, RttEstimator(RtoConfig(initial=1.0, min=0.5, max=4.0)), now=0.0,
               shard_his=np.array([4, 9]))
    w.set_ready(range(10))
    w.due(0.0)
    for c in (5, 6, 7, 8, 9):
        w.on_param(c, 0.01)
    assert w.due(0.02) == ([], [])  # chunks 0..4 (shard 0) only late
    for c in (0, 2, 3, 4):
        w.on_param(c, 0.03)
    assert w.due(w.wake_at()) == ([], [1])  # 3 places later in its own shard: lost


def test_a_chunk_answered_within_the_reordering_window_is_not_fast_retransmitted():
    """Peers send in orders of their own: a chunk spanning two tensors leaves once both are put (a
    cnn's chunk 80 on BMv2 came up to a third of a round trip after 83, every few steps, at
    LOSS=0). Found overdue, it is resent only if still unanswered a smoothed round trip later."""
    w = window(n=8, slots=8, initial=1.0, min=0.5, max=4.0)
    w.set_ready(range(8))
    w.due(0.0)
    w.on_params(np.array([1, 2, 3]), 0.04, np.ones(3, bool))  # a round trip of 40 ms: a 40 ms window
    assert w.fast_due and w.wake_at() == pytest.approx(0.08) and w.due(0.07) == ([], [])
    w.on_param(0, 0.075)
    assert w.due(0.08) == ([], []) and w.due(0.09) == ([], []) and w.fast_retransmits == 0
    w.on_params(np.array([4, 5, 6, 7]), 0.1, np.ones(4, bool))
    assert w.complete and not w.fast_due


def test_fast_retransmit_off_and_karn_for_flagged_parameters():
    w = window(n=6, slots=6, fast_after=0)
    w.set_ready(range(6))
    w.due(0.0)
    for c in range(1, 6):
        w.on_param(c, 0.01, sample=c != 1)
    assert w.due(0.02) == ([], []) and w.fast_retransmits == 0
    assert w.rtt.srtt == pytest.approx(0.01)
    w2 = window(n=2, slots=2)
    w2.set_ready([0, 1])
    w2.due(0.0)
    w2.on_param(0, 0.3, sample=False)  # completed by a peer's retransmission: not a round trip
    assert w2.rtt.srtt is None


def test_link_back_resends_every_outstanding_chunk_at_once_but_the_ones_that_proved_it():
    """Frames sent while the link was down are lost: their backed-off timeouts (up to the RTO's
    max, here past the deadline) would outlast the step's deadline, so the window sends them again
    when the link is back, and restarts the deadline."""
    w = window(n=8, slots=8, initial=0.2, max=2.0, deadline=1.5)
    w.set_ready(range(8))
    assert w.due(0.0)[0] == list(range(8))  # the link goes down: none of these got out
    tries = []
    while len(tries) < 3:  # the timeouts back off while the sends fail
        t = float(w.expiry.min())
        again = w.due(t)[1]
        assert again in ([], list(range(8)))
        tries += [t] if again else []
    assert tries == [2.0, 4.0, 6.0]  # nothing answered before the first round trip: each try at the cap
    assert w.expiry.min() - t == 2.0  # the next try at the RTO's max, past the deadline
    w.on_param(0, t + 0.1)
    w.link_back(t + 0.2, just_sent=[1])
    assert w.due(t + 0.2) == ([], [2, 3, 4, 5, 6, 7])
    assert not w.stalled(t + 1.6)
    assert w.expiry[1] > t + 0.2 and w.expiry[0] == np.inf


def test_rto_adapts_to_measured_round_trips():
    est = RttEstimator(RtoConfig(initial=1.0, min=0.001, max=5.0, peak=0))  # RFC 6298 alone
    for _ in range(50):
        est.sample(0.004)
    assert 0.004 <= est.rto < 0.01
    for _ in range(50):
        est.sample(0.4)
    assert 0.4 <= est.rto < 0.6


def test_round_trips_longer_than_the_cap_raise_it_instead_of_retransmitting_early():
    """Sixteen workers on two cores: each slot waits for the slowest worker, round trips take about
    a second, and a fixed 0.25 s cap resent every outstanding chunk four times a round trip."""
    w = window(n=4, slots=4, initial=0.1, min=0.1, max=0.25, deadline=8.0, peak=0)  # the cap alone
    for _ in range(20):
        w.rtt.sample(1.0)
    assert w.rtt.rto == pytest.approx(1.0, abs=0.01) and w.rtt.cap == w.rtt.rto
    w.set_ready(range(4))
    w.due(0.0)
    assert w.due(0.9) == ([], [])  # the old cap would have resent all four at 0.25
    assert w.due(1.01)[1] == [0, 1, 2, 3]
    for _ in range(20):
        w.rtt.sample(30.0)
    assert w.rtt.rto == 2.0  # at most a quarter of the deadline: a few tries before the step fails
    for _ in range(100):
        w.rtt.sample(0.01)
    assert w.rtt.rto == 0.1 and w.rtt.cap == 0.25  # short round trips: floor and cap as configured


def test_before_the_first_round_trip_timeouts_back_off_past_the_cap():
    """512 slots x 4 workers behind a software switch: the first window takes longer than the
    0.25 s cap, every chunk of it times out before its answer, and Karn's rule takes no sample from
    them; capped at 0.25 s the window was resent forever (no step in 60 s). Once something was
    answered (here by a peer's resend: no sample), the rest go by timers that back off past the cap."""
    w = window(n=9, slots=9, initial=0.1, min=0.1, max=0.25, deadline=8.0)
    w.set_ready(range(9))
    w.due(0.0)
    w.on_param(0, 0.0, sample=False)
    t, gaps = 0.0, []
    for _ in range(4):
        t = float(w.expiry.min())
        assert w.due(t)[1] == list(range(1, 9))
        gaps.append(float(w.expiry.min()) - t)
    # the chunk's timer and the RTO both double (RFC 6298 5.5), past the 0.25 cap up to deadline / 4
    assert gaps == pytest.approx([0.4, 1.6, 2.0, 2.0])
    w.on_param(1, t + 0.1, sample=False)
    w.rtt.sample(0.6)  # a chunk sent once answered: from now on the cap follows round trips
    assert w.rtt.cap == pytest.approx(w.rtt.measured) and w.rtt.measured > 0.25


def test_a_window_timing_out_whole_is_resent_a_burst_at_a_time_but_after_a_link_outage():
    w = window(n=40, slots=40, initial=0.1, min=0.1, max=0.25, burst=16)
    w.rtt.sample(0.01)  # not a first step (test_a_first_step_...)
    w.set_ready(range(40))
    w.due(0.0)
    assert w.due(0.1)[1] == list(range(16))  # the oldest 16; the rest wait one RTO more
    assert w.timeouts == 16 and w.expiry[16:].min() == pytest.approx(0.2)
    for c in range(16, 30):  # they were only late
        w.on_param(c, 0.15)
    # Round trips of 0.15 s raised the RTO to 0.3 s (twice the longest): timers count from the
    # send at the RTO of now, so the rest are resent 0.3 s after theirs.
    assert w.due(0.2)[1] == [] and w.rtt.rto == pytest.approx(0.3)
    assert w.due(0.299)[1] == [] and w.due(0.3)[1] == list(range(30, 40))
    w2 = window(n=40, slots=40, initial=0.1, burst=16)
    w2.set_ready(range(40))
    w2.due(0.0)
    w2.link_back(0.05, just_sent=[])
    assert w2.due(0.05)[1] == list(range(40))  # lost while the link was down: all at once


def test_deadline_fails_the_step_naming_missing_chunks():
    w = window(n=5, slots=5, deadline=2.0)
    w.set_ready(range(5))
    w.due(0.0)
    for c in (0, 2, 4):
        w.on_param(c, 1.0)
    assert not w.stalled(2.9)
    assert w.stalled(3.1) and w.missing() == [1, 3]
    err = StepTimeout(1, 2, 0, w.missing(), 2.1)
    assert "chunk(s)" in str(err) and "1, 3" in str(err) and "step 0" in str(err)


@pytest.mark.parametrize("n,slots", [(10, 4), (7, 7), (5, 8), (33, 1)])
def test_vectorised_slot_versions_match_the_schedule(n, slots):
    for step in range(4):
        slot, ver = slot_and_version(step, np.arange(n), n, slots)
        assert slot.tolist() == [schedule.slot_of(c, slots) for c in range(n)]
        assert ver.tolist() == [schedule.version_of(step, c, n, slots) for c in range(n)]


def run_step(rtt: RttEstimator, step: int, t0: float, wait: float, n: int = 1024, slots: int = 16,
             trip: float = 0.01, lost: frozenset = frozenset()) -> tuple[int, float]:
    """One step on a scripted clock: every chunk sent at t0 or later is answered `trip` after its
    send, but none before t0 + `wait` (a peer starting the step late, a node committing the
    previous one). The first sends of the chunks in `lost` are lost; the answer to a lost chunk's
    resend comes flagged RETRANSMIT (a resend completed it). Every other answer is unflagged: its
    first send completed the chunk, so a resend of it was spurious and its answer comes as it would
    have. (resends, step's end)."""
    w = Window(step, n, slots, rtt, t0)
    w.set_ready(range(n))
    answer_at: dict[int, tuple[float, bool]] = {}  # chunk: (when, unflagged)
    t, resent = t0, 0
    while not w.complete:
        new, again = w.due(t)
        resent += len(again)
        for c in new:
            if c not in lost:
                answer_at[c] = (max(t + trip, t0 + wait), True)
        for c in again:
            answer_at.setdefault(c, (max(t + trip, t0 + wait), False))
        t = min(min((at for at, _ in answer_at.values()), default=np.inf), w.wake_at())
        came = sorted(c for c, (at, _) in answer_at.items() if at <= t)
        if came:
            w.on_params(np.array(came), t, np.array([answer_at.pop(c)[1] for c in came]))
    return resent, t


def resends_per_step(waits: list[float], **rto) -> list[int]:
    """run_step for each wait in turn, one estimator throughout (as a worker keeps it), as make run
    configures it (RTO floor 0.1 s, cap 0.25 s), 0.05 s of compute between steps."""
    rtt = RttEstimator(RtoConfig(min=0.1, max=0.25, **rto))
    t, out = 0.0, []
    for step, wait in enumerate(waits):
        resent, t = run_step(rtt, step, t, wait)
        out.append(resent)
        t += 0.05
    return out


def test_a_stall_at_every_steps_start_times_nothing_out():
    """Each step's first window waits 0.4 s for a late peer, then round trips take 10 ms. RFC 6298's
    estimate alone falls to the 0.1 s floor within a step, so every step's first window timed out
    (the oldest 16 chunks, and again after the back-off: BMv2's ~17 resends a step at LOSS=0, a
    4-worker gpt's 613-767 in 6 steps on the embedded switch). Either rule alone stops it: a window
    of which nothing was answered since its chunks were sent waits at least `initial` (1 s), and
    the RTO covers twice the longest round trip of the step before (learnt after the first). The first step, before any round trip, is held
    longer still (test_a_first_step_...)."""
    waits = [0.4] * 6
    first, *rest = resends_per_step(waits, peak=0, initial=0.1)
    assert first == 0 and min(rest) >= 16  # neither rule: as before, but for the first step
    assert resends_per_step(waits, peak=0) == [0] * 6  # the whole window late: held for 1 s
    assert resends_per_step(waits, initial=0.1) == [0] * 6  # the peak, from the step after
    assert resends_per_step(waits) == [0] * 6


def test_a_longer_stall_is_learned_from_the_answers_to_the_chunks_it_made_resend():
    """The stall grows to 1.2 s, past the 1 s hold: its step times out; the answers to the chunks
    it resent come unflagged (first sends completed them), so they are round-trip samples (Eifel)
    and the next steps, stalled as long, resend nothing. Excluding resent chunks (Karn's rule by
    attempts) left the estimate blind to the very stall that caused the resends."""
    waits = [0.4, 0.4, 0.4, 1.2, 1.2, 1.2]
    assert resends_per_step(waits) == [0, 0, 0, 16, 0, 0]
    assert resends_per_step(waits, peak=0) == [0, 0, 0, 16, 16, 16]  # the hold alone learns nothing


def test_the_peak_forgets_a_one_off_stall_two_steps_later():
    """A long stall raises the RTO for this step and the next, then only the round trips count
    again: a loss late in a run is not waited for as long as a stall long ago."""
    rtt = RttEstimator(RtoConfig(min=0.1, max=0.25))
    rtt.start_step(0)
    rtt.sample(0.01, longest=1.5)
    assert rtt.rto == pytest.approx(3.0)
    rtt.start_step(1)
    rtt.sample(0.01)
    assert rtt.rto == pytest.approx(3.0)
    rtt.start_step(1)  # the same step again (a second Window of it): nothing rotates
    rtt.start_step(2)
    assert rtt.rto == pytest.approx(0.1)


def test_a_lost_frame_is_still_resent_once_the_rto_covering_the_peak_passed():
    """The peak delays the timeout, never removes it: the last chunk's gradient is lost (its first
    send never answered; the answer to its resend comes flagged), the step ends after one resend."""
    rtt = RttEstimator(RtoConfig(min=0.1, max=0.25))
    rtt.start_step(0)
    rtt.sample(0.01, longest=0.3)
    w = Window(1, 4, 4, rtt, 10.0)
    w.set_ready(range(4))
    assert w.due(10.0)[0] == [0, 1, 2, 3]
    w.on_params(np.arange(3), 10.01, np.ones(3, bool))
    assert w.due(10.59) == ([], [])  # the RTO: 2 x the peak of 0.3 s
    assert w.due(10.6) == ([], [3])
    w.on_param(3, 10.62, sample=False)
    assert w.complete and w.timeouts == 1


def test_a_window_with_no_answer_at_all_is_resent_after_initial_then_doubling():
    """Nothing answered since the window was sent (a peer that never comes, a switch restarted): its
    RTO of 0.1 s passes, but the window is held until `initial` (1 s) after its send, then resent,
    and held twice as long after that; once one is answered the others go by their timers."""
    rtt = RttEstimator(RtoConfig(min=0.1, max=0.25))
    rtt.sample(0.01)
    w = Window(1, 6, 6, rtt, 0.0)
    w.set_ready(range(4))
    assert w.due(0.0)[0] == [0, 1, 2, 3] and rtt.rto == pytest.approx(0.1)
    assert w.due(0.5) == ([], []) and w.wake_at() == pytest.approx(1.0)
    assert w.due(1.0) == ([], [0, 1, 2, 3])
    assert w.due(2.9) == ([], [])
    assert w.due(3.0) == ([], [0, 1, 2, 3])
    w.on_param(0, 3.05, sample=False)  # something came through: the others are late, not waiting
    t = float(w.expiry[1:4].max())
    assert t < 3.0 + 4.0 and w.due(t) == ([], [1, 2, 3])


def test_a_timer_counts_from_its_send_at_the_rto_of_now():
    """A chunk sent while the RTO was 0.1 s; a round trip of 0.4 s measured since (a peer slower
    this step) raises it to 0.8 s: the chunk is resent 0.8 s after its send, not at 0.1 s."""
    rtt = RttEstimator(RtoConfig(min=0.1, max=0.25))
    rtt.sample(0.01)
    w = Window(1, 8, 8, rtt, 0.0)
    w.set_ready(range(2))
    assert w.due(0.0)[0] == [0, 1] and w.expiry[0] == pytest.approx(0.1)
    w.on_param(1, 0.4)
    assert rtt.rto == pytest.approx(0.8)
    assert w.due(0.5) == ([], []) and w.due(0.799) == ([], [])
    assert w.due(0.8) == ([], [0])


def test_a_first_step_waits_for_late_peers_without_resending_and_resends_a_loss_at_the_first_answers():
    """Workers start their first step seconds apart (a 25M gpt's 4 workers on 2 cores, worker 0
    evaluating the model beside: 192-257 resends in step 0 when the window, with no round trip
    measured, was held 1 s, then 2, 4, 8). Until something of the step is answered, no round trip
    known, the window waits the cap (a quarter of the deadline) per try; the first answers show
    the losses."""
    rtt = RttEstimator(RtoConfig(min=0.1, max=0.25))  # deadline 60 s: the cap is 15 s
    assert rtt.cap == 15.0
    assert run_step(rtt, 0, 0.0, wait=14.0)[0] == 0  # every worker late but one, for 14 s
    assert resends_per_step([14.0, 0.4, 0.4]) == [0, 0, 0]  # and the steps after, learnt from it
    assert run_step(RttEstimator(RtoConfig(min=0.1, max=0.25)), 0, 0.0, wait=20.0)[0] > 0  # bounded
    # A loss in a first step: chunk 0's gradient is lost, the peers come at 5 s. Their answers to
    # the later chunks resend it (fast retransmit), not at the cap.
    w = Window(0, 8, 8, RttEstimator(RtoConfig(min=0.1, max=0.25)), 0.0)
    w.set_ready(range(8))
    assert w.due(0.0)[0] == list(range(8))
    assert w.due(4.9) == ([], []) and w.wake_at() == 15.0
    w.on_params(np.arange(1, 8), 5.0, np.ones(7, bool))
    assert w.wake_at() == 5.1  # the reordering window: a round trip (5 s), at most the RTO's floor
    assert w.due(5.1) == ([], [0]) and w.fast_retransmits == 1 and w.timeouts == 0
    assert w.on_param(0, 5.01, sample=False) and w.complete
    # A window lost whole (or a switch restarted before it answered): a try at the cap, then each
    # cap again, before the deadline fails the step.
    w = Window(0, 2, 2, RttEstimator(RtoConfig(min=0.1, max=0.25)), 0.0)
    w.set_ready(range(2))
    w.due(0.0)
    assert w.due(14.99) == ([], []) and w.due(15.0) == ([], [0, 1])
    assert w.due(29.99) == ([], []) and w.due(30.0) == ([], [0, 1]) and not w.stalled(30.0)


def test_the_whole_window_hold_shrinks_after_needed_resends_and_is_restored_by_a_spurious_one():
    """A small model under loss: chunks through one slot (each sent once the one before is
    answered), the last one's gradient lost, so nothing is answered after its send (the window late
    as a whole). Held `initial` (1 s) every time, each such loss cost a second (make run mlp
    LOSS=0.02: 39 s against 2.1 s). The flagged answer to each resend proves it needed, so the hold
    halves per loss down to the RTO; a stall at a step's start (LOSS=0) then times the window out
    once, the unflagged answer proves that resend spurious, and the hold is whole again."""
    rtt = RttEstimator(RtoConfig(min=0.1, max=0.25))
    t = run_step(rtt, 0, 0.0, 0.0, n=4, slots=1)[1]  # a clean first step: round trips of 10 ms
    took = []
    for step in range(1, 6):
        t0 = t + 0.05
        resent, t = run_step(rtt, step, t0, 0.0, n=4, slots=1, lost=frozenset({3}))
        assert resent == 1
        took.append(round(t - t0, 3))
    # 3 round trips, the hold (1, 0.5, 0.25, 0.125 s; then the RTO's floor 0.1 s), the resend's round trip
    assert took == [1.04, 0.54, 0.29, 0.165, 0.14]
    assert rtt.hold == pytest.approx(0.1)
    stall = [run_step(rtt, step, t + 0.05 + 10 * step, 0.4, n=4, slots=1)[0] for step in (6, 7, 8)]
    assert stall == [2, 0, 0] and rtt.hold == 1.0  # the first stall resent (twice, by the back-off), then held


def test_a_restarted_worker_keeps_what_it_learnt_of_a_lossy_path():
    """The estimates a worker's resume file keeps (state/restore): started again on the same lossy
    path, a worker loses no more than its learnt hold per late window; a fresh estimator, which
    waits `initial` until resends prove loss again (make stress: silences of 0.5-2 s after a
    restart), and an empty or foreign record learn afresh."""
    rtt = RttEstimator(RtoConfig(min=0.1, max=0.25))
    t = run_step(rtt, 0, 0.0, 0.0, n=4, slots=1)[1]
    for step in range(1, 6):
        t = run_step(rtt, step, t + 0.05, 0.0, n=4, slots=1, lost=frozenset({3}))[1]
    took = {}
    for name in ("restored", "fresh"):
        again = RttEstimator(rtt.cfg)
        if name == "restored":
            again.restore(rtt.state())
            assert again.state() == rtt.state()
        t0 = t + 0.05
        took[name] = round(run_step(again, 6, t0, 0.0, n=4, slots=1, lost=frozenset({3}))[1] - t0, 3)
    assert took == {"restored": 0.14, "fresh": 1.04}
    for record in [(np.nan, np.nan, np.nan), (0.01, 0.005, 7.0), (0.01, 0.005, 0.0)]:
        fresh = RttEstimator(rtt.cfg)
        fresh.restore(record)
        assert fresh.srtt is None and fresh.hold == 1.0


def test_with_no_loss_the_hold_stays_whole():
    """At LOSS=0 no resend is answered flagged: a stall longer than the hold is resent (spurious,
    answered unflagged), which never shortens the hold; the next stall is held (and learnt by the peak)."""
    rtt = RttEstimator(RtoConfig(min=0.1, max=0.25))
    resends = []
    for step, wait in enumerate([0.0, 1.2, 0.0, 0.0, 0.0, 0.9]):
        resends.append(run_step(rtt, step, 10.0 * step, wait)[0])
        assert rtt.hold == 1.0
    assert resends == [0, 16, 0, 0, 0, 0]  # the 0.9 s stall, long after the peak forgot 1.2 s: held


def test_a_peer_still_in_the_previous_step_is_waited_for_and_not_timed():
    """A peer lost a frame of the previous step: its resend's answer reaches every worker flagged
    (peer_behind), and this step's window waits for its recovery. That wait is neither a loss (the
    learnt short hold does not apply: no resend) nor a round trip of this worker's (no sample: as
    samples, peers' recoveries raised every RTO through the peak, making each recovery longer)."""
    def step(behind: bool) -> tuple[list[int], RttEstimator]:
        rtt = RttEstimator(RtoConfig(min=0.1, max=0.25))
        for _ in range(8):
            rtt.sample(0.01)
        rtt.resends_answered(needed=4, spurious=0)  # a lossy network: the hold is short
        assert rtt.hold == pytest.approx(0.1) and rtt.rto == pytest.approx(0.1)
        w = Window(1, 6, 4, rtt, 0.0)
        w.set_ready(range(6))
        assert w.due(0.0)[0] == [0, 1, 2, 3]
        if behind:
            w.peer_behind()
        resent = w.due(0.3)[1]
        w.on_params(np.arange(4), 0.6, np.ones(4, bool))  # the peer came: first sends complete them
        assert w.due(0.6)[0] == [4, 5]
        w.on_params(np.array([4, 5]), 0.61, np.ones(2, bool))
        return resent, rtt
    resent, rtt = step(behind=True)
    assert resent == [] and rtt.peaks[1] == pytest.approx(0.01) and rtt.rto == pytest.approx(0.1)
    resent, rtt = step(behind=False)  # an unexplained silence: resent at the short hold, and timed
    assert resent == [0, 1, 2, 3] and rtt.peaks[1] == pytest.approx(0.6) and rtt.rto == pytest.approx(1.2)
    assert rtt.hold == 1.0  # the resend proved spurious: the hold is whole again


def test_a_frame_lost_while_the_window_was_held_is_resent_by_the_rto_once_answers_come():
    """The window waited for a peer behind (held `initial`); its last chunk's gradient was lost.
    When the peer comes the other chunks are answered, and the lost one's timer, pushed to the
    hold's end, goes by the RTO again: resent at once, not a second after its send."""
    def step(lossy: bool) -> Window:
        rtt = RttEstimator(RtoConfig(min=0.1, max=0.25))
        for _ in range(8):
            rtt.sample(0.01)
        if lossy:  # resends answered flagged: frames are lost on this network
            rtt.resends_answered(needed=2, spurious=0)
        w = Window(1, 4, 4, rtt, 0.0)
        w.set_ready(range(4))
        assert w.due(0.0)[0] == [0, 1, 2, 3]
        w.peer_behind()
        assert w.due(0.2) == ([], []) and w.wake_at() == pytest.approx(1.0)  # held: the peer is late
        w.on_params(np.arange(3), 0.3, np.ones(3, bool))  # the peer came; chunk 3's gradient was lost
        return w
    w = step(lossy=True)
    assert w.wake_at() <= 0.3 and w.due(0.3) == ([], [3])
    # No loss seen yet (LOSS=0): the late peer is a stall like any, its wait a round trip to learn
    # (RtoConfig.peak), and the whole window's timers keep the hold they were given.
    w = step(lossy=False)
    assert w.wake_at() == pytest.approx(1.0) and w.due(0.99) == ([], []) and w.due(1.0) == ([], [3])
    assert w.rtt.peaks[1] == pytest.approx(0.3)


def test_losses_shrink_the_peak_of_a_one_off_stall_as_they_shrink_the_hold():
    """A long step (64 chunks through one slot) starts with a 0.9 s stall (a peer stopped), which its
    round trips measure: the RTO covers twice that (RtoConfig.peak) for the rest of the step. Then
    every 8th gradient is lost. Each flagged answer to a resend proves a frame lost and halves the
    peak's weight with the hold, so the losses wait 1.8, 0.9, 0.45 s ... instead of 1.8 s each
    (make stress: a worker stopped and one killed at 10 % loss kept resends at 2.4-5.2 s). Without
    a loss the peak stays whole (test_with_no_loss_the_hold_stays_whole)."""
    def step(lost: frozenset) -> tuple[float, RttEstimator]:
        rtt = RttEstimator(RtoConfig(min=0.1, max=0.25))
        t = run_step(rtt, 0, 0.0, 0.0, n=8, slots=1)[1] + 0.05
        resent, end = run_step(rtt, 1, t, 0.9, n=64, slots=1, lost=lost)
        assert resent == len(lost)
        return end - t, rtt
    clean, rtt = step(frozenset())
    assert rtt.rto == pytest.approx(1.8) and rtt.hold == 1.0
    lossy, rtt = step(frozenset(range(8, 64, 8)))
    waits = [1.8, 0.9, 0.45, 0.225, 0.18, 0.18, 0.18]  # the peak x 2 x hold, hold >= the RTO's floor
    assert lossy - clean == pytest.approx(sum(waits), abs=0.005)  # (a resend's round trip replaces the lost one's)
    assert rtt.hold == pytest.approx(0.1) and rtt.rto == pytest.approx(0.18) and rtt.peaks[1] == pytest.approx(0.9)


@pytest.mark.skipif(not window_module.COMPILED, reason="no numba: nothing to compile")
def test_warm_compiles_both_kernels_before_a_step():
    """In a process of its own: none of this one's windows has compiled them for it."""
    code = ("import numpy as np; from host_agent import window; assert not window._first_sends.signatures; "
            "window.warm(); have = len(window._first_sends.signatures), len(window._answered.signatures); "
            "assert all(have); w = window.Window(0, 4, 2, window.RttEstimator(window.RtoConfig()), 0.0); "
            "w.set_ready(range(4)); rows = np.zeros((2, 4), np.int64); rows[:, 2] = w.due(0.0)[0]; "
            # as param_rx passes them: a column of its output rows; no compile left for a step
            "w.on_params(rows[:, 2], 0.0, (rows[:, 3] & 1) == 0); "
            "assert (len(window._first_sends.signatures), len(window._answered.signatures)) == have")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=pathlib.Path(__file__).parents[2])
