"""A small CNN on the 8x8 digits (scikit-learn's, shipped with mindp), data-parallel under torchrun:
train_cnn_ddp.py with torch DDP, train_cnn.py through mindp (the diff: docs/RUN.md). Run them with

    torchrun --nproc-per-node 2 examples/train_cnn_ddp.py --steps 20
    make run SCRIPT=examples/train_cnn.py ARGS='--steps 20'
"""
import argparse
import json
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import mindp.torch
from mindp.workload import load_digits


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 16, 10))


def batch(rank: int, step: int, size: int = 32):
    """Rank `rank`'s batch at `step`: a seeded sample of the digits."""
    data, target = load_digits()
    idx = np.random.default_rng([rank, step]).integers(0, len(target), size)
    images = data[idx].reshape(-1, 8, 8)
    return torch.tensor(images / 16, dtype=torch.float32).unsqueeze(1), torch.tensor(target[idx])


def loss_fn(model, x, y):
    return F.cross_entropy(model(x), y)


def optimizer(model, steps: int, lr: float):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    warmup = max(1, steps // 5)
    return opt, torch.optim.lr_scheduler.SequentialLR(opt, [
        torch.optim.lr_scheduler.LinearLR(opt, 0.1, 1.0, warmup),
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps - warmup)], [warmup])


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--out", help="final weights (rank 0)")
    return p.parse_args(argv)


def mindp_reference(argv):
    """The single-process run `make run SCRIPT=` compares the final weights with (docs/TORCH.md)."""
    args = parse(argv)
    return dict(model=build_model, batch=batch, loss=loss_fn, steps=args.steps,
                optimizer=lambda model: optimizer(model, args.steps, args.lr))


def main():
    args = parse()
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    model = build_model()
    opt, sched = optimizer(model, args.steps, args.lr)
    opt = mindp.torch.init(model, opt, sched)
    for step in range(opt.step_number, args.steps):  # RESUME: the node's next step, else 0
        x, y = batch(rank, step)
        opt.zero_grad()
        loss = loss_fn(model, x, y)
        loss.backward()
        opt.step()
        sched.step()
        if rank == 0:
            print(json.dumps({"step": step, "loss": loss.item()}), flush=True)
    if args.out and rank == 0:
        opt.save(args.out)


if __name__ == "__main__":
    main()
