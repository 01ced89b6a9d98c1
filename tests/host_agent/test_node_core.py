"""The optimizer node's state machine against the reference, without a network:
sums as the switch makes them, in random order, with duplicates and a crash."""
import json
import random

import numpy as np
import pytest

from host_agent import fused, node_core, optim, reference, state
from host_agent.optim import OptimizerConfig
from mindp.protocol import K, Flag

from .helpers import BUDGET, SCALE, initial_fp16, same_bits, small_model, step_sums, sum_headers, with_nonfinite
from .node_steps import JOB, N, S, assemble, open_core, run_step


def test_retransmit_flag_of_a_fresh_sum_stays_on_its_parameters(tmp_path):
    init = small_model()
    lay = optim.layout_of(init)
    core = open_core(tmp_path, init, OptimizerConfig())
    sums, nf = step_sums(lay, reference.synthetic_grads(1), N, 0, initial_fp16(init))
    chunks = np.arange(2)
    hdr = sum_headers(JOB, 0, chunks, lay, S, N, nf)
    hdr["flags"][1] |= Flag.RETRANSMIT
    out, _ = core.handle(hdr, sums[chunks])
    assert out["chunk"].tolist() == [0, 1] and core.stats["applied"] == 2
    assert [bool(f & Flag.RETRANSMIT) for f in out["flags"]] == [False, True]


@pytest.mark.parametrize("kernel", ["avx2", "portable", "numpy"])
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_shuffled_duplicated_sums_give_reference_bits(tmp_path, monkeypatch, kind, kernel):
    """With each kernel: AVX2 (where the CPU has it), the portable one (MINDP_KERNEL=portable, as
    on any other CPU), and the numpy composition the node runs where numba is missing
    (MINDP_NO_NUMBA=1)."""
    if kernel == "numpy":
        monkeypatch.setattr(fused, "NUMPY_ONLY", True)
    elif kernel == "avx2" and not fused.host_has_avx2():
        pytest.skip("this CPU has no AVX2 or F16C")
    else:
        monkeypatch.setenv("MINDP_KERNEL", kernel)
    assert fused.selected() == kernel
    init = small_model()
    lay = optim.layout_of(init)
    cfg = OptimizerConfig(kind=kind, lr=1e-2)
    gf = reference.synthetic_grads(5)
    core = open_core(tmp_path, init, cfg)
    rng = random.Random(0)
    params = initial_fp16(init)
    for step in range(4):
        sent = run_step(core, lay, gf, step, params, rng)
        assert sorted(sent) == list(range(lay.n_chunks))
        for answers in sent.values():  # first answer applied, the rest resent with equal bits
            assert not answers[0][0] & Flag.RETRANSMIT
            assert all(f & Flag.RETRANSMIT and np.array_equal(v, answers[0][1]) for f, v in answers[1:])
        params = assemble(lay, sent, params)
    assert core.committed == 3 and core.stats["applied"] == 4 * lay.n_chunks
    assert same_bits(params, reference.train(init, gf, N, 4, cfg).params)
    core.store.export(tmp_path / "out.npz")
    with np.load(tmp_path / "out.npz") as z:
        assert same_bits({k: z[k] for k in z.files}, reference.train(init, gf, N, 4, cfg).master)


def test_membership_change_between_steps_divides_by_each_sums_count(tmp_path):
    """Workers added and removed between steps (the switch's sums carry the new count): the node
    follows, each mean divided by the contributions counted, as the reference with the same members."""
    init = small_model()
    lay = optim.layout_of(init)
    cfg = OptimizerConfig()
    gf = reference.synthetic_grads(6)
    members = {0: [0, 1, 2], 1: [0, 1, 2, 3], 2: [1, 2, 3], 3: [1, 3]}
    core = open_core(tmp_path, init, cfg)
    params = initial_fp16(init)
    chunks = np.arange(lay.n_chunks)
    for step, ids in members.items():
        sums, nf = reference.chunk_sums([reference.flat_fp16(lay, gf(w, step, params)) for w in ids])
        hdr, vals = core.handle(sum_headers(JOB, step, chunks, lay, S, len(ids), nf), sums)
        assert hdr["chunk"].tolist() == chunks.tolist()
        params = assemble(lay, {int(c): [(0, v)] for c, v in zip(hdr["chunk"], vals)}, params)
    ref = reference.train(init, gf, N, len(members), cfg, members=members.__getitem__)
    assert same_bits(params, ref.params)
    assert not same_bits(params, reference.train(init, gf, N, len(members), cfg).params)
    hdr, _ = core.handle(sum_headers(JOB, 4, [0], lay, S, 33), np.zeros((1, K), np.int64))
    assert len(hdr) == 0 and core.stats["rejected_nworkers"] == 1  # beyond the protocol's 32


def test_recent_params_are_each_slots_last_answer(tmp_path):
    """What the node sends again when sums stop: per slot the last chunk it applied (a worker that
    lacks a chunk's parameters never sends the next chunk of its slot), across the step boundary,
    with the bits first sent and flag RETRANSMIT; never a chunk it has not applied."""
    init = small_model()
    lay = optim.layout_of(init)
    gf = reference.synthetic_grads(7)
    core = open_core(tmp_path, init, OptimizerConfig())
    assert len(core.recent_params()[0]) == 0
    params = initial_fp16(init)
    sent0 = run_step(core, lay, gf, 0, params, random.Random(0), dup=0, batch=1, window=2)
    params1 = assemble(lay, sent0, params)
    sent1 = run_step(core, lay, gf, 1, params1, random.Random(1), dup=0, batch=1, only=[0, 1, 2, 9])
    hdr, vals = core.recent_params()
    got = sorted((int(h["step"]), int(h["chunk"])) for h in hdr)
    last0 = [max(c for c in range(lay.n_chunks) if c % S == s) for s in range(3, S)]
    assert got == sorted([(0, c) for c in last0] + [(1, 0), (1, 2), (1, 9)])
    assert all(h["flags"] & Flag.RETRANSMIT and h["kind"] == 3 for h in hdr)
    for h, v in zip(hdr, vals):
        first = (sent0 if h["step"] == 0 else sent1)[int(h["chunk"])][0][1]
        assert np.array_equal(v.view(np.uint16), first.view(np.uint16))


def test_headers_in_native_byte_order_are_remembered_as_sent(tmp_path):
    """handle() given headers numpy made native-endian (np.concatenate does) answers and remembers
    them as the wire's big-endian ones: the resends name the chunks applied, not byte-swapped ones."""
    init = small_model()
    lay = optim.layout_of(init)
    core = open_core(tmp_path, init, OptimizerConfig())
    sums, nf = step_sums(lay, reference.synthetic_grads(7), N, 0, initial_fp16(init))
    for chunks in (np.arange(0, lay.n_chunks, 2), np.arange(1, lay.n_chunks, 2)):  # scattered, then the rest
        wire = sum_headers(JOB, 0, chunks, lay, S, N, nf)
        hdr, _ = core.handle(wire.astype(wire.dtype.newbyteorder("=")), sums[chunks])
        assert [int(c) for c in hdr["chunk"]] == chunks.tolist()
        resent, _ = core.recent_params()
        assert set(resent["step"].tolist()) == {0} and set(resent["chunk"].tolist()) <= set(range(lay.n_chunks))


def as_worker(lay, sent, previous):
    """What a worker keeps after a step: the answers, or its parameters before the step when any
    answer said NONFINITE (common rule of issue 13.2)."""
    if any(f & Flag.NONFINITE for answers in sent.values() for f, _ in answers):
        return previous
    return assemble(lay, sent, previous)


@pytest.mark.parametrize("crash", [False, True])
def test_nonfinite_chunk_makes_the_whole_step_a_no_op(tmp_path, crash):
    """Chunks applied before the node learns of the non-finite chunk are reverted (the step commits
    as skipped, with no optimizer update counted); every later answer carries NONFINITE and the
    parameters before the step; the run ends on the reference's bits, also across a crash."""
    init = small_model()
    lay = optim.layout_of(init)
    cfg = OptimizerConfig()
    bad_chunk = (lay.offsets["w"] + 40) // K
    gf = with_nonfinite(reference.synthetic_grads(5), 2, 1, "w", 40)
    hook = []
    core = open_core(tmp_path, init, cfg, on_nonfinite=lambda s, c: hook.append((s, c)))
    rng = random.Random(1)
    params = initial_fp16(init)
    params = as_worker(lay, run_step(core, lay, gf, 0, params, rng, dup=0), params)
    early = [c for c in range(lay.n_chunks) if c != bad_chunk][:bad_chunk // 2 + 1]
    late = [c for c in range(lay.n_chunks) if c not in early and c != bad_chunk]
    sent = run_step(core, lay, gf, 1, params, rng, dup=0, only=early)
    before = lay.flatten(params, dtype=np.float16)
    assert all(not f & Flag.NONFINITE for a in sent.values() for f, _ in a)
    assert any(not np.array_equal(a[0][1], before[c * K : (c + 1) * K]) for c, a in sent.items() if c * K < lay.total)
    sent.update(run_step(core, lay, gf, 1, params, rng, dup=0, only=[bad_chunk]))
    assert sent[bad_chunk][0][0] & Flag.NONFINITE
    if crash:  # killed after learning of it: the restarted node still knows the step is skipped
        core.store.close()
        core = open_core(tmp_path, init, cfg, create=False, on_nonfinite=lambda s, c: hook.append((s, c)))
        assert core.store.step_nonfinite
    late_sent = run_step(core, lay, gf, 1, params, rng, dup=0, only=late)
    padded = np.concatenate([before, np.zeros(lay.n_chunks * K - lay.total, np.float16)])
    for c, answers in late_sent.items():
        assert all(f & Flag.NONFINITE for f, _ in answers)
        assert np.array_equal(answers[0][1].view(np.uint16), padded[c * K : (c + 1) * K].view(np.uint16))
    sent.update(late_sent)
    params = as_worker(lay, sent, params)
    assert core.committed == 1 and core.store.last_skipped and core.store.updates == 1
    assert state.read_commit(tmp_path) == {"step": 1, "updates": 1, "skipped": True}
    assert hook == [(1, bad_chunk)]
    assert core.stats["nonfinite_steps"] == 1 - crash  # counted by the process that learned it
    # Duplicates of the skipped step's sums are answered with NONFINITE too.
    again = run_step(core, lay, gf, 1, params, rng, dup=0, only=[0])
    assert again[0][0][0] & Flag.NONFINITE
    params = as_worker(lay, run_step(core, lay, gf, 2, params, rng, dup=0), params)
    ref = reference.train(init, gf, N, 3, cfg)
    assert ref.nonfinite == [(1, bad_chunk)]
    assert same_bits(params, ref.params)
    core.store.export(tmp_path / "out.npz")
    with np.load(tmp_path / "out.npz") as z:
        assert same_bits({k: z[k] for k in z.files}, ref.master)


def test_sums_of_old_steps_resend_or_drop_and_bad_sums_are_counted(tmp_path):
    init = small_model()
    lay = optim.layout_of(init)
    gf = reference.synthetic_grads(5)
    core = open_core(tmp_path, init, OptimizerConfig())
    params = initial_fp16(init)
    for step in range(2):
        params = assemble(lay, run_step(core, lay, gf, step, params, random.Random(step), dup=0), params)
    sums, nf = step_sums(lay, gf, N, 0, initial_fp16(init))
    hdr, _ = core.handle(sum_headers(JOB, 0, [0], lay, S, N), sums[[0]])  # step 0: two steps old
    assert len(hdr) == 0 and core.stats["stale"] == 1
    bad = sum_headers(JOB, 2, [1, 2, 3, 4], lay, S, N)
    bad["job"][0] = 9
    bad["nworkers"][1] = 0  # no contribution: never a sum the switch makes
    bad["ver"][2] ^= 1
    bad["chunk"][3] = lay.n_chunks + 5
    hdr, _ = core.handle(bad, np.zeros((4, K), np.int64))
    assert len(hdr) == 0
    assert {k: v for k, v in core.stats.items() if k.startswith("rejected")} == {
        "rejected_job": 1, "rejected_nworkers": 1, "rejected_slot": 1, "rejected_chunk": 1}
    assert core.store.applied.sum() == 0


def test_a_batch_completing_a_step_still_answers_the_last_steps_duplicates(tmp_path):
    """The sum that completes step 1 and a retransmitted sum of step 0 in one batch: step 0's
    answer is read before the commit drops step 0's copy."""
    init = small_model()
    lay = optim.layout_of(init)
    gf = reference.synthetic_grads(6)
    core = open_core(tmp_path, init, OptimizerConfig())
    after0 = assemble(lay, run_step(core, lay, gf, 0, initial_fp16(init), random.Random(0), dup=0), initial_fp16(init))
    last = lay.n_chunks - 1
    run_step(core, lay, gf, 1, after0, random.Random(1), dup=0, only=range(last))
    sums1, nf1 = step_sums(lay, gf, N, 1, after0)
    sums0, nf0 = step_sums(lay, gf, N, 0, initial_fp16(init))
    hdr = np.concatenate((sum_headers(JOB, 1, [last], lay, S, N, nf1), sum_headers(JOB, 0, [0], lay, S, N, nf0)))
    out_hdr, vals = core.handle(hdr, np.concatenate((sums1[[last]], sums0[[0]])))
    assert core.committed == 1 and core.stats["applied"] == 2 * lay.n_chunks
    assert [(int(h["step"]), int(h["chunk"])) for h in out_hdr] == [(1, last), (0, 0)]
    assert out_hdr["flags"][1] & Flag.RETRANSMIT
    assert vals[1].tobytes() == lay.flatten(after0, dtype=np.float16)[:K].tobytes()


def test_crash_mid_step_resumes_without_double_apply(tmp_path):
    """Kill between chunks: the reopened node has the applied chunks; workers' retransmissions
    (only for chunks whose parameters they lack) complete the step with reference bits."""
    init = small_model()
    lay = optim.layout_of(init)
    cfg = OptimizerConfig()
    gf = reference.synthetic_grads(5)
    core = open_core(tmp_path, init, cfg)
    rng = random.Random(3)
    params = initial_fp16(init)
    params = assemble(lay, run_step(core, lay, gf, 0, params, rng), params)
    half = list(range(0, lay.n_chunks, 2))
    sent_before = run_step(core, lay, gf, 1, params, rng, only=half)
    del core  # no close: as if killed (the mapping's writes are in the page cache)
    core = open_core(tmp_path, init, cfg, create=False)
    assert core.committed == 0 and core.stats["resumed_chunks"] == len(half)
    rest = [c for c in range(lay.n_chunks) if c not in half]
    sent_after = run_step(core, lay, gf, 1, params, rng, only=rest + half[:3])  # some late duplicates too
    assert all(a[0][0] & Flag.RETRANSMIT for c, a in sent_after.items() if c in half)
    assert core.stats["applied"] == len(rest)
    params = assemble(lay, {**sent_after, **sent_before}, params)
    params = assemble(lay, run_step(core, lay, gf, 2, params, rng), params)
    assert same_bits(params, reference.train(init, gf, N, 3, cfg).params)


def test_state_larger_than_budget_pages_within_budget(tmp_path):
    init = {"big": np.random.default_rng(0).standard_normal(200_000 * SCALE).astype(np.float32)}
    lay = optim.layout_of(init)
    cfg = OptimizerConfig()
    gf = reference.synthetic_grads(1)
    page = 32 * state.RECORD.itemsize
    budget = 8 * page
    core = open_core(tmp_path, init, cfg, budget=budget)
    state_bytes = 2 * lay.n_chunks * state.RECORD.itemsize
    assert state_bytes > 40 * budget
    params = initial_fp16(init)
    for step in range(2):
        params = assemble(lay, run_step(core, lay, gf, step, params, random.Random(step), dup=0.01, batch=64,
                                            window=64),
                          params)
    assert core.store.pager.stats.peak_pages <= 8
    assert same_bits(params, reference.train(init, gf, N, 2, cfg).params)


class Crash(Exception):
    pass


CRASH_POINTS = [
    ("mark_applied", 3),  # a chunk's record written, not yet marked applied
    ("mark_applied", 11),
    ("commit", 1),  # the step's last chunk applied, nothing durable yet
    ("commit_record", 2),  # pages durable, commit.json not yet written
    ("reset_progress", 2),  # commit.json written, progress not yet reset
]


@pytest.mark.parametrize("sync", state.SYNC_MODES)
@pytest.mark.parametrize("where,nth", CRASH_POINTS)
def test_crash_at_each_point_of_the_apply_and_commit_path(tmp_path, monkeypatch, where, nth, sync):
    """A crash injected at the n-th call of one step of the apply/commit path, then a restart
    from disk: the workers resend sums only for chunks whose parameters they lack, and the
    final parameters equal the reference (with commits made durable each step or at exit)."""
    init = small_model()
    lay = optim.layout_of(init)
    cfg = OptimizerConfig()
    gf = reference.synthetic_grads(9)
    steps = 3
    calls = {"n": 0}

    def crashing(orig):
        def fn(*a, **kw):
            calls["n"] += 1
            if calls["n"] == nth:
                raise Crash(where)
            return orig(*a, **kw)
        return fn

    targets = {"mark_applied": (state.Store, "mark_applied"), "commit": (state.Store, "commit"),
               "commit_record": (state.Store, "_write_commit"), "reset_progress": (state.Store, "_reset_progress")}
    core = open_core(tmp_path, init, cfg, sync=sync)
    cls, name = targets[where]
    monkeypatch.setattr(cls, name, crashing(getattr(cls, name)))
    rng = random.Random(nth)
    params = initial_fp16(init)
    crashed = False
    for step in range(steps):
        sums, nf = step_sums(lay, gf, N, step, params)
        have: dict[int, np.ndarray] = {}
        for _ in range(20):
            if len(have) == lay.n_chunks:
                break
            todo = [c for c in range(lay.n_chunks) if c not in have]  # the workers' retransmissions
            rng.shuffle(todo)
            for i in range(0, len(todo), 7):
                part = np.array(todo[i : i + 7])
                try:
                    hdr, vals = core.handle(sum_headers(JOB, step, part, lay, S, N, nf), sums[part])
                except Crash:
                    crashed = True
                    monkeypatch.undo()
                    del core
                    core = open_core(tmp_path, init, cfg, create=False, sync=sync)  # the restarted node
                    break
                for h, v in zip(hdr, vals):
                    have.setdefault(int(h["chunk"]), v.copy())
        assert len(have) == lay.n_chunks, f"step {step}: the node never answered chunks the workers lack"
        params = assemble(lay, {c: [(0, v)] for c, v in have.items()}, params)
    assert crashed
    ref = reference.train(init, gf, N, steps, cfg)
    assert same_bits(params, ref.params)
    core.store.export(tmp_path / "out.npz")
    with np.load(tmp_path / "out.npz") as z:
        assert same_bits({k: z[k] for k in z.files}, ref.master)


@pytest.mark.parametrize("budget", [BUDGET, (60 << 10) * SCALE], ids=["mapped", "paged"])
def test_in_order_batches_take_the_compiled_path_and_answer_as_the_general_one(tmp_path, monkeypatch, budget):
    """The same sums (in order, each batch a run of 6 or 150 consecutive chunks, the long ones
    across blocks of the kernel's parallel loop; some batches spoiled by a hostile or repeated row
    after the first hundred, or led by chunks applied already with other sums; a non-finite chunk
    in step 1) to two nodes, one with the compiled in-order path, one without: the same answers,
    counters and state, and the in-order path taken by the clean batches."""
    init = {"w": np.random.default_rng(5).standard_normal((300, 41 * SCALE)).astype(np.float32) * np.float32(0.1),
            "b": np.zeros(13, np.float32)}
    lay = optim.layout_of(init)
    cfg = OptimizerConfig()
    gf = with_nonfinite(reference.synthetic_grads(7), 1, 1, "w", 7000)
    rng = np.random.default_rng(7)
    steps = []
    params = initial_fp16(init)
    for step in range(3):
        sums, nf = step_sums(lay, gf, N, step, params)
        batches, lo = [], 0
        while lo < lay.n_chunks:
            chunks = np.arange(lo, min(lo + rng.choice([6, 150]), lay.n_chunks))
            hdr, s = sum_headers(JOB, step, chunks, lay, S, N, nf), sums[chunks]
            spoil, at = rng.integers(0, 8), min(100, len(chunks))
            if spoil == 1:  # a hostile row: another job's sum
                hdr = np.insert(hdr, at, sum_headers(JOB + 1, step, chunks[:1], lay, S, N))
                s = np.insert(s, at, s[:1], axis=0)
            elif spoil == 2:  # a duplicate of the batch's first chunk
                hdr, s = np.insert(hdr, at, hdr[:1]), np.insert(s, at, s[:1], axis=0)
            elif spoil == 3 and lo:  # a duplicate of a chunk applied in an earlier batch
                hdr = np.insert(hdr, at, sum_headers(JOB, step, [lo - 1], lay, S, N, nf))
                s = np.insert(s, at, sums[lo - 1 : lo], axis=0)
            elif spoil == 4 and lo >= 3:  # led by chunks applied already, with other sums: each a duplicate
                hdr = np.concatenate([sum_headers(JOB, step, np.arange(lo - 3, lo), lay, S, N, nf), hdr])
                s = np.concatenate([sums[lo - 3 : lo] + 1, s])
            batches.append((hdr, s))
            lo = chunks[-1] + 1
        steps.append(batches)
        params = reference.train(init, gf, N, step + 1, cfg).params

    def run(directory):
        core = open_core(directory, init, cfg, budget)
        answers = [core.handle(h, s) for batches in steps for h, s in batches]
        return core, answers

    taken = []
    in_order = fused.in_order_batch
    monkeypatch.setattr(fused, "in_order_batch", lambda *a: taken.append(in_order(*a)) or taken[-1])
    fast, fast_answers = run(tmp_path / "fast")
    monkeypatch.setattr(fused, "in_order_batch", lambda *a: None)
    slow, slow_answers = run(tmp_path / "slow")
    if not fused.NUMPY_ONLY:
        assert sum(t is not None for t in taken) >= len(taken) // 3 > 0
    for (fh, fv), (sh, sv) in zip(fast_answers, slow_answers, strict=True):
        assert fh.tobytes() == sh.tobytes() and np.array_equal(fv.view(np.uint16), sv.view(np.uint16))
    assert fast.stats == slow.stats and fast.committed == slow.committed == 2
    assert slow.stats["rejected_job"] > 0 and slow.stats["resent"] > 0 and slow.stats["nonfinite_steps"] == 1
    master = reference.train(init, gf, N, 3, cfg).master
    for spec in lay.specs:
        want = master[spec.name].reshape(-1).view(np.uint32)
        assert np.array_equal(fast.store.tensor(spec.name).reshape(-1).view(np.uint32), want)
        assert np.array_equal(slow.store.tensor(spec.name).reshape(-1).view(np.uint32), want)


@pytest.mark.parametrize("map_whole", [True, False], ids=["mapped", "paged"])
def test_sgd_records_hold_no_v_and_a_format_1_state_with_it_trains_alike(tmp_path, map_whole):
    """An SGD state's records are (master, m), two thirds of AdamW's bytes on disk and in RAM. A
    state written before that (format 1: (master, m, v) records, v zero) opens and trains to the
    same bits; records without v are refused for AdamW in one line."""
    init = small_model()
    lay = optim.layout_of(init)
    cfg = OptimizerConfig(kind="sgd", lr=0.05, momentum=0.9, weight_decay=0.01)
    gf = reference.synthetic_grads(3)
    new, old = tmp_path / "new", tmp_path / "old"
    state.create(new, lay, state.init_pieces(lay, init), cfg, page_chunks=32)
    meta = json.loads((new / "meta.json").read_text())
    padded = -(-lay.n_chunks // 32) * 32
    assert meta["lanes"] == 2 and (new / "state0.bin").stat().st_size == padded * 2 * K * 4
    old.mkdir()
    (old / "commit.json").write_bytes((new / "commit.json").read_bytes())
    for i in (0, 1):
        three = np.zeros((padded, 3, K), np.float32)
        three[:, :2] = np.fromfile(new / f"state{i}.bin", np.float32).reshape(padded, 2, K)
        three.tofile(old / f"state{i}.bin")
    (old / "meta.json").write_text(json.dumps({**{k: v for k, v in meta.items() if k != "lanes"}, "format": 1}))
    for d in (new, old):
        core = node_core.NodeCore(state.Store(d, BUDGET, map_whole=map_whole), JOB, N, S)
        assert core.store.record.shape == ((2 if d == new else 3), K)
        for step in range(3):
            params = reference.train(init, gf, N, step, cfg).params
            sums, nf = step_sums(lay, gf, N, step, params)
            core.handle(sum_headers(JOB, step, np.arange(lay.n_chunks), lay, S, N, nf), sums)
        assert core.committed == 2
        got = {spec.name: core.store.tensor(spec.name).reshape(spec.shape) for spec in lay.specs}
        core.store.close()
        assert same_bits(got, reference.train(init, gf, N, 3, cfg).master)
    (new / "meta.json").write_text(json.dumps({**meta, "optimizer": OptimizerConfig(kind="adamw").to_dict()}))
    with pytest.raises(optim.ConfigError, match="records of 2 lanes for adamw"):
        state.Store(new, BUDGET)


def test_streamed_node_survives_one_slot_stalled_while_the_others_run_through(tmp_path):
    """One slot's first sum lost: its chain of chunks (c, c + S, ...) waits for the retransmission
    while the other slots' chains run through the whole model (the window is per slot), so every
    page is left partially applied. A node streaming its state through a budget of 6 pages (8 pages
    a copy) makes room by evicting buffers and writing partly applied pages back early: it stays
    within the budget, answers duplicates and its stall resends meanwhile, and once the held chain
    resumes the step commits bit-exact (here in a scripted order: the held slot's sums last)."""
    rng = np.random.default_rng(2)
    init = {"w": rng.standard_normal((8 * 32 - 1, K)).astype(np.float32) * 0.1, "b": np.zeros(13, np.float32)}
    lay = optim.layout_of(init)  # 8 pages of 32 chunks; a budget of 6 pages
    cfg = OptimizerConfig()
    state.create(tmp_path, lay, state.init_pieces(lay, init), cfg, page_chunks=32)
    core = node_core.NodeCore(state.Store(tmp_path, 6 * 32 * state.record(3).itemsize), JOB, N, S)
    pages = core.store.pages
    assert pages.plan.mode == "stream"
    gf = reference.synthetic_grads(1)
    params = initial_fp16(init)
    for step, held in enumerate([5, 0, 7]):
        sums, nf = step_sums(lay, gf, N, step, params)
        run = [c for c in range(lay.n_chunks) if c % S != held]
        sent = {}
        for part in [run[: len(run) // 2], run[: 3], run[len(run) // 2 :]]:  # with duplicates of applied chunks
            for c in part:
                hdr, vals = core.handle(sum_headers(JOB, step, [c], lay, S, N, nf), sums[[c]])
                for h, v in zip(hdr, vals):
                    sent.setdefault(int(h["chunk"]), []).append(v.copy())
        assert core.committed == step - 1
        hdr, vals = core.recent_params()  # what the node resends while sums stop coming
        assert {int(h["chunk"]) % S for h in hdr if h["step"] == step} == set(range(S)) - {held}
        for h, v in zip(hdr, vals):
            if h["step"] == step:
                assert np.array_equal(v.view(np.uint16), sent[int(h["chunk"])][0].view(np.uint16))
        stalled = [c for c in range(lay.n_chunks) if c % S == held]
        for i in range(0, len(stalled), 4):  # the chain resumes
            part = np.array(stalled[i : i + 4])
            hdr, vals = core.handle(sum_headers(JOB, step, part, lay, S, N, nf), sums[part])
            for h, v in zip(hdr, vals):
                sent.setdefault(int(h["chunk"]), []).append(v.copy())
        assert core.committed == step
        assert all(len({a.tobytes() for a in answers}) == 1 for answers in sent.values())
        params = assemble(lay, {c: [(0, a[0])] for c, a in sent.items()}, params)
    assert same_bits(params, reference.train(init, gf, N, 3, cfg).params)
    stats = core.store.pager.stats
    assert 0 < stats.peak_pages <= pages.plan.budget_pages
    assert stats.early_writebacks > 0  # every page was partly written: buffers alone made too little room
    core.store.close()


def test_deferred_commit_answers_first_then_commits_as_handle_does(tmp_path):
    """defer_commit (the socket's way: the last answers leave before the disk is synced): a step's
    last sums are answered without committing; commit_if_complete commits, and two steps give the
    same bits as a core that commits inside handle()."""
    init = small_model()
    lay = optim.layout_of(init)
    cores = [open_core(tmp_path / name, init, OptimizerConfig()) for name in ("inline", "deferred")]
    cores[1].defer_commit = True
    params = initial_fp16(init)
    for step in range(2):
        sums, nf = step_sums(lay, reference.synthetic_grads(1), N, step, params)
        chunks = np.arange(lay.n_chunks)
        answers = [core.handle(sum_headers(JOB, step, chunks, lay, S, N, nf), sums) for core in cores]
        assert answers[0][1].view(np.uint16).tobytes() == answers[1][1].view(np.uint16).tobytes()
        assert answers[0][0].tobytes() == answers[1][0].tobytes()
        assert cores[0].committed == step and cores[1].committed == step - 1
        cores[1].commit_if_complete()
        assert cores[1].committed == step
        cores[1].commit_if_complete()  # nothing more to commit
        assert cores[1].committed == step
        params = assemble(lay, {int(h["chunk"]): [(0, v)] for h, v in zip(*answers[0])}, params)
