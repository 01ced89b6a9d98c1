"""The shared optimizer math and the reference trainer."""
import numpy as np
import pytest

from host_agent import optim, reference
from host_agent.optim import ConfigError, OptimizerConfig
from mindp.fixedpoint import exact_sum
from mindp.protocol import K

from .helpers import same_bits, small_model, with_nonfinite


def adamw_float64(p, g, steps, lr, b1, b2, eps, wd):
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t in range(1, steps + 1):
        p = p * (1 - lr * wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = p - lr / (1 - b1**t) * m / (np.sqrt(v) / np.sqrt(1 - b2**t) + eps)
    return p


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_chunkwise_in_any_order_equals_whole_array(kind):
    cfg = OptimizerConfig(kind=kind, lr=3e-3, weight_decay=0.05)
    rng = np.random.default_rng(0)
    n = 64
    master = rng.standard_normal(n * K).astype(np.float32)
    whole = [master.copy(), np.zeros_like(master), np.zeros_like(master)]
    parts = [master.copy(), np.zeros_like(master), np.zeros_like(master)]
    for step in range(5):
        g = rng.standard_normal(n * K).astype(np.float32)
        optim.apply(cfg, *whole, g, step)
        for c in rng.permutation(n):
            sl = slice(c * K, (c + 1) * K)
            optim.apply(cfg, *(a[sl] for a in parts), g[sl], step)
    for a, b in zip(whole, parts):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_adamw_follows_the_textbook_formula():
    cfg = OptimizerConfig(lr=1e-2, weight_decay=0.1)
    rng = np.random.default_rng(1)
    p0 = rng.standard_normal(K).astype(np.float32)
    g = rng.standard_normal(K).astype(np.float32)
    state = [p0.copy(), np.zeros(K, np.float32), np.zeros(K, np.float32)]
    for step in range(10):
        optim.apply(cfg, *state, g, step)
    expect = adamw_float64(p0.astype(np.float64), g.astype(np.float64), 10, 1e-2, 0.9, 0.999, 1e-8, 0.1)
    np.testing.assert_allclose(state[0], expect, rtol=1e-5, atol=1e-6)
    assert not np.array_equal(state[0], p0)


def test_sgd_momentum_follows_torch_formula():
    cfg = OptimizerConfig(kind="sgd", lr=0.1, momentum=0.5, weight_decay=0.0)
    p = np.ones(K, np.float32)
    m = np.zeros(K, np.float32)
    v = np.zeros(K, np.float32)
    g = np.full(K, 2.0, np.float32)
    optim.apply(cfg, p, m, v, g, 0)  # buf = 2, p = 1 - 0.2
    optim.apply(cfg, p, m, v, g, 1)  # buf = 3, p = 0.8 - 0.3
    assert np.allclose(p, 0.5) and np.allclose(m, 3.0)


def test_mean_gradient_is_exact_scaled_sum():
    grads = [np.array([1.5, -2.0, 6e-8, 65504], np.float16), np.array([0.25, 1.0, 6e-8, 65504], np.float16)]
    total, _ = exact_sum(grads)
    mean = optim.mean_gradient(total, 2)
    expect = (grads[0].astype(np.float64) + grads[1].astype(np.float64)) / 2
    assert mean.dtype == np.float32 and np.array_equal(mean, expect.astype(np.float32))


@pytest.mark.parametrize("bad", [dict(kind="adam"), dict(lr=0), dict(betas=(1.0, 0.9)), dict(eps=0)])
def test_bad_optimizer_config_is_a_clear_error(bad):
    with pytest.raises(ConfigError):
        OptimizerConfig(**bad)


def test_seeded_init_is_deterministic_and_seed_dependent():
    lay = optim.layout_of(small_model())
    a, b, c = optim.seed_params(lay, 7), optim.seed_params(lay, 7), optim.seed_params(lay, 8)
    assert same_bits(a, b) and not same_bits(a, c)


def test_reference_equals_hand_rolled_loop():
    init = small_model()
    lay = optim.layout_of(init)
    cfg = OptimizerConfig()
    gf = reference.synthetic_grads(2)
    res = reference.train(init, gf, 3, 3, cfg)
    master = lay.flatten(init, dtype=np.float32)
    m, v = np.zeros_like(master), np.zeros_like(master)
    for step in range(3):
        params = lay.unflatten(master.astype(np.float16))
        grads = [lay.flatten({k: a.astype(np.float16) for k, a in gf(w, step, params).items()}) for w in range(3)]
        total, _ = exact_sum(grads)
        optim.apply(cfg, master, m, v, optim.mean_gradient(total, 3), step)
    assert same_bits(res.params, lay.unflatten(master.astype(np.float16)))
    assert not same_bits(res.params, lay.unflatten(lay.flatten(init, dtype=np.float32).astype(np.float16)))


def test_reference_skips_the_whole_step_of_a_nonfinite_chunk_and_counts_no_update():
    init = small_model()
    lay = optim.layout_of(init)
    cfg = OptimizerConfig()
    gf = reference.synthetic_grads(2)
    seen = []
    bad = reference.train(init, with_nonfinite(gf, 1, 1, "w", 5), 2, 3, cfg, on_nonfinite=lambda s, c: seen.append((s, c)),
                          on_step=lambda done: seen.append(done))
    chunk = lay.offsets["w"] // K
    assert seen == [1, (1, chunk), 2, 3] and bad.nonfinite == [(1, chunk)]  # on_step after each step, skipped too
    # Step 1 changed nothing, and step 2 is the second update (Adam's t = 2): the same as training
    # on step 0's and step 2's gradients alone.
    skip_1 = lambda w, s, p: gf(w, 2 if s == 1 else s, p)  # noqa: E731
    two = reference.train(init, skip_1, 2, 2, cfg)
    assert same_bits(bad.master, two.master) and same_bits(bad.params, two.params)
    assert not same_bits(bad.master, reference.train(init, gf, 2, 3, cfg).master)
