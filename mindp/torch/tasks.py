"""The torch models as workloads (mindp.dataset's config): initial parameters, each worker's
batch at each step, the reference's gradient function and the evaluation."""
from __future__ import annotations

import numpy as np
import torch

from mindp import dataset

from . import models
from .parallel import layout_arrays

EVAL_WINDOWS = 16  # gpt: fixed windows the loss and accuracy are measured on


def model(cfg: dataset.WorkloadConfig) -> torch.nn.Module:
    models.deterministic()
    return models.build(cfg.model, cfg.model_args, cfg.seed)


def init_params(cfg: dataset.WorkloadConfig) -> dict[str, np.ndarray]:
    return layout_arrays(model(cfg))


def _ctx(cfg: dataset.WorkloadConfig) -> int:
    return models.GptSpec(**cfg.model_args).ctx


def batch(cfg: dataset.WorkloadConfig, worker: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Worker `worker`'s batch at `step`, from its own shard of the training data."""
    rng = np.random.default_rng([cfg.seed, worker, step])
    if cfg.model == "cnn":
        data = dataset.load_dataset(cfg.seed, cfg.test_fraction)
        idx = dataset.batch_indices(cfg, worker, step, len(data.y_train))
        return torch.from_numpy(data.x_train[idx].reshape(-1, 1, 8, 8)), torch.from_numpy(data.y_train[idx])
    train, _ = models.text_split(cfg.test_fraction)
    ctx = _ctx(cfg)
    if not 0 <= worker < cfg.n_workers:
        raise dataset.WorkloadError(f"worker {worker} outside 0..{cfg.n_workers - 1}")
    shard = len(train) // cfg.n_workers  # contiguous shards of the text
    lo = worker * shard
    if shard <= ctx + 1:
        raise dataset.WorkloadError(f"text shard of {shard} bytes is too short for a context of {ctx}")
    return models.text_batch(train, lo + rng.integers(0, shard - ctx - 1, size=cfg.batch), ctx)


def grad_fn(cfg: dataset.WorkloadConfig, scale_of=None):
    """(worker, step, fp16 params) -> float32 gradients, computed exactly as mindp.torch.DataParallel
    does on a worker: the same module, batch, loss, scaled backward and unscaling."""
    net = model(cfg)

    def fn(worker: int, step: int, params: dict) -> dict[str, torch.Tensor]:
        models.load_params(net, params)
        net.zero_grad(set_to_none=True)
        x, y = batch(cfg, worker, step)
        loss = models.loss_of(cfg.model, net, x, y)
        scale = scale_of(step) if scale_of else None
        (loss * scale if scale else loss).backward()
        out = {}
        for name, p in net.named_parameters():
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            out[name] = g / scale if scale else g
        return out

    return fn


def evaluator(cfg: dataset.WorkloadConfig):
    """eval(params) -> (training loss, test accuracy); gpt: on fixed windows, accuracy of the next byte."""
    net = model(cfg)
    if cfg.model == "cnn":
        data = dataset.load_dataset(cfg.seed, cfg.test_fraction)
        sets = [(torch.from_numpy(x.reshape(-1, 1, 8, 8)), torch.from_numpy(y))
                for x, y in ((data.x_train, data.y_train), (data.x_test, data.y_test))]
    else:
        ctx = _ctx(cfg)
        rng = np.random.default_rng([cfg.seed, 0xE7A1])
        sets = [models.text_batch(text, rng.integers(0, len(text) - ctx - 1, size=EVAL_WINDOWS), ctx)
                for text in models.text_split(cfg.test_fraction)]

    def evaluate(params: dict) -> tuple[float, float]:
        models.load_params(net, params)
        with torch.no_grad():
            (xt, yt), (xe, ye) = sets
            loss = float(models.loss_of(cfg.model, net, xt, yt))
            acc = float((net(xe).argmax(-1) == ye).float().mean())
        return loss, acc

    return evaluate
