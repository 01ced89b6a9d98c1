"""PyTorch through mindp: the network replaces allreduce and the optimizer.

    from mindp.torch import DataParallel, layout_of, layout_arrays
    model = build_model()                                  # any torch.nn.Module
    agent = WorkerAgent(cfg, layout_of(model), sock, initial=...)
    dp = DataParallel(model, agent, scaler=LossScaler())   # scaler optional
    for x, y in batches:
        dp.step(loss_fn(model(x), y))                      # backward, push, parameters back in the model

During `loss.backward()` a hook on each parameter puts its gradient into the
step as soon as autograd has accumulated it, and the worker agent sends its
chunks at once, so the push overlaps the rest of the backward pass. The chunk
space lists the parameters in reverse registration order, the order in which a
backward pass produces them, so the chunks become ready roughly in chunk order
(the agent still sends any ready chunk whose slot is free). There is no local
optimizer: the optimizer node owns AdamW/SGD state; the fp16 parameters that
come back are written into the module before `step` returns. Torch is an
optional dependency (`make torch` installs its CPU build). A torchrun script joins a job with
`mindp.torch.init` (mindp/torch/script.py, docs/TORCH.md).

Names load on first use: `python -m mindp.torch.launch`, which only starts each rank, must not
import torch.
"""
from __future__ import annotations

import importlib

_LAZY = {"DataParallel": "parallel", "layout_of": "parallel", "layout_arrays": "parallel", "init": "script", "log": "script"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
