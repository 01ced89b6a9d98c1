"""Sharded optimizer nodes without a network switch: each NodeCore owns a chunk range, sums are fed
as the switch routes them, and the joined result equals the reference bit for bit (also across a
crash of one shard and with a non-finite step, agreed between the shards over real UDP)."""
import random

import numpy as np
import pytest

from host_agent import node_core, optim, reference, shards, state
from host_agent.optim import ConfigError, OptimizerConfig, ParamGroup
from mindp.layout import shard_ranges
from mindp.protocol import K, Flag

from .helpers import BUDGET, SCALE, initial_fp16, same_bits, small_model, step_sums, sum_headers, with_nonfinite
from .shard_steps import JOB, N, S, as_worker, feed


def open_shards(tmp_path, init, cfg, m, create=True, budget=BUDGET):
    lay = optim.layout_of(init)
    cores = []
    for i, rng in enumerate(shard_ranges(lay.n_chunks, m)):
        d = tmp_path / f"shard{i}"
        if create:
            state.create(d, lay, state.init_pieces(lay, init), cfg, page_chunks=32, chunks=rng)
        cores.append(node_core.NodeCore(state.Store(d, budget), JOB, N, S))
    return cores


def exports(tmp_path, cores, lay):
    paths = []
    for i, core in enumerate(cores):
        core.store.export(tmp_path / f"out{i}.npz")
        paths.append(tmp_path / f"out{i}.npz")
    return state.join_exports(paths, lay)


def test_shard_state_holds_exactly_its_range_of_the_full_model(tmp_path):
    init = small_model()
    lay = optim.layout_of(init)
    full = np.zeros(lay.n_chunks * K, np.float32)
    full[: lay.total] = lay.flatten(init, dtype=np.float32)
    cores = open_shards(tmp_path, init, OptimizerConfig(), 3)
    for core in cores:
        lo, hi = core.store.chunks
        assert core.store.n_chunks == hi - lo + 1 and core.store.sharded
        rec = core.store.records(0, 0, core.store.n_chunks)
        assert np.array_equal(rec[:, state.MASTER].reshape(-1).view(np.uint32),
                              full[lo * K : (hi + 1) * K].view(np.uint32))
    assert [c.store.chunks for c in cores] == shard_ranges(lay.n_chunks, 3)
    assert same_bits(exports(tmp_path, cores, lay), {k: v.astype(np.float32) for k, v in init.items()})
    with pytest.raises(ConfigError, match="overlap"):
        state.join_exports([tmp_path / "out0.npz", tmp_path / "out0.npz"], lay)
    with pytest.raises(ConfigError, match="out"):
        state.join_exports([tmp_path / "out0.npz"], lay)
    with pytest.raises(ConfigError, match="not within"):
        state.create(tmp_path / "bad", lay, state.init_pieces(lay, init), OptimizerConfig(),
                     chunks=(0, lay.n_chunks))


def test_the_shards_states_read_as_the_whole_models_and_a_shard_alone_is_refused(tmp_path):
    """What a sharded script's ranks start from and save (MINDP_STATE with every shard's directory)."""
    init = small_model()
    lay = optim.layout_of(init)
    cores = open_shards(tmp_path, init, OptimizerConfig(), 3)
    for core in cores:
        core.store.close()
    dirs = [tmp_path / f"shard{i}" for i in range(3)]
    commit, cfg, got, records = state.read_committed(reversed(dirs))  # any order
    assert commit["step"] == -1 and cfg == OptimizerConfig() and got.n_chunks == lay.n_chunks
    flat = records[:, state.MASTER].reshape(-1)[: lay.total]
    assert np.array_equal(flat.view(np.uint32), lay.flatten(init, dtype=np.float32).view(np.uint32))
    with pytest.raises(ConfigError, match=r"leave chunks \d+:\d+ out: give every shard's directory"):
        state.read_committed(dirs[:2])
    with pytest.raises(ConfigError, match="another shard's directory holds too"):
        state.read_committed([dirs[0], dirs[0], *dirs[1:]])
    state.create(tmp_path / "whole", lay, state.init_pieces(lay, init), OptimizerConfig())
    with pytest.raises(ConfigError, match="one whole-model directory, or every shard's"):
        state.read_committed([tmp_path / "whole", *dirs])
    other = tmp_path / "other"
    state.create(other, lay, state.init_pieces(lay, init), OptimizerConfig(lr=0.5), chunks=(0, 0))
    with pytest.raises(ConfigError, match="another model or optimizer"):
        state.read_committed([*dirs, other])


@pytest.mark.parametrize("groups", [False, True])
@pytest.mark.parametrize("m", [2, 3])
def test_sharded_training_equals_the_reference_and_a_crash_touches_one_range(tmp_path, m, groups):
    """groups: every other tensor in a second parameter group (twice the lr, no weight decay), so
    shards hold chunks of two groups, cut at job-wide element offsets."""
    init = small_model()
    lay = optim.layout_of(init)
    cfg = OptimizerConfig(groups=(ParamGroup(tuple(init)[1::2], 2e-3, 0.0),) if groups else ())
    gf = reference.synthetic_grads(11)
    cores = open_shards(tmp_path, init, cfg, m)
    rng = random.Random(m)
    params = initial_fp16(init)
    steps = 4
    for step in range(steps):
        sums, nf = step_sums(lay, gf, N, step, params)
        got = {}
        for i, core in enumerate(cores):
            lo, hi = core.store.chunks
            mine = list(range(lo, hi + 1))
            rng.shuffle(mine)
            if step == 2 and i == m - 1:  # the last shard is killed half way through its range
                got.update(feed(core, lay, step, mine[: len(mine) // 2], sums, nf))
                other = [c.store.dir.joinpath("commit.json").read_bytes() for c in cores[:-1]]
                del core, cores[-1]  # no close: as if killed
                cores.append(node_core.NodeCore(state.Store(tmp_path / f"shard{i}", BUDGET), JOB, N, S))
                core = cores[-1]
                assert core.stats["resumed_chunks"] == len(mine) // 2
                assert [c.store.dir.joinpath("commit.json").read_bytes() for c in cores[:-1]] == other
                mine = mine[len(mine) // 2 :] + mine[:2]  # the workers' retransmissions
            got.update(feed(core, lay, step, mine, sums, nf))
            assert core.committed == step  # its step commits when its own range is applied
        assert sorted(got) == list(range(lay.n_chunks))
        params = as_worker(lay, got, params)
    ref = reference.train(init, gf, N, steps, cfg)
    assert same_bits(params, ref.params)
    assert same_bits(exports(tmp_path, cores, lay), ref.master)
    # A sum outside a shard's range is refused and counted, and changes nothing.
    before = cores[0].stats["applied"]
    hdr, _ = cores[0].handle(sum_headers(JOB, steps, [lay.n_chunks - 1], lay, S, N), np.zeros((1, K), np.int64))
    assert len(hdr) == 0 and cores[0].stats["rejected_chunk"] == 1 and cores[0].stats["applied"] == before


def pump(agreements, rounds=50):
    """Let the shards' notices and acknowledgements flow; returns what each released."""
    released = [[] for _ in agreements]
    for _ in range(rounds):
        for i, a in enumerate(agreements):
            released[i] += a.poll()
        if not any(a.waiting for a in agreements):
            for i, a in enumerate(agreements):
                released[i] += a.poll()
            break
        __import__("time").sleep(0.005)
    return released


@pytest.mark.parametrize("out_of_core", [False, True], ids=["in-ram", "out-of-core"])
@pytest.mark.parametrize("bad_step", [1, 2], ids=["middle", "last"])
def test_nonfinite_step_is_skipped_by_every_shard(tmp_path, bad_step, out_of_core):
    """The non-finite chunk is in shard 1's range, and shard 0 has already committed the step: shard 1
    holds its NONFINITE answers until shard 0 acknowledged the notice; shard 0 commits the step again
    as skipped (durably: killed then, it resumes so). Both end on the reference's bits, also when the
    non-finite step is the last. Out of core: each shard's state is several times its RAM budget."""
    init = small_model()
    budget = BUDGET
    if out_of_core:
        init["w"] = np.random.default_rng(2).standard_normal((400, 100 * SCALE)).astype(np.float32) * 0.1
        budget = 4 * 32 * state.RECORD.itemsize  # the minimum: 4 pages of 32 chunks
    lay = optim.layout_of(init)
    cfg = OptimizerConfig()
    bad_chunk = lay.n_chunks - 3
    offset = bad_chunk * K - lay.offsets["w"] + 1
    gf = with_nonfinite(reference.synthetic_grads(12), 1, bad_step, "w", offset)
    cores = open_shards(tmp_path, init, cfg, 2, budget=budget)
    if out_of_core:
        assert all(2 * c.store.n_chunks * state.RECORD.itemsize >= 8 * budget and c.store.pager for c in cores)
    port = 40000 + random.Random().randrange(20000)
    agree = [shards.NonfiniteAgreement(JOB, ["127.0.0.2"], cores[0].skip_step, bind="127.0.0.1", port=port),
             shards.NonfiniteAgreement(JOB, ["127.0.0.1"], cores[1].skip_step, bind="127.0.0.2", port=port)]
    try:
        params = initial_fp16(init)
        for step in range(bad_step + 1):
            sums, nf = step_sums(lay, gf, N, step, params)
            got = {}
            for core, a in zip(cores, agree):  # shard 0 finishes (and commits) before shard 1 starts
                lo, hi = core.store.chunks
                for i in range(lo, hi + 1, 5):
                    part = np.arange(i, min(i + 5, hi + 1))
                    hdr, vals = a.outgoing(*core.handle(sum_headers(JOB, step, part, lay, S, N, nf), sums[part]))
                    for h, v in zip(hdr, vals):
                        got.setdefault(int(h["chunk"]), (int(h["flags"]), v.copy()))
            if step == bad_step:
                assert len(got) < lay.n_chunks  # the workers cannot finish the step yet
                assert cores[0].committed == step and not cores[0].store.last_skipped
                held = agree[1].held[step]
                assert held and all(h["flags"] & Flag.NONFINITE for h, _ in held.values())
                assert not any(f & Flag.NONFINITE for c, (f, _) in got.items() if c < cores[1].lo)
                released = pump(agree)
                assert released[1] and not agree[1].held and step in agree[1].agreed
                assert cores[0].store.last_skipped and cores[0].store.updates == step
                # Durable: shard 0 killed after acknowledging resumes with the step skipped.
                cores[0] = node_core.NodeCore(state.Store(tmp_path / "shard0", budget), JOB, N, S)
                agree[0].skip = cores[0].skip_step
                assert cores[0].store.last_skipped and cores[0].store.updates == step
                for hdr, vals in released[1]:
                    for h, v in zip(hdr, vals):
                        got[int(h["chunk"])] = (int(h["flags"]), v)
                # Shard 0's answers of the step now say NONFINITE and carry the state before it.
                hdr, _ = cores[0].handle(sum_headers(JOB, step, [0], lay, S, N), sums[[0]])
                assert hdr["flags"][0] & Flag.NONFINITE
            params = as_worker(lay, got, params)
    finally:
        for a in agree:
            a.close()
    ref = reference.train(init, gf, N, bad_step + 1, cfg)
    assert ref.nonfinite == [(bad_step, bad_chunk)]
    assert same_bits(params, ref.params)
    assert same_bits(exports(tmp_path, cores, lay), ref.master)
    assert [c.store.updates for c in cores] == [bad_step, bad_step]


@pytest.mark.parametrize("m", [1, 3], ids=["whole-model", "shard-of-3"])
def test_recent_params_after_runs_of_consecutive_chunks(tmp_path, m):
    """recent_params holds each slot's last applied chunk, and only that, after batches of
    consecutive chunks shorter than the slots, longer, and wrapping them, alone or after a batch
    of scattered chunks, in a node of the whole model and in a shard whose range starts within
    the slots' cycle (chunks 14..28 of 44, 8 slots)."""
    init = small_model()
    lay = optim.layout_of(init)
    sums, nf = step_sums(lay, reference.synthetic_grads(3), N, 0, initial_fp16(init))
    for scattered in (False, True):
        core = open_shards(tmp_path / str(scattered), init, OptimizerConfig(), m)[m // 2]
        lo, hi = core.store.chunks
        runs = [range(lo, lo + 3), range(lo + 3, lo + S + 6), range(lo + S + 6, hi + 1)]
        if scattered:
            runs = [[lo + S + 2, lo + S], range(lo, lo + 3), range(lo + 3, lo + S), range(lo + S + 3, hi + 1)]
        check_recent_params(core, lay, runs, sums, nf)


def check_recent_params(core, lay, runs, sums, nf):
    sent, last = {}, {}
    for part in runs:
        part = np.array(part)
        hdr, vals = core.handle(sum_headers(JOB, 0, part, lay, S, N, nf), sums[part])
        sent.update((int(h["chunk"]), v.copy()) for h, v in zip(hdr, vals))
        last.update((int(c) % S, int(c)) for c in sorted(part))
        hdr, vals = core.recent_params()
        assert sorted(int(h["chunk"]) for h in hdr) == sorted(last.values()), part
        assert all(int(h["slot"]) == int(h["chunk"]) % S and h["step"] == 0 for h in hdr)
        for h, v in zip(hdr, vals):
            assert np.array_equal(v.view(np.uint16), sent[int(h["chunk"])].view(np.uint16))
