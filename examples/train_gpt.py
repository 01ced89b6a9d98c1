"""The byte-level GPT of `make run MODEL=gpt` (mindp/torch/models.py) on scikit-learn's dataset
descriptions, data-parallel under torchrun: train_gpt_ddp.py with torch DDP, train_gpt.py through
mindp (the diff: docs/RUN.md). Run them with

    torchrun --nproc-per-node 2 examples/train_gpt_ddp.py --steps 6
    make run SCRIPT=examples/train_gpt.py ARGS='--steps 6'
"""
import argparse
import json
import os

import numpy as np
import torch
import torch.nn.functional as F

import mindp.torch
from mindp.torch.models import Gpt, GptSpec, corpus, text_batch

SPEC = GptSpec()


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return Gpt(SPEC)


def batch(rank: int, step: int, size: int = 8):
    """Rank `rank`'s batch at `step`: seeded windows of the text."""
    text = corpus()
    starts = np.random.default_rng([rank, step]).integers(0, len(text) - SPEC.ctx - 1, size)
    return text_batch(text, starts, SPEC.ctx)


def loss_fn(model, x, y):
    out = model(x)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def optimizer(model, steps: int, lr: float):
    # GPT recipes' two groups: matrices decay, biases and norms (1-D) do not.
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}], lr=lr)
    return opt, torch.optim.lr_scheduler.SequentialLR(opt, [
        torch.optim.lr_scheduler.LinearLR(opt, 0.1, 1.0, 1),
        torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.1, steps - 1)], [1])


def parse(argv=None):
    global SPEC
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--gpt", type=json.loads, default={}, help='model size, e.g. {"d": 64, "layers": 2}')
    p.add_argument("--out", help="final weights (rank 0)")
    args = p.parse_args(argv)
    SPEC = GptSpec(**args.gpt)
    return args


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
