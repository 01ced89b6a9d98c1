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
"""
from __future__ import annotations

import importlib.util
import pathlib
import sys

import torch

from host_agent import reference

from . import models
from .parallel import layout_arrays, trained
from .spec import optimizer_config


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


def script_reference(path: str | pathlib.Path, world: int, argv: list[str],
                     steps: int | None = None) -> reference.Result:
    """Train the script's reference for `world` ranks: its step count, or its first `steps` (a run
    stopped early is compared with the steps it did); NoReference if it defines none (a script
    without one is not imported: its training may run at import)."""
    if "def mindp_reference" not in pathlib.Path(path).read_text(errors="replace"):
        raise NoReference(f"{path} defines no mindp_reference(argv)")
    mod = load_script(path)
    if not hasattr(mod, "mindp_reference"):
        raise NoReference(f"{path} defines no mindp_reference(argv)")
    parts = mod.mindp_reference(list(argv))
    models.deterministic()
    net = parts["model"]()
    init = layout_arrays(net)
    opt, sched = parts["optimizer"](net)
    cfg = optimizer_config(opt, sched)

    def grad_fn(rank: int, step: int, params: dict) -> dict:
        models.load_params(net, params)
        net.zero_grad(set_to_none=True)
        parts["loss"](net, *parts["batch"](rank, step)).backward()
        return {n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in trained(net)}

    total = int(parts["steps"])
    return reference.train(init, grad_fn, world, total if steps is None else min(steps, total), cfg)
