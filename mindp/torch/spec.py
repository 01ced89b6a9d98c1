"""A script's torch optimizer and lr scheduler -> the optimizer node's OptimizerConfig, and back.

The node runs AdamW or SGD itself (host_agent.optim), so the script's torch objects only describe
it: their hyper-parameters are read here, once; anything the node cannot reproduce is refused in
one line rather than silently trained differently.
"""
from __future__ import annotations

import torch
from torch.optim import lr_scheduler as L

from host_agent.digest import MAX_TOLD_LRS
from host_agent.lr import Rates
from host_agent.optim import ConfigError, OptimizerConfig, ParamGroup, Schedule


def value(x):
    """A hyper-parameter as torch's optimizer reads it, in plain Python: a tensor's number (torch takes
    tensors for lr, betas and the rest, as capturable and compiled optimizers hold them), a tuple's each."""
    if isinstance(x, (tuple, list)):
        return tuple(value(e) for e in x)
    return x.item() if isinstance(x, torch.Tensor) else x


def _names(module: torch.nn.Module | None) -> dict[int, str]:
    """id(parameter) -> its name in the layout, for the trained parameters of `module`."""
    return {id(p): n for n, p in (module.named_parameters() if module is not None else ()) if p.requires_grad}


def _later_trained(opt: torch.optim.Optimizer, names: dict[int, str]) -> list[int]:
    """The torch parameter groups after the first that hold a trained parameter (in `names`)."""
    return [i for i, g in enumerate(opt.param_groups) if i and any(id(p) in names for p in g["params"])]


def told_groups(opt: torch.optim.Optimizer, module: torch.nn.Module | None) -> list[int]:
    """The torch parameter groups whose lrs a follow_lr rank tells the node, in the order of the
    node's groups (_groups with apart): the first, then each later one holding a trained parameter."""
    return [0] + _later_trained(opt, _names(module))


def _groups(opt: torch.optim.Optimizer, names: dict[int, str],
            apart: bool = False) -> tuple[dict, tuple[ParamGroup, ...]]:
    """The first parameter group (the node's hyper-parameters) and the groups after it that train
    at another lr or weight decay (`apart`, follow_lr: every one holding a trained parameter, as
    told_groups lists them, since the script may set its lr apart later); groups may differ in
    nothing else. `names`: id(parameter) -> its name in the layout (trained parameters only)."""
    g0 = opt.param_groups[0]
    own = ("params", "lr", "initial_lr", "weight_decay")  # what a group may set for itself
    for i, g in enumerate(opt.param_groups):
        for flag in ("amsgrad", "maximize", "nesterov"):
            if g.get(flag):
                raise ConfigError(f"{type(opt).__name__}({flag}=True) is not supported by the optimizer node")
        # (keys torch's optimizer does not read, a script's own such as lr_scale, may differ)
        differ = [k for k in g if k in opt.defaults and k not in own and value(g[k]) != value(g0.get(k))]
        if differ:
            raise ConfigError(f"parameter group {i} of {type(opt).__name__} differs from the first in "
                              f"{', '.join(differ)}: the node runs one optimizer, whose groups may differ in "
                              "lr and weight_decay only")
    later = [opt.param_groups[i] for i in _later_trained(opt, names)]
    return g0, tuple(ParamGroup(tuple(names[id(p)] for p in g["params"] if id(p) in names), base_lr(g),
                                float(value(g["weight_decay"]))) for g in later
                     if apart or (base_lr(g), value(g["weight_decay"])) != (base_lr(g0), value(g0["weight_decay"])))


def base_lr(g: dict) -> float:
    return float(value(g.get("initial_lr", g["lr"])))  # a scheduler already moved group['lr']: its base is initial_lr


def schedule_of(sched) -> Schedule:
    """A torch scheduler built as host_agent.lr's table says -> its Schedule; others are refused."""
    if sched is None:
        return Schedule()
    parts, warmup, start = [sched], 0, 0.1
    if isinstance(sched, L.SequentialLR):
        parts = sched._schedulers
        if len(parts) != 2 or not isinstance(parts[0], L.LinearLR) or parts[0].end_factor != 1.0 \
                or sched._milestones != [parts[0].total_iters]:
            raise ConfigError("SequentialLR is supported as [LinearLR(opt, start, 1.0, W), a decay of the table] "
                              "with milestones=[W] (docs/TORCH.md)")
        warmup, start = parts[0].total_iters, float(parts[0].start_factor)
        parts = parts[1:]
    (decay,) = parts
    if isinstance(decay, L.StepLR):
        return Schedule("step", step_size=decay.step_size, gamma=float(decay.gamma), warmup=warmup, warmup_start=start)
    if isinstance(decay, L.MultiStepLR):
        return Schedule("multistep", milestones=tuple(sorted(decay.milestones.elements())), gamma=float(decay.gamma),
                        warmup=warmup, warmup_start=start)
    if isinstance(decay, L.ExponentialLR):
        return Schedule("exponential", gamma=float(decay.gamma), warmup=warmup, warmup_start=start)
    if isinstance(decay, L.CosineAnnealingWarmRestarts):
        return Schedule("restarts", t_0=decay.T_0, t_mult=decay.T_mult, eta_min=float(decay.eta_min), warmup=warmup,
                        warmup_start=start)
    if isinstance(decay, L.CosineAnnealingLR):
        return Schedule("cosine", total=warmup + decay.T_max, warmup=warmup, warmup_start=start,
                        eta_min=float(decay.eta_min))
    if isinstance(decay, L.LinearLR) and decay.start_factor == 1.0:
        return Schedule("linear", total=warmup + decay.total_iters, warmup=warmup, warmup_start=start,
                        end_factor=float(decay.end_factor))
    raise ConfigError(f"lr scheduler {type(decay).__name__} is not supported: use StepLR, MultiStepLR, ExponentialLR, "
                      "CosineAnnealingLR, CosineAnnealingWarmRestarts or LinearLR(start_factor=1.0), optionally "
                      "after a LinearLR warmup in SequentialLR; or init(..., follow_lr=True) (docs/TORCH.md)")


def optimizer_config(opt: torch.optim.Optimizer, sched=None, module: torch.nn.Module | None = None,
                     follow_lr: bool = False) -> OptimizerConfig:
    """torch.optim.AdamW, Adam without weight decay, or SGD (+ scheduler) -> the node's optimizer.
    `module`: the model, whose trained parameters' names tell the node which tensors the optimizer's
    other groups hold. `follow_lr`: the "script" schedule (the ranks tell each step's lrs, a group
    each), whatever `sched` is."""
    names = _names(module)
    if len(opt.param_groups) > 1 and module is None:
        raise ConfigError("several parameter groups need the module, to name their parameters")
    g, groups = _groups(opt, names, apart=follow_lr)
    if follow_lr and len(groups) + 1 > MAX_TOLD_LRS:
        raise ConfigError(f"follow_lr: {len(groups) + 1} parameter groups, and a step tells the node at most "
                          f"{MAX_TOLD_LRS} lrs")
    schedule = Schedule("script") if follow_lr else schedule_of(sched)
    decay = next((d for d in (value(gr["weight_decay"]) for gr in opt.param_groups) if d), 0)
    if type(opt) is torch.optim.Adam and not g.get("decoupled_weight_decay") and decay:
        raise ConfigError(f"Adam(weight_decay={decay}) adds the decay to the gradient (L2), which the node does not "
                          "run: use AdamW (decoupled decay) or Adam with weight_decay=0")
    if type(opt) in (torch.optim.AdamW, torch.optim.Adam):  # Adam without decay: AdamW's update at weight_decay 0
        return OptimizerConfig("adamw", lr=base_lr(g), betas=value(g["betas"]), eps=value(g["eps"]),
                               weight_decay=value(g["weight_decay"]), schedule=schedule, groups=groups)
    if type(opt) is torch.optim.SGD:
        if value(g.get("dampening")):
            raise ConfigError("SGD(dampening != 0) is not supported by the optimizer node")
        return OptimizerConfig("sgd", lr=base_lr(g), momentum=value(g["momentum"]),
                               weight_decay=value(g["weight_decay"]), schedule=schedule, groups=groups)
    raise ConfigError(f"optimizer {type(opt).__name__} is not supported: the node runs torch.optim.AdamW, Adam "
                      "(weight_decay=0) or SGD")


def groups_of(cfg: OptimizerConfig, names: list[str]) -> list[tuple[float, float, list[str]]]:
    """`names` split into torch parameter groups, (lr, weight_decay, names): the first group's
    hyper-parameters first, then each of cfg.groups'; each group's names in the order of `names`."""
    of = {n: cfg.hyper_of(n) for n in names}
    keys = dict.fromkeys([(cfg.lr, cfg.weight_decay), *of.values()])
    return [(lr, wd, [n for n in names if of[n] == (lr, wd)]) for lr, wd in keys]


def torch_optimizer(cfg: OptimizerConfig, named: list[tuple[str, torch.nn.Parameter]], step: int) -> torch.optim.Optimizer:
    """The torch optimizer `cfg` maps to, over the `named` parameters (a group per lr and weight
    decay, as groups_of orders them), each group at its lr of `step` (a checkpoint's optimizer; the
    "script" schedule's lrs are the script's: its base lr)."""
    by_name = dict(named)
    follows = cfg.schedule.kind == "script"
    groups = [{"params": [by_name[n] for n in ns], "lr": lr if follows else Rates(lr, cfg.schedule).at(step),
               "weight_decay": wd} for lr, wd, ns in groups_of(cfg, list(by_name))]
    groups = [g for g in groups if g["params"]]
    if cfg.kind == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
