"""The training workload: disjoint shards, fixed batches, correct gradients, and it learns."""
import numpy as np
import pytest

from host_agent import optim, reference
from mindp import workload as wl


@pytest.fixture(scope="module")
def cfg():
    return wl.WorkloadConfig(n_workers=3, seed=5, hidden=16, batch=8)


def test_digits_split_is_seeded_and_disjoint():
    a, b = wl.load_dataset(1), wl.load_dataset(2)
    assert len(a.y_train) + len(a.y_test) == 1797
    assert a.x_train.dtype == np.float32 and 0.0 <= a.x_train.min() and a.x_train.max() <= 1.0
    assert not np.array_equal(a.y_train[:50], b.y_train[:50])
    # No test image is also a training image (the digits set has no exact duplicates across the split).
    train = {r.tobytes() for r in a.x_train}
    assert sum(r.tobytes() in train for r in a.x_test) < 5


def test_the_shipped_digits_are_the_8x8_digits_and_read_only():
    data, target = wl.load_digits()
    assert data.shape == (1797, 64) and data.dtype == np.float64 and target.shape == (1797,)
    assert np.array_equal(data, np.round(data)) and data.min() == 0 and data.max() == 16
    assert sorted(set(target.tolist())) == list(range(10)) and np.bincount(target).min() > 170
    assert wl.load_digits()[0] is data  # read once per process
    with pytest.raises(ValueError):
        data[0, 0] = 1


def test_shards_are_disjoint_and_cover_the_training_set(cfg):
    n = 100
    shards = [wl.shard(cfg, w, n) for w in range(cfg.n_workers)]
    joined = np.concatenate(shards)
    assert len(joined) == n and len(set(joined.tolist())) == n
    with pytest.raises(wl.WorkloadError):
        wl.shard(cfg, 3, n)


def test_batches_are_fixed_per_worker_and_step_and_stay_in_the_shard(cfg):
    n = 1000
    b = wl.batch_indices(cfg, 1, 7, n)
    assert np.array_equal(b, wl.batch_indices(cfg, 1, 7, n))
    assert not np.array_equal(b, wl.batch_indices(cfg, 1, 8, n))
    assert len(b) == cfg.batch and len(set(b.tolist())) == cfg.batch
    assert set(b.tolist()) <= set(wl.shard(cfg, 1, n).tolist())


def test_gradients_match_finite_differences(cfg):
    rng = np.random.default_rng(0)
    params = wl.init_params(cfg)
    params["b1"] = rng.standard_normal(cfg.hidden).astype(np.float32) * 0.1  # keep ReLUs away from 0
    data = wl.load_dataset(cfg.seed)
    x, y = data.x_train[:10], data.y_train[:10]
    grads = wl.gradients(params, x, y)
    p64 = {n: a.astype(np.float64) for n, a in params.items()}

    def loss(p):
        h = np.maximum(x @ p["w1"] + p["b1"], 0)
        z = h @ p["w2"] + p["b2"]
        z = z - z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return -logp[np.arange(len(y)), y].mean()

    for name in wl.PARAM_NAMES:
        for idx in [tuple(rng.integers(0, s) for s in params[name].shape) for _ in range(4)]:
            eps = 1e-6
            hi = {k: v.copy() for k, v in p64.items()}
            lo = {k: v.copy() for k, v in p64.items()}
            hi[name][idx] += eps
            lo[name][idx] -= eps
            numeric = (loss(hi) - loss(lo)) / (2 * eps)
            assert abs(grads[name][idx] - numeric) < 1e-4, (name, idx)


def test_grad_fn_is_deterministic_on_fp16_params(cfg):
    fn = wl.grad_fn(cfg)
    init = wl.init_params(cfg)
    p16 = {n: a.astype(np.float16) for n, a in init.items()}
    g1, g2 = fn(2, 3, p16), fn(2, 3, p16)
    assert all(np.array_equal(g1[n], g2[n]) for n in wl.PARAM_NAMES)
    assert not np.array_equal(fn(1, 3, p16)["w2"], g1["w2"])


def test_a_workers_step_gives_its_batch_loss_and_the_same_gradients(cfg):
    p16 = {n: a.astype(np.float16) for n, a in wl.init_params(cfg).items()}
    data = wl.load_dataset(cfg.seed, cfg.test_fraction)
    idx = wl.batch_indices(cfg, 1, 4, len(data.y_train))
    loss, g = wl.loss_grad_fn(cfg)(1, 4, p16)
    assert loss == wl.evaluate(p16, data.x_train[idx], data.y_train[idx])[0]
    assert all(np.array_equal(g[n], wl.grad_fn(cfg)(1, 4, p16)[n]) for n in wl.PARAM_NAMES)


def test_reference_training_on_the_workload_learns():
    cfg = wl.WorkloadConfig(n_workers=2, seed=0)
    init = wl.init_params(cfg)
    data = wl.load_dataset(cfg.seed)
    res = reference.train(init, wl.grad_fn(cfg), 2, 30, optim.OptimizerConfig(lr=0.01), optim.layout_of(init))
    p0 = {n: a.astype(np.float16) for n, a in init.items()}
    loss0, acc0 = wl.evaluate(p0, data.x_train, data.y_train)
    loss1, _ = wl.evaluate(res.params, data.x_train, data.y_train)
    _, acc1 = wl.evaluate(res.params, data.x_test, data.y_test)
    assert loss1 < 0.4 * loss0
    assert acc1 > 0.8 > acc0


def test_init_is_seeded_and_config_round_trips(tmp_path):
    a = wl.WorkloadConfig(n_workers=2, seed=1)
    assert all(np.array_equal(x, y) for x, y in zip(wl.init_params(a).values(), wl.init_params(a).values()))
    b = wl.WorkloadConfig(n_workers=2, seed=2)
    assert not np.array_equal(wl.init_params(a)["w1"], wl.init_params(b)["w1"])
    a.dump(tmp_path / "w.json")
    assert wl.WorkloadConfig.load(tmp_path / "w.json") == a
    with pytest.raises(wl.WorkloadError):
        wl.WorkloadConfig(n_workers=0)
    with pytest.raises(wl.WorkloadError):
        wl.WorkloadConfig.from_dict({"n_workers": 2, "colour": "red"})
    with pytest.raises(wl.WorkloadError):
        wl.WorkloadConfig.load(tmp_path / "missing.json")


def test_a_reference_with_more_gradient_functions_computes_workers_in_threads_to_the_same_bits():
    """more_grad_fns: each copy computes its own share of a step's workers in a thread of its own
    (make run's check of a gpt took as long again as training): the same bits."""
    import threading

    cfg = wl.WorkloadConfig(n_workers=3, seed=0)
    init = wl.init_params(cfg)
    opt = optim.OptimizerConfig(lr=0.01)
    calls: list[tuple[int, int, str]] = []  # (copy, worker, thread)

    def copy(i):
        fn = wl.grad_fn(cfg)

        def grad(w, step, params):
            calls.append((i, w, threading.current_thread().name))
            return fn(w, step, params)
        return grad

    one = reference.train(init, wl.grad_fn(cfg), 3, 6, opt, optim.layout_of(init))
    fns = [copy(0), copy(1)]
    two = reference.train(init, fns[0], 3, 6, opt, optim.layout_of(init), more_grad_fns=fns[1:])
    assert all(np.array_equal(one.master[n], two.master[n]) for n in one.master)
    assert sorted({(i, w) for i, w, _ in calls}) == [(0, 0), (0, 2), (1, 1)]  # each copy its own workers
    assert {t for i, _, t in calls if i == 0} == {threading.current_thread().name}  # the caller's, and
    assert len({t for i, _, t in calls if i == 1}) == 1 and len({t for _, _, t in calls}) == 2  # another's
