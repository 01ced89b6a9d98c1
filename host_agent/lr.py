"""Learning-rate schedules the optimizer node runs per step, bit-identical to torch's.

Each schedule is the float64 arithmetic of the torch.optim.lr_scheduler composition named
beside it, replayed step by step exactly as torch's chainable `get_lr` computes it (the recursive
forms, which round differently from the closed forms the docs print), so a script that drives a
torch optimizer with that scheduler sees the very lr the node applies:

    constant                        (no scheduler)
    cosine(total, warmup, ...)      CosineAnnealingLR(opt, T_max=total, eta_min) without warmup, else
                                    SequentialLR([LinearLR(opt, warmup_start, 1.0, warmup),
                                                  CosineAnnealingLR(opt, total - warmup, eta_min)], [warmup])
    linear(total, warmup, ...)      the same with LinearLR(opt, 1.0, end_factor, total - warmup) decaying
    step, multistep, exponential,   StepLR(opt, step_size, gamma), MultiStepLR(opt, milestones, gamma),
    restarts                        ExponentialLR(opt, gamma), CosineAnnealingWarmRestarts(opt, t_0, t_mult,
                                    eta_min), each alone or after a LinearLR warmup as the cosine's (the
                                    decay counts its own steps from the warmup's end)
    script                          whatever sets the lr (by hand, any scheduler): each step's lr as the
                                    script's optimizer held it when the step began, told by the ranks
                                    (one a parameter group: a layer-wise scale stays the script's)

Step s's lr is the optimizer's lr after s calls of `scheduler.step()` (s = the training step,
0-based; a skipped non-finite step still advances it, as a torch loop calls scheduler.step() after
GradScaler skipped optimizer.step()). Torch-free: the node does not import torch.
"""
from __future__ import annotations

import math

from .optim import Schedule


class Rates:
    """lr of each step for one base lr and schedule, replayed once and kept (a float per step).
    The "script" schedule replays nothing: `told` holds each step's lrs, one a parameter group, as
    the script's ranks told them (the node's digest queries; the reference's rank logs), and this
    group's is told[step][group]."""

    def __init__(self, base: float, schedule: Schedule, told: dict[int, tuple[float, ...]] | None = None,
                 group: int = 0):
        self.base = float(base)
        self.s = schedule
        self.lrs: list[float] = []
        self.told = {} if told is None else told
        self.group = group
        self._restart = (0, 1)  # restarts: (T_cur, T_i) of CosineAnnealingWarmRestarts at the last step

    def at(self, step: int) -> float:
        if step < 0:
            raise ValueError(f"step {step} < 0")
        if self.s.kind == "script":
            lrs = self.told.get(step, ())
            if len(lrs) <= self.group:
                raise LookupError(f"the lr of step {step} (parameter group {self.group}) was not told")
            return lrs[self.group]
        while len(self.lrs) <= step:
            self.lrs.append(self._next(len(self.lrs)))
        return self.lrs[step]

    def _next(self, e: int) -> float:
        s, base = self.s, self.base
        prev = self.lrs[-1] if self.lrs else base
        if s.kind == "constant":
            return base
        w = s.warmup
        if w and e < w:  # LinearLR(start_factor, 1.0, warmup).get_lr
            if e == 0:
                return base * s.warmup_start
            return prev * (1.0 + (1.0 - s.warmup_start) / (w * s.warmup_start + (e - 1) * (1.0 - s.warmup_start)))
        k, tmax = e - w, s.total - w  # the decay scheduler's own epoch (and cosine/linear's length)
        if s.kind == "restarts":  # CosineAnnealingWarmRestarts.step (without an epoch) and its get_lr
            t_cur, t_i = (0, s.t_0) if k == 0 else (self._restart[0] + 1, self._restart[1])
            if t_cur >= t_i:
                t_cur, t_i = t_cur % t_i, t_i * s.t_mult
            self._restart = (t_cur, t_i)
            return s.eta_min + (base - s.eta_min) * (1 + math.cos(math.pi * t_cur / t_i)) / 2
        if k == 0 and w:  # SequentialLR starts the decay with step(0): its closed form at epoch 0
            if s.kind == "cosine":
                return s.eta_min + (base - s.eta_min) * (1 + math.cos(math.pi * 0 / tmax)) / 2
            if s.kind == "linear":
                return base * (1.0 + (s.end_factor - 1.0) * min(tmax, 0) / tmax)
            return base * s.gamma ** (s.milestones.count(0) if s.kind == "multistep" else 0)
        if s.kind == "step":  # StepLR.get_lr
            return prev * s.gamma if k and k % s.step_size == 0 else prev
        if s.kind == "multistep":  # MultiStepLR.get_lr: a milestone n times over decays by gamma ** n
            n = s.milestones.count(k)
            return prev * s.gamma ** n if n else prev
        if s.kind == "exponential":  # ExponentialLR.get_lr
            return prev * s.gamma if k else prev
        if k == 0:  # alone: the base lr
            return base
        if s.kind == "cosine":
            if (k - 1 - tmax) % (2 * tmax) == 0:  # CosineAnnealingLR.get_lr
                return prev + (base - s.eta_min) * (1 - math.cos(math.pi / tmax)) / 2
            return (1 + math.cos(math.pi * k / tmax)) / (1 + math.cos(math.pi * (k - 1) / tmax)) \
                * (prev - s.eta_min) + s.eta_min
        # linear decay: LinearLR(1.0, end_factor, tmax)
        if k > tmax:
            return prev
        return prev * (1.0 + (s.end_factor - 1.0) / (tmax * 1.0 + (k - 1) * (s.end_factor - 1.0)))
