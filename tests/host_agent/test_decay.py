"""Weight decay per tensor (a script's parameter groups) at the node: chunks holding several
groups' tensors are updated element by element at each tensor's decay, bit for bit as the
reference trains the whole flat arrays."""
import numpy as np
import pytest

from host_agent import fused, optim, reference
from host_agent.decay import DecayPlan
from host_agent.optim import ConfigError, OptimizerConfig
from mindp.layout import Layout, TensorSpec
from mindp.protocol import K

KERNELS = ["numpy"] + ([] if fused.NUMPY_ONLY else ["portable"] + (["avx2"] if fused.host_has_avx2() else []))

# Sizes that put group changes inside chunks, on chunk boundaries, and several within one chunk.
SIZES = {"emb": 3 * K + 5, "ln0.w": 7, "ln0.b": 7, "attn.w": 2 * K - 14, "attn.b": K // 2, "mlp.w": K // 2,
         "mlp.b": 3, "head.w": 4 * K + 1, "ln_f.b": 9}
NO_DECAY = ("ln0.w", "ln0.b", "attn.b", "mlp.b", "ln_f.b")


def layout() -> Layout:
    return Layout([TensorSpec(n, (s,)) for n, s in SIZES.items()])


def cfg_of(kind: str) -> OptimizerConfig:
    return OptimizerConfig(kind=kind, lr=0.01, weight_decay=0.1, param_decay=tuple((n, 0.0) for n in NO_DECAY))


def test_runs_follow_the_tensors_and_merge_neighbours():
    lay, cfg = layout(), cfg_of("adamw")
    runs = cfg.decay_runs(lay)
    assert [r[0] for r in runs][0] == 0 and runs[-1][1] == lay.n_chunks * K
    assert all(a[1] == b[0] for a, b in zip(runs, runs[1:]))
    decays = [r[2].weight_decay for r in runs]
    assert decays == [0.1, 0.0, 0.1, 0.0, 0.1, 0.0, 0.1, 0.0]  # ln0.w+ln0.b merged; attn.b | mlp.w | mlp.b
    for a, b, c in runs:
        names = [n for n in SIZES if lay.offsets[n] < b and lay.offsets[n] + SIZES[n] > a]
        assert {(n in NO_DECAY) for n in names} == {c.weight_decay == 0.0}
    assert OptimizerConfig(weight_decay=0.1).decay_runs(lay) == [(0, lay.n_chunks * K, OptimizerConfig(weight_decay=0.1))]


def test_pieces_cut_every_chunk_range_where_the_group_changes():
    lay, cfg = layout(), cfg_of("adamw")
    plan = DecayPlan(cfg, lay)
    want = np.concatenate([np.full(b - a, c.weight_decay) for a, b, c in cfg.decay_runs(lay)])
    for lo in range(lay.n_chunks):
        for hi in range(lo + 1, lay.n_chunks + 1):
            pieces = plan.pieces(lo, hi)
            assert pieces[0][0] == lo and pieces[-1][1] == hi
            assert all(p[1] == q[0] for p, q in zip(pieces, pieces[1:]))
            for a, b, segs in pieces:
                got = np.concatenate([np.full(e1 - e0, c.weight_decay) for e0, e1, c in segs])
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
    for a, b, c in cfg.decay_runs(lay):
        optim.apply(c, master[a:b], m[a:b], None if v is None else v[a:b], g[a:b], 4, 0.01)
    plan = DecayPlan(cfg, lay)
    for lo, hi in [(0, n), (1, 2), (2, 6), (n - 3, n)]:
        dst, out = np.empty_like(src[lo:hi]), np.empty((hi - lo, K), np.float16)
        plan.update(lo, src[lo:hi], dst, sums[lo:hi], np.full(hi - lo, 3.0), 4, out, kernel, lr=0.01)
        assert np.array_equal(dst[:, 0].reshape(-1).view(np.uint32), master[lo * K : hi * K].view(np.uint32))
        assert np.array_equal(dst[:, 1].reshape(-1).view(np.uint32), m[lo * K : hi * K].view(np.uint32))
        assert np.array_equal(out.reshape(-1), master[lo * K : hi * K].astype(np.float16))
    inplace, out = src.copy(), np.empty((n, K), np.float16)
    plan.update(0, inplace, inplace, sums, 3, 4, out, kernel, lr=0.01)  # src is dst
    assert np.array_equal(inplace[:, 0].reshape(-1).view(np.uint32), master.view(np.uint32))
    one = OptimizerConfig(kind=kind, lr=0.01, weight_decay=0.1)  # without the groups, the no-decay tensors differ
    plain = np.empty_like(src)
    DecayPlan(one, lay).update(0, src, plain, sums, 3, 4, np.empty((n, K), np.float16), kernel, lr=0.01)
    off = lay.offsets["ln0.w"]
    assert not np.array_equal(plain[:, 0].reshape(-1)[off : off + 14], master[off : off + 14])


def test_the_reference_trains_each_group_at_its_decay():
    """reference.train with param_decay equals training the same arrays with the groups' decays
    tensor by tensor (the tensors are independent under an elementwise optimizer)."""
    lay = layout()
    rng = np.random.default_rng(0)
    init = {n: (rng.standard_normal(s) * 0.1).astype(np.float32) for n, s in SIZES.items()}
    gf = reference.synthetic_grads(3)
    cfg = cfg_of("adamw")
    got = reference.train(init, gf, 2, 3, cfg, lay)
    every = reference.train(init, gf, 2, 3, OptimizerConfig(kind="adamw", lr=0.01, weight_decay=0.1), lay)
    none = reference.train(init, gf, 2, 3, OptimizerConfig(kind="adamw", lr=0.01, weight_decay=0.0), lay)
    for n in SIZES:
        want = none if n in NO_DECAY else every
        assert np.array_equal(got.master[n].view(np.uint32), want.master[n].view(np.uint32)), n


@pytest.mark.parametrize("bad, says", [
    ({"param_decay": (("a", -1.0),)}, "finite number >= 0"),
    ({"param_decay": (("a", float("nan")),)}, "finite number >= 0"),
    ({"param_decay": (("a", 0.0), ("a", 0.1))}, "names a tensor twice"),
    ({"param_decay": ("a",)}, "(name, weight decay) pairs"),
])
def test_bad_groups_are_refused_in_one_line(bad, says):
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)")):
        OptimizerConfig(**bad)


def test_groups_survive_the_state_files_json_and_name_only_the_models_tensors():
    import json
    cfg = cfg_of("adamw")
    back = OptimizerConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg and back.param_decay == cfg.param_decay
    with pytest.raises(ConfigError, match="param_decay names tensors the model lacks: nope"):
        OptimizerConfig(param_decay=(("nope", 0.0),)).decay_runs(layout())


@pytest.mark.parametrize("kernel", KERNELS)
def test_sgd_in_a_state_of_three_lanes_keeps_its_v_lane_in_chunks_of_two_groups(kernel):
    """A format-1 state holds v for SGD too, left as created: a chunk of two groups keeps it."""
    lay, cfg = layout(), cfg_of("sgd")
    n, rng = lay.n_chunks, np.random.default_rng(1)
    src = rng.standard_normal((n, 3, K)).astype(np.float32)
    dst = np.zeros_like(src)
    dst[:, 2] = src[:, 2]  # as both copies hold it
    DecayPlan(cfg, lay).update(0, src, dst, np.zeros((n, K), np.int64), 2, 0, np.empty((n, K), np.float16), kernel,
                               lr=0.01)
    assert np.array_equal(dst[:, 2], src[:, 2])
