"""The training workload of `make run`: a numpy MLP on the 8x8 digits (`model="mlp"`),
or a torch model of `mindp.torch.models` (`cnn`, `gpt`; needs the torch extra).

The description and the data (shipped in `mindp/data/`, taken from scikit-learn; no download) are
mindp.dataset's, which the torch models build on too; this module dispatches a torch model to
mindp.torch.tasks, imported only then, so that the MLP never imports torch. Everything is a
pure function of (config, worker, step, fp16 parameters), so the workers in Mininet and the
single-process reference trainer compute the very same gradient bits:

- the data split and each worker's shard come from the seed;
- worker w at step s trains on a batch drawn from its own shard by a
  generator seeded with (seed, w, s), an epoch-free fixed schedule;
- forward and backward are float32 numpy on the fp16 parameters the worker holds.

Run numpy single-threaded (OPENBLAS_NUM_THREADS=1) where bits must agree: a
BLAS that splits a product differently may round differently.
"""
from __future__ import annotations

import os
import threading

import numpy as np

from mindp.dataset import (DATA_DIR, MODELS, Dataset, WorkloadConfig, WorkloadError, batch_indices, load_dataset,
                           load_digits, shard)

N_FEATURES = 64  # 8x8 images
N_CLASSES = 10
PARAM_NAMES = ("w1", "b1", "w2", "b2")
F32 = np.float32

#: The workload's API: its description and data (mindp.dataset) with the models' functions below.
__all__ = ["DATA_DIR", "MODELS", "Dataset", "WorkloadConfig", "WorkloadError", "batch_indices", "load_dataset",
           "load_digits", "shard", "init_params", "evaluate", "gradients", "grad_fn", "model_eval", "describe",
           "reference_train", "THREADED_REFERENCE"]


def init_params(cfg: WorkloadConfig) -> dict[str, np.ndarray]:
    """Float32 initial parameters from the seed: He-initialised for the MLP (zero biases);
    a torch model's own initialisation, in the chunk order of mindp.torch.layout_of."""
    if cfg.model != "mlp":
        from mindp.torch import tasks
        return tasks.init_params(cfg)
    rng = np.random.default_rng([cfg.seed, 0x1417])
    return {
        "w1": (rng.standard_normal((N_FEATURES, cfg.hidden), dtype=F32) * F32(np.sqrt(2.0 / N_FEATURES))),
        "b1": np.zeros(cfg.hidden, dtype=F32),
        "w2": (rng.standard_normal((cfg.hidden, N_CLASSES), dtype=F32) * F32(np.sqrt(2.0 / cfg.hidden))),
        "b2": np.zeros(N_CLASSES, dtype=F32),
    }


def _f32(params: dict) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(params[n], dtype=F32) for n in PARAM_NAMES)


def _forward(params: dict, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w1, b1, w2, b2 = _f32(params)
    h = np.maximum(x @ w1 + b1, F32(0))
    return h, h @ w2 + b2


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def evaluate(params: dict, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of the parameters on (x, y)."""
    _, logits = _forward(params, x)
    logp = _log_softmax(logits)
    loss = float(-logp[np.arange(len(y)), y].mean())
    return loss, float((logits.argmax(axis=1) == y).mean())


def loss_and_gradients(params: dict, x: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
    """The mean cross-entropy on (x, y) and its float32 gradients."""
    w1, b1, w2, b2 = _f32(params)
    h, logits = _forward(params, x)
    logp = _log_softmax(logits)
    loss = float(-logp[np.arange(len(y)), y].mean())
    d = np.exp(logp)
    d[np.arange(len(y)), y] -= F32(1)
    d /= F32(len(y))
    dh = (d @ w2.T) * (h > 0)
    return loss, {"w1": x.T @ dh, "b1": dh.sum(axis=0), "w2": h.T @ d, "b2": d.sum(axis=0)}


def gradients(params: dict, x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Float32 gradients of the mean cross-entropy on (x, y)."""
    return loss_and_gradients(params, x, y)[1]


def loss_grad_fn(cfg: WorkloadConfig):
    """The mlp's step: fn(worker, step, fp16 params) -> (the loss on the worker's batch, its
    float32 gradients)."""
    data = load_dataset(cfg.seed, cfg.test_fraction)

    def fn(worker: int, step: int, params: dict) -> tuple[float, dict[str, np.ndarray]]:
        idx = batch_indices(cfg, worker, step, len(data.y_train))
        return loss_and_gradients(params, data.x_train[idx], data.y_train[idx])

    return fn


def grad_fn(cfg: WorkloadConfig, scale_of=None):
    """grad_fn(worker, step, fp16 params) -> named float32 gradients (host_agent.reference's form).
    scale_of(step): the loss scale of that step (torch models with loss scaling)."""
    if cfg.model != "mlp":
        from mindp.torch import tasks
        return tasks.grad_fn(cfg, scale_of)
    fn = loss_grad_fn(cfg)
    return lambda worker, step, params: fn(worker, step, params)[1]


def model_eval(cfg: WorkloadConfig):
    """eval(params) -> (loss on the training data, accuracy on the test data) of any model."""
    if cfg.model != "mlp":
        from mindp.torch import tasks
        return tasks.evaluator(cfg)
    data = load_dataset(cfg.seed, cfg.test_fraction)
    return lambda params: (evaluate(params, data.x_train, data.y_train)[0], evaluate(params, data.x_test, data.y_test)[1])


def describe(cfg: WorkloadConfig, init: dict[str, np.ndarray]) -> str:
    """The model's name and parameter count, e.g. 'gpt (1.3M parameters)'."""
    n = sum(int(a.size) for a in init.values())
    count = f"{n / 1e6:.1f}M" if n >= 1_000_000 else f"{n / 1e3:.1f}k" if n >= 10_000 else str(n)
    return f"{cfg.model} ({count} parameters)"


#: Parameters from which reference_train computes a step's workers in threads.
THREADED_REFERENCE = 100_000


def reference_train(cfg: WorkloadConfig, init: dict[str, np.ndarray], steps: int, opt, on_step=None):
    """host_agent.reference.train of this workload, with the loss scale the workers hold at each step
    (on_step(done) after each step)."""
    from host_agent import optim, reference
    from mindp.lossscale import LossScaler

    # A large torch model's workers in threads of their own (each its own module: 1.6x for the
    # gpt on 2 busy cores); a small model's steps cost less than handing them over (cnn: 0.5x).
    size = sum(int(a.size) for a in init.values())
    threads = 1 if cfg.model == "mlp" or size < THREADED_REFERENCE else min(cfg.n_workers, len(os.sched_getaffinity(0)))
    if not cfg.loss_scale:
        fns = [grad_fn(cfg) for _ in range(threads)]
        return reference.train(init, fns[0], cfg.n_workers, steps, opt, optim.layout_of(init), more_grad_fns=fns[1:],
                               on_step=on_step)
    scaler = LossScaler(cfg.loss_scale, growth_interval=cfg.scale_growth_interval)
    skipped: set[int] = set()
    at = [0]
    lock = threading.Lock()  # the workers' threads ask for a step's scale at once

    def scale_of(step: int) -> float:
        with lock:
            while at[0] < step:  # steps before `step` are complete: their outcome is known
                scaler.update(at[0] in skipped)
                at[0] += 1
            return scaler.scale

    fns = [grad_fn(cfg, scale_of) for _ in range(threads)]
    return reference.train(init, fns[0], cfg.n_workers, steps, opt, optim.layout_of(init),
                           on_nonfinite=lambda step, chunk: skipped.add(step), more_grad_fns=fns[1:], on_step=on_step)
