"""A script's parameter groups at the node: chunks holding several groups' tensors are updated
element by element at each tensor's group's lr and weight decay, bit for bit as the reference
trains the whole flat arrays."""
import numpy as np
import pytest

from host_agent import fused, lr, optim, reference
from host_agent.groups import GroupPlan
from host_agent.optim import ConfigError, OptimizerConfig, ParamGroup, Schedule
from mindp.layout import Layout, TensorSpec
from mindp.protocol import K

KERNELS = ["numpy"] + ([] if fused.NUMPY_ONLY else ["portable"] + (["avx2"] if fused.host_has_avx2() else []))

# Sizes that put group changes inside chunks, on chunk boundaries, and several within one chunk.
SIZES = {"emb": 3 * K + 5, "ln0.w": 7, "ln0.b": 7, "attn.w": 2 * K - 14, "attn.b": K // 2, "mlp.w": K // 2,
         "mlp.b": 3, "head.w": 4 * K + 1, "ln_f.b": 9}
NO_DECAY = ("ln0.w", "ln0.b", "attn.b", "ln_f.b")
HEAD = ("mlp.b",)  # a group of its own: 10x the lr, no decay
SCHED = Schedule("cosine", total=10, warmup=2)


def layout() -> Layout:
    return Layout([TensorSpec(n, (s,)) for n, s in SIZES.items()])


def cfg_of(kind: str) -> OptimizerConfig:
    return OptimizerConfig(kind=kind, lr=0.01, weight_decay=0.1, schedule=SCHED,
                           groups=(ParamGroup(NO_DECAY, 0.01, 0.0), ParamGroup(HEAD, 0.1, 0.0)))


def group_of(name: str) -> tuple:
    return (0.01, 0.0) if name in NO_DECAY else (0.1, 0.0) if name in HEAD else (0.01, 0.1)


def test_runs_follow_the_tensors_and_merge_neighbours():
    lay, cfg = layout(), cfg_of("adamw")
    runs = cfg.group_runs(lay)
    assert [r[0] for r in runs][0] == 0 and runs[-1][1] == lay.n_chunks * K
    assert all(a[1] == b[0] for a, b in zip(runs, runs[1:]))
    # ln0.w + ln0.b merged; attn.b | mlp.w | mlp.b (the head's group) | head.w | ln_f.b
    assert [(r[2].lr, r[2].weight_decay) for r in runs] == [
        (0.01, 0.1), (0.01, 0.0), (0.01, 0.1), (0.01, 0.0), (0.01, 0.1), (0.1, 0.0), (0.01, 0.1), (0.01, 0.0)]
    for a, b, c, g in runs:
        names = [n for n in SIZES if lay.offsets[n] < b and lay.offsets[n] + SIZES[n] > a]
        assert {group_of(n) for n in names} == {(c.lr, c.weight_decay)} and c.groups == () and c.schedule == SCHED
        assert cfg.group_of(names[0]) == g
    plain = OptimizerConfig(weight_decay=0.1)
    assert plain.group_runs(lay) == [(0, lay.n_chunks * K, plain, 0)]


def test_a_script_schedule_keeps_every_group_apart_though_two_share_their_hyper_parameters():
    """Under the "script" schedule the script may set each group's lr apart later (a layer-wise
    scale): groups the same as another at init are runs of their own, each with its group index."""
    lay = layout()
    same = (ParamGroup(NO_DECAY, 0.01, 0.0), ParamGroup(HEAD, 0.01, 0.0))
    merged = OptimizerConfig(lr=0.01, weight_decay=0.1, groups=same).group_runs(lay)
    apart = OptimizerConfig(lr=0.01, weight_decay=0.1, schedule=Schedule("script"), groups=same).group_runs(lay)
    assert len({id(c) for *_, c, _ in merged}) == 2  # otherwise the two share one config
    for a, b, c, g in apart:
        names = [n for n in SIZES if lay.offsets[n] < b and lay.offsets[n] + SIZES[n] > a]
        assert {0 if n not in NO_DECAY + HEAD else 1 if n in NO_DECAY else 2 for n in names} == {g}
    assert len({id(c) for *_, c, _ in apart}) == 3  # one config a group, those of equal values too


def test_pieces_cut_every_chunk_range_where_the_group_changes():
    lay, cfg = layout(), cfg_of("adamw")
    plan = GroupPlan(cfg, lay)
    want = np.concatenate([np.full(b - a, c.lr * 7 + c.weight_decay) for a, b, c, _ in cfg.group_runs(lay)])
    for lo in range(lay.n_chunks):
        for hi in range(lo + 1, lay.n_chunks + 1):
            pieces = plan.pieces(lo, hi)
            assert pieces[0][0] == lo and pieces[-1][1] == hi
            assert all(p[1] == q[0] for p, q in zip(pieces, pieces[1:]))
            for a, b, segs in pieces:
                got = np.concatenate([np.full(e1 - e0, c.lr * 7 + c.weight_decay) for e0, e1, c in segs])
                assert len(got) == (b - a) * K and np.array_equal(got, want[a * K : b * K])
                assert len(segs) == 1 or b == a + 1  # a chunk of groups goes alone


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_a_batch_of_any_chunks_equals_the_reference_per_element(kind, kernel):
    lay, cfg = layout(), cfg_of(kind)
    n, rng = lay.n_chunks, np.random.default_rng(5)
    src = (rng.standard_normal((n, cfg.lanes, K)) * 0.1).astype(np.float32)
    src[:, -1] = np.abs(src[:, -1])  # v >= 0
    sums = rng.integers(-(1 << 30), 1 << 30, size=(n, K))
    master, m = src[:, 0].reshape(-1).copy(), src[:, 1].reshape(-1).copy()
    v = src[:, 2].reshape(-1).copy() if kind == "adamw" else None
    g = optim.mean_gradient(sums.reshape(-1), 3)
    for a, b, c, _ in cfg.group_runs(lay):  # step 1 of the schedule: each group's lr from its own base
        optim.apply(c, master[a:b], m[a:b], None if v is None else v[a:b], g[a:b], 4, lr.Rates(c.lr, SCHED).at(1))
    plan = GroupPlan(cfg, lay)
    for lo, hi in [(0, n), (1, 2), (2, 6), (n - 3, n)]:
        dst, out = np.empty_like(src[lo:hi]), np.empty((hi - lo, K), np.float16)
        plan.update(lo, src[lo:hi], dst, sums[lo:hi], np.full(hi - lo, 3.0), 4, out, 1, kernel)
        assert np.array_equal(dst[:, 0].reshape(-1).view(np.uint32), master[lo * K : hi * K].view(np.uint32))
        assert np.array_equal(dst[:, 1].reshape(-1).view(np.uint32), m[lo * K : hi * K].view(np.uint32))
        assert np.array_equal(out.reshape(-1), master[lo * K : hi * K].astype(np.float16))
    inplace, out = src.copy(), np.empty((n, K), np.float16)
    plan.update(0, inplace, inplace, sums, 3, 4, out, 1, kernel)  # src is dst
    assert np.array_equal(inplace[:, 0].reshape(-1).view(np.uint32), master.view(np.uint32))
    one = OptimizerConfig(kind=kind, lr=0.01, weight_decay=0.1, schedule=SCHED)  # without the groups: they differ
    plain = np.empty_like(src)
    GroupPlan(one, lay).update(0, src, plain, sums, 3, 4, np.empty((n, K), np.float16), 1, kernel)
    for name in ("ln0.w", "mlp.b"):
        off = lay.offsets[name]
        assert not np.array_equal(plain[:, 0].reshape(-1)[off : off + SIZES[name]], master[off : off + SIZES[name]])


def test_the_reference_trains_each_group_at_its_lr_and_decay():
    """reference.train with groups equals training the same arrays at each group's lr and decay
    alone, tensor by tensor (the tensors are independent under an elementwise optimizer)."""
    lay = layout()
    rng = np.random.default_rng(0)
    init = {n: (rng.standard_normal(s) * 0.1).astype(np.float32) for n, s in SIZES.items()}
    gf = reference.synthetic_grads(3)
    got = reference.train(init, gf, 2, 4, cfg_of("adamw"), lay)
    alone = {g: reference.train(init, gf, 2, 4, OptimizerConfig(lr=g[0], weight_decay=g[1], schedule=SCHED), lay)
             for g in {group_of(n) for n in SIZES}}
    for n in SIZES:
        assert np.array_equal(got.master[n].view(np.uint32), alone[group_of(n)].master[n].view(np.uint32)), n


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_the_reference_taken_a_block_at_a_time_is_the_same_bits(monkeypatch, kind):
    """The reference sums and updates a block of elements at a time (its memory): blocks of any size,
    across the groups' boundaries, give the bits of one pass, a skipped non-finite step included."""
    lay = layout()
    rng = np.random.default_rng(1)
    init = {n: (rng.standard_normal(s) * 0.1).astype(np.float32) for n, s in SIZES.items()}
    synthetic = reference.synthetic_grads(5)

    def gf(worker, step, params):
        g = synthetic(worker, step, params)
        if (worker, step) == (1, 2):
            g["attn.w"][3] = np.inf
        return g

    whole = reference.train(init, gf, 3, 5, cfg_of(kind), lay)
    assert [s for s, _ in whole.nonfinite] == [2]
    for block in (1, K + 3, 2 * K):
        monkeypatch.setattr(reference, "SUM_BLOCK", block)
        got = reference.train(init, gf, 3, 5, cfg_of(kind), lay)
        assert got.nonfinite == whole.nonfinite
        for n in SIZES:
            assert np.array_equal(got.master[n].view(np.uint32), whole.master[n].view(np.uint32)), (block, n)


@pytest.mark.parametrize("bad, says", [
    ([{"params": ["a"], "lr": 0.1, "weight_decay": -1.0}], "weight_decay must be a finite number >= 0, got -1.0"),
    ([{"params": ["a"], "lr": 0.0, "weight_decay": 0.0}], "lr must be a finite number > 0, got 0.0"),
    ([{"params": ["a"], "lr": float("nan"), "weight_decay": 0.0}], "lr must be a finite number > 0"),
    ([{"params": ["a", "b"], "lr": 0.1, "weight_decay": 0.0}, {"params": ["b"], "lr": 0.2, "weight_decay": 0.0}],
     "parameter groups name a tensor twice: b"),
    ([{"params": "ab", "lr": 0.1, "weight_decay": 0.0}], "params must be tensor names"),
    ([{"params": ["a"], "lr": 0.1}], "malformed parameter group"),
    (["a"], "groups must be ParamGroups"),
])
def test_bad_groups_are_refused_in_one_line(bad, says):
    with pytest.raises(ConfigError) as exc:
        OptimizerConfig.from_dict({"groups": bad})
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_groups_survive_the_state_files_json_and_name_only_the_models_tensors():
    import json
    cfg = cfg_of("adamw")
    back = OptimizerConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg and back.groups == cfg.groups
    with pytest.raises(ConfigError, match="parameter groups name tensors the model lacks: nope"):
        OptimizerConfig(groups=(ParamGroup(("nope",), 0.1, 0.0),)).group_runs(layout())


@pytest.mark.parametrize("kernel", KERNELS)
def test_sgd_in_a_state_of_three_lanes_keeps_its_v_lane_in_chunks_of_two_groups(kernel):
    """A format-1 state holds v for SGD too, left as created: a chunk of two groups keeps it."""
    lay, cfg = layout(), cfg_of("sgd")
    n, rng = lay.n_chunks, np.random.default_rng(1)
    src = rng.standard_normal((n, 3, K)).astype(np.float32)
    dst = np.zeros_like(src)
    dst[:, 2] = src[:, 2]  # as both copies hold it
    GroupPlan(cfg, lay).update(0, src, dst, np.zeros((n, K), np.int64), 2, 0, np.empty((n, K), np.float16), 0, kernel)
    assert np.array_equal(dst[:, 2], src[:, 2])
