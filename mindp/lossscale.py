"""Dynamic loss scaling as torch.amp.GradScaler does it, without torch.

The loss is multiplied by `scale` before backward, so small gradients of a
reduced-precision backward do not flush to zero; the gradients are divided by
it again before they are rounded to fp16 for the wire. A step in which any
worker's gradient was non-finite changes no parameter anywhere (the optimizer
node skips the whole step, docs/PROTOCOL.md "Non-finite steps"); every worker
learns it from the NONFINITE flag and backs its scale off by the same factor,
so all workers (and the reference trainer) hold the same scale at every step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class LossScaler:
    scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    growth_tracker: int = 0  # finite steps since the last change

    def __post_init__(self):
        if not (self.scale > 0 and math.isfinite(self.scale)):
            raise ValueError(f"loss scale must be positive and finite, got {self.scale}")
        if self.growth_factor <= 1.0 or not 0.0 < self.backoff_factor < 1.0 or self.growth_interval < 1:
            raise ValueError("need growth_factor > 1, 0 < backoff_factor < 1, growth_interval >= 1")

    def update(self, found_nonfinite: bool) -> None:
        """After a step: back off on a non-finite step, grow after growth_interval finite ones."""
        if found_nonfinite:
            self.scale *= self.backoff_factor
            self.growth_tracker = 0
            return
        self.growth_tracker += 1
        if self.growth_tracker == self.growth_interval:
            self.scale *= self.growth_factor
            self.growth_tracker = 0
