"""The single-process reference a torchrun script defines, for `make run SCRIPT=` and the tests.

A script may define `mindp_reference(argv) -> dict` with
    model():                 the model, built as every rank builds it
    batch(rank, step):       (inputs, targets) of that rank at that step
    loss(model, x, y):       the loss the script backpropagates
    optimizer(model):        (torch optimizer, scheduler or None), as the script makes them
    steps:                   the step count for these arguments
The reference then trains `world` workers in one process exactly as the network does
(host_agent.reference: fp16 gradients summed exactly, the node's optimizer and schedule), so the
network run's final weights must equal its bits. A script without it gets a loss curve only.

Each rank draws random numbers in its own process (dropout, a random crop), so the reference keeps
each rank's own state of torch's, numpy's and Python's generators: it starts where model() left
them, as a rank's process does once it built its model, a rank's batch and loss draw from it step
after step, and it starts afresh at each step where that rank's process started again (a resumed
run, a restarted rank: `starts`).
"""
from __future__ import annotations

import bisect
import contextlib
import importlib.util
import pathlib
import random
import sys
from typing import Callable, Iterable

import numpy as np
import torch

from host_agent import reference

from . import models
from .parallel import layout_arrays, trained
from .spec import optimizer_config


class RankStreams:
    """Each rank's generator states (torch's CPU, numpy's global, Python's), all taken from the
    generators as they are now; `starts[rank]`: steps at which that rank's states begin again."""

    def __init__(self, world: int, starts: dict[int, Iterable[int]] | None = None):
        self.fresh = _states()
        self.states = [self.fresh] * world
        self.starts = {r: set(s) for r, s in (starts or {}).items()}

    @contextlib.contextmanager
    def of(self, rank: int, step: int):
        """The generators are rank `rank`'s at `step` inside the block; its draws are kept for it."""
        _restore(self.fresh if step in self.starts.get(rank, ()) else self.states[rank])
        try:
            yield
        finally:
            self.states[rank] = _states()


def _states() -> tuple:
    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def _restore(states: tuple) -> None:
    torch.set_rng_state(states[0])
    np.random.set_state(states[1])
    random.setstate(states[2])


class NoReference(LookupError):
    """The script defines no mindp_reference."""


def load_script(path: str | pathlib.Path):
    """The script as a module (its `if __name__ == "__main__"` part does not run)."""
    path = pathlib.Path(path)
    spec = importlib.util.spec_from_file_location(f"mindp_script_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(path.parent))
    return mod


def script_reference(path: str | pathlib.Path, world: int, argv: list[str] | dict[int, list[str]],
                     steps: int | None = None, starts: dict[int, Iterable[int]] | None = None,
                     told_lrs: dict[int, tuple[float, ...]] | None = None,
                     on_step: Callable[[int], None] | None = None) -> reference.Result:
    """Train the script's reference for `world` ranks: its step count, or its first `steps` (a run
    stopped early is compared with the steps it did). `argv`: the script's arguments, or step -> its
    arguments from that step on (a resumed run given other ARGS): each step takes the batches and
    loss of its own, the model those of step 0, the step count and optimizer the last (the run
    refused a model or optimizer they change). `starts[rank]`: the steps at which that rank's
    process started after the first (RankStreams); `told_lrs`: a script that follows its own lr
    (init(follow_lr=True)): each step's lrs, a parameter group each, as its ranks told the node;
    on_step(done) after each step.
    NoReference if it defines none (a script without one is not imported: its training may run at
    import)."""
    if "def mindp_reference" not in pathlib.Path(path).read_text(errors="replace"):
        raise NoReference(f"{path} defines no mindp_reference(argv)")
    mod = load_script(path)
    if not hasattr(mod, "mindp_reference"):
        raise NoReference(f"{path} defines no mindp_reference(argv)")
    segments = sorted((argv if isinstance(argv, dict) else {0: argv}).items())
    if segments[0][0] != 0:
        raise ValueError(f"the arguments of step 0 are missing (steps {[s for s, _ in segments]})")
    firsts = [s for s, _ in segments]
    parts_of = [mod.mindp_reference(list(a)) for _, a in segments]
    parts = parts_of[-1]
    models.deterministic()
    net = parts_of[0]["model"]()
    streams = RankStreams(world, starts)
    init = layout_arrays(net)
    opt, sched = parts["optimizer"](net)
    cfg = optimizer_config(opt, sched, net, follow_lr=told_lrs is not None)

    def grad_fn(rank: int, step: int, params: dict) -> dict:
        models.load_params(net, params)
        net.zero_grad(set_to_none=True)
        own = parts_of[bisect.bisect_right(firsts, step) - 1]
        with streams.of(rank, step):
            own["loss"](net, *own["batch"](rank, step)).backward()
        return {n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in trained(net)}

    total = int(parts["steps"])
    return reference.train(init, grad_fn, world, total if steps is None else min(steps, total), cfg,
                           told_lrs=told_lrs, on_step=on_step)
