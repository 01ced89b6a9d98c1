"""A script's torch optimizer and lr scheduler -> the optimizer node's OptimizerConfig, and back.

The node runs AdamW or SGD itself (host_agent.optim), so the script's torch objects only describe
it: their hyper-parameters are read here, once; anything the node cannot reproduce is refused in
one line rather than silently trained differently.
"""
from __future__ import annotations

import torch
from torch.optim import lr_scheduler as L

from host_agent.optim import ConfigError, OptimizerConfig, Schedule


def _value(x):
    return x.item() if isinstance(x, torch.Tensor) else x


def _groups(opt: torch.optim.Optimizer, names: dict[int, str]) -> tuple[dict, tuple[tuple[str, float], ...]]:
    """The first parameter group (its hyper-parameters are the node's) and the weight decay of each
    tensor of the other groups where it differs: groups may differ in weight_decay only (a GPT
    recipe's decay / no-decay split); `names`: id(parameter) -> its name in the layout."""
    g0 = opt.param_groups[0]
    for i, g in enumerate(opt.param_groups):
        for flag in ("amsgrad", "maximize", "nesterov"):
            if g.get(flag):
                raise ConfigError(f"{type(opt).__name__}({flag}=True) is not supported by the optimizer node")
        differ = [k for k in g if k not in ("params", "weight_decay") and _value(g[k]) != _value(g0.get(k))]
        if differ:
            raise ConfigError(f"parameter group {i} of {type(opt).__name__} differs from the first in "
                              f"{', '.join(differ)}: the node applies one set of hyper-parameters to every "
                              "group (groups may differ in weight_decay only)")
    decays = tuple((names[id(p)], float(g["weight_decay"])) for g in opt.param_groups[1:] for p in g["params"]
                   if id(p) in names and g["weight_decay"] != g0["weight_decay"])
    return g0, decays


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


def optimizer_config(opt: torch.optim.Optimizer, sched=None, module: torch.nn.Module | None = None) -> OptimizerConfig:
    """torch.optim.AdamW, Adam without weight decay, or SGD (+ scheduler) -> the node's optimizer.
    `module`: the model, by whose trained parameters' names the weight decay of the optimizer's
    other groups is told to the node."""
    names = {id(p): n for n, p in (module.named_parameters() if module is not None else ()) if p.requires_grad}
    if len(opt.param_groups) > 1 and module is None:
        raise ConfigError("several parameter groups need the module, to name their parameters")
    g, decays = _groups(opt, names)
    if type(opt) is torch.optim.Adam and not g.get("decoupled_weight_decay") \
            and any(gr["weight_decay"] for gr in opt.param_groups):
        raise ConfigError(f"Adam(weight_decay={g['weight_decay'] or decays[0][1]}) adds the decay to the gradient (L2), "
                          "which the node does not run: use AdamW (decoupled decay) or Adam with weight_decay=0")
    if type(opt) in (torch.optim.AdamW, torch.optim.Adam):  # Adam without decay: AdamW's update at weight_decay 0
        return OptimizerConfig("adamw", lr=_lr(g), betas=tuple(g["betas"]), eps=g["eps"],
                               weight_decay=g["weight_decay"], schedule=schedule_of(sched), param_decay=decays)
    if type(opt) is torch.optim.SGD:
        if g.get("dampening"):
            raise ConfigError("SGD(dampening != 0) is not supported by the optimizer node")
        return OptimizerConfig("sgd", lr=_lr(g), momentum=g["momentum"], weight_decay=g["weight_decay"],
                               schedule=schedule_of(sched), param_decay=decays)
    raise ConfigError(f"optimizer {type(opt).__name__} is not supported: the node runs torch.optim.AdamW, Adam "
                      "(weight_decay=0) or SGD")


def groups_of(cfg: OptimizerConfig, names: list[str]) -> list[tuple[float, list[str]]]:
    """`names` split into torch parameter groups by weight decay: cfg.weight_decay's first, then each
    other decay as the names first meet it; each group's names in the order of `names`."""
    decay = dict(cfg.param_decay)
    order = list(dict.fromkeys([cfg.weight_decay] + [decay.get(n, cfg.weight_decay) for n in names]))
    return [(d, [n for n in names if decay.get(n, cfg.weight_decay) == d]) for d in order]


def torch_optimizer(cfg: OptimizerConfig, named: list[tuple[str, torch.nn.Parameter]], lr: float) -> torch.optim.Optimizer:
    """The torch optimizer `cfg` maps to, over the `named` parameters (one group per weight decay,
    as groups_of orders them), at `lr` (a checkpoint's optimizer)."""
    by_name = dict(named)
    groups = [{"params": [by_name[n] for n in ns], "weight_decay": d} for d, ns in groups_of(cfg, list(by_name))]
    groups = [g for g in groups if g["params"]]
    if cfg.kind == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(groups, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
