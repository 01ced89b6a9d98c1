"""Checkpoints of the optimizer node's state as regular torch checkpoints, and back.

    {'model': state_dict (fp32 master weights; buffers from the module),
     'optimizer': the script's torch optimizer's state_dict (its groups as built, frozen parameters
                  it holds included) with the node's state: exp_avg, exp_avg_sq / momentum_buffer,
                  step = the node's update count. Without the script's optimizer: a torch.optim.AdamW/SGD
                  state_dict of a group per lr and weight decay (the script's first group's first),
                  each group's lr = its lr of the next step,
     'step': the last step trained (0-based; -1: none),
     'mindp': {'optimizer': OptimizerConfig.to_dict(), 'updates': ..., 'params': names in torch order,
               'state_index': the trained parameter's name at each index of 'optimizer' (None: frozen)}}

`torch.load` + `model.load_state_dict(ckpt['model'])` gives a model usable without mindp;
`restore` (or `python -m mindp.torch.checkpoint CKPT STATE_DIR [STATE_DIR ...]`) writes a fresh
node's state directory, or one per optimizer shard, that resumes bit-exactly where the checkpoint
was taken.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile

import numpy as np
import torch

from host_agent import optim, state
from host_agent.optim import ConfigError, OptimizerConfig
from mindp.layout import shard_ranges

from .parallel import trained
from .spec import groups_of, torch_optimizer

LANES = {"adamw": {state.M: "exp_avg", state.V: "exp_avg_sq"}, "sgd": {state.M: "momentum_buffer"}}


def save(state_dirs, path: str | pathlib.Path, module: torch.nn.Module,
         own: torch.optim.Optimizer | None = None) -> dict:
    """Write the committed state of `state_dirs` (the node's directory, or every shard's) as a torch
    checkpoint at `path` (atomically). own: the script's torch optimizer, whose structure
    'optimizer' takes, so that own.load_state_dict takes it whatever its groups' order."""
    commit, cfg, layout, records = state.read_committed(state_dirs)
    names = [n for n, _ in trained(module)]  # frozen parameters come with the module's state_dict
    if sorted(names) != sorted(s.name for s in layout.specs):
        raise ConfigError("the node's state holds another model than this module (parameter names differ)")
    lanes = {lane: records[:, lane, :].reshape(-1)[: layout.total] for lane in range(cfg.lanes)}

    def tensors(lane: int) -> dict[str, torch.Tensor]:
        return {s.name: torch.from_numpy(np.array(lanes[lane][layout.offsets[s.name]:][: s.size]).reshape(s.shape))
                for s in layout.specs}

    master = tensors(state.MASTER)
    # A tied parameter (nanoGPT's lm_head.weight is wte.weight) has a state_dict key per name and one
    # layout name: every key of it holds the master, or load_state_dict would end on the rank's copy.
    layout_name = {id(p): n for n, p in trained(module)}
    alias = {n: layout_name[id(p)] for n, p in module.named_parameters(remove_duplicate=False) if id(p) in layout_name}
    model = {k: (master[alias[k]] if k in alias else v.detach().clone()) for k, v in module.state_dict().items()}
    step, updates = int(commit["step"]), int(commit["updates"])
    per_lane = {key: tensors(lane) for lane, key in LANES[cfg.kind].items()}

    def state_of(n: str) -> dict:
        st = {key: t[n] for key, t in per_lane.items()}
        return {**st, "step": torch.tensor(float(updates))} if cfg.kind == "adamw" else st

    if own is not None:
        packed = own.state_dict()  # its groups and numbering; its state is empty (the node steps)
        index: list[str | None] = [None] * sum(len(g["params"]) for g in packed["param_groups"])
        for group, packed_group in zip(own.param_groups, packed["param_groups"]):
            for p, i in zip(group["params"], packed_group["params"]):
                index[i] = layout_name.get(id(p))
        packed["state"] = {i: state_of(n) for i, n in enumerate(index) if n is not None} if updates else {}
    else:
        params = [torch.nn.Parameter(master[n].clone()) for n in names]
        opt = torch_optimizer(cfg, list(zip(names, params)), step + 1)
        if updates:
            for p, n in zip(params, names):
                opt.state[p] = state_of(n)
        packed, index = opt.state_dict(), [n for _, _, ns in groups_of(cfg, names) for n in ns]
    ckpt = {"model": model, "optimizer": packed, "step": step,
            "mindp": {"optimizer": cfg.to_dict(), "updates": updates, "params": names, "state_index": index}}
    # A temporary of this writer's own, beside `path` so the rename is atomic: any rank may save the
    # same path at once, and a shared name would be renamed away under another writer.
    path = pathlib.Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(ckpt, f)
        os.chmod(tmp, 0o644)  # as torch.save's own file (mkstemp's is the owner's only)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return ckpt


def restore(path: str | pathlib.Path, state_dirs) -> int:
    """A fresh state directory from a checkpoint of `save`, or one per optimizer shard (a list of M
    directories in the job's shard order, each given its range of `mindp.layout.shard_ranges`, as
    the nodes of a job with M optimizers check); returns the step it resumes after."""
    dirs = state.job_dirs(state_dirs)
    if not dirs:
        raise ConfigError("no state directory to restore into")
    for d in dirs:
        if state.exists(d):
            raise ConfigError(f"{d} already holds a state: restore into a fresh directory")
    if len(set(map(os.path.realpath, dirs))) != len(dirs):
        raise ConfigError("a shard's state directory is named twice")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        info = ckpt["mindp"]
        cfg = OptimizerConfig.from_dict(info["optimizer"])
        names, updates, step = list(info["params"]), int(info["updates"]), int(ckpt["step"])
        model, opt_state = ckpt["model"], ckpt["optimizer"]["state"]
        # the name at each index of 'optimizer' (a checkpoint of before 'state_index': the node's grouping)
        numbered = info.get("state_index") or [n for _, _, ns in groups_of(cfg, names) for n in ns]
        index = {n: i for i, n in enumerate(numbered) if n is not None}
    except (OSError, RuntimeError, KeyError, TypeError, ValueError, EOFError) as exc:
        raise ConfigError(f"{path} is not a mindp checkpoint: {exc}") from None
    arrays = {n: model[n].detach().float().numpy() for n in reversed(names)}  # chunk order: reverse registration
    layout = optim.layout_of(arrays)
    lanes = {state.MASTER: layout.flatten(arrays, dtype=np.float32)}
    for lane, key in LANES[cfg.kind].items():
        lanes[lane] = layout.flatten({n: (opt_state[index[n]][key].float().numpy()
                                          if index.get(n) in opt_state and key in opt_state[index[n]]
                                          else np.zeros(arrays[n].shape, np.float32))
                                      for n in names}, dtype=np.float32)
    if len(dirs) > layout.n_chunks:
        raise ConfigError(f"{len(dirs)} shards for a model of {layout.n_chunks} chunks: at most one shard a chunk")
    ranges = shard_ranges(layout.n_chunks, len(dirs)) if len(dirs) > 1 else [None]
    for d, chunks in zip(dirs, ranges):
        state.create_at(d, layout, cfg, lanes, step, updates, chunks=chunks)
    return step


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mindp.torch.checkpoint",
                                description="write a fresh optimizer-node state directory from a mindp torch checkpoint")
    p.add_argument("checkpoint")
    p.add_argument("state_dir", nargs="+",
                   help="the node's state directory; for a job of M optimizer shards, M directories in shard order")
    args = p.parse_args(argv)
    try:
        step = restore(args.checkpoint, args.state_dir)
    except ConfigError as exc:
        print(f"mindp.torch.checkpoint: {exc}", file=sys.stderr)
        return 2
    print(f"{os.pathsep.join(args.state_dir)}: resumes after step {step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
