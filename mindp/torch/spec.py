"""A script's torch optimizer and lr scheduler -> the optimizer node's OptimizerConfig, and back.

The node runs AdamW or SGD itself (host_agent.optim), so the script's torch objects only describe
it: their hyper-parameters are read here, once; anything the node cannot reproduce is refused in
one line rather than silently trained differently.
"""
from __future__ import annotations

import torch
from torch.optim import lr_scheduler as L

from host_agent.optim import ConfigError, OptimizerConfig, Schedule


def _group(opt: torch.optim.Optimizer) -> dict:
    if len(opt.param_groups) != 1:
        raise ConfigError(f"{type(opt).__name__} has {len(opt.param_groups)} parameter groups: the node "
                          "applies one set of hyper-parameters (use one group)")
    g = opt.param_groups[0]
    for flag in ("amsgrad", "maximize", "nesterov"):
        if g.get(flag):
            raise ConfigError(f"{type(opt).__name__}({flag}=True) is not supported by the optimizer node")
    return g


def _lr(g: dict) -> float:
    lr = g.get("initial_lr", g["lr"])  # a scheduler already moved group['lr']: its base is initial_lr
    return float(lr.item() if isinstance(lr, torch.Tensor) else lr)


def schedule_of(sched) -> Schedule:
    """A torch scheduler built as host_agent.lr's table says -> its Schedule; others are refused."""
    if sched is None:
        return Schedule()
    if isinstance(sched, L.StepLR):
        return Schedule("step", step_size=sched.step_size, gamma=float(sched.gamma))
    parts, warmup, start = [sched], 0, 0.1
    if isinstance(sched, L.SequentialLR):
        parts = sched._schedulers
        if len(parts) != 2 or not isinstance(parts[0], L.LinearLR) or parts[0].end_factor != 1.0 \
                or sched._milestones != [parts[0].total_iters]:
            raise ConfigError("SequentialLR is supported as [LinearLR(opt, start, 1.0, W), CosineAnnealingLR or "
                              "LinearLR decay] with milestones=[W] (docs/TORCH.md)")
        warmup, start = parts[0].total_iters, float(parts[0].start_factor)
        parts = parts[1:]
    (decay,) = parts
    if isinstance(decay, L.CosineAnnealingLR):
        return Schedule("cosine", total=warmup + decay.T_max, warmup=warmup, warmup_start=start,
                        eta_min=float(decay.eta_min))
    if isinstance(decay, L.LinearLR) and decay.start_factor == 1.0:
        return Schedule("linear", total=warmup + decay.total_iters, warmup=warmup, warmup_start=start,
                        end_factor=float(decay.end_factor))
    raise ConfigError(f"lr scheduler {type(decay).__name__} is not supported: use StepLR, CosineAnnealingLR or "
                      "LinearLR(start_factor=1.0), optionally after a LinearLR warmup in SequentialLR (docs/TORCH.md)")


def optimizer_config(opt: torch.optim.Optimizer, sched=None) -> OptimizerConfig:
    """torch.optim.AdamW, Adam without weight decay, or SGD (+ scheduler) -> the node's optimizer."""
    g = _group(opt)
    if type(opt) is torch.optim.Adam and g["weight_decay"] and not g.get("decoupled_weight_decay"):
        raise ConfigError(f"Adam(weight_decay={g['weight_decay']}) adds the decay to the gradient (L2), which the node "
                          "does not run: use AdamW (decoupled decay) or Adam with weight_decay=0")
    if type(opt) in (torch.optim.AdamW, torch.optim.Adam):  # Adam without decay: AdamW's update at weight_decay 0
        return OptimizerConfig("adamw", lr=_lr(g), betas=tuple(g["betas"]), eps=g["eps"],
                               weight_decay=g["weight_decay"], schedule=schedule_of(sched))
    if type(opt) is torch.optim.SGD:
        if g.get("dampening"):
            raise ConfigError("SGD(dampening != 0) is not supported by the optimizer node")
        return OptimizerConfig("sgd", lr=_lr(g), momentum=g["momentum"], weight_decay=g["weight_decay"],
                               schedule=schedule_of(sched))
    raise ConfigError(f"optimizer {type(opt).__name__} is not supported: the node runs torch.optim.AdamW, Adam "
                      "(weight_decay=0) or SGD")


def torch_optimizer(cfg: OptimizerConfig, params, lr: float) -> torch.optim.Optimizer:
    """The torch optimizer `cfg` maps to, over `params`, at `lr` (a checkpoint's optimizer)."""
    if cfg.kind == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
