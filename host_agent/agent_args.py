"""Command-line pieces shared by mindp-worker, mindp-optimizer and the training worker:
the model arguments (--layout, --init), the test fault flags, and the number types."""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib

import numpy as np

from mindp.layout import Layout

from . import optim, rawsock
from .optim import ConfigError


def finite(text: str) -> float:
    """A float argument that is a number (not nan or inf)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"want a finite number, got {text!r}")
    return value


#: The optimizer node's RAM budget for its state when none is given (mindp-optimizer --ram-budget,
#: make run's NODE_RAM).
RAM_BUDGET = "256M"


def parse_size(text: str) -> int:
    """A size in bytes: 64M, 1G, 512k, 1.5GiB (units of 1,024)."""
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    unit = t[-1] if t and t[-1] in units else ""
    try:
        value = float(t[: len(t) - len(unit)])
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"bad size {text!r} (e.g. 64M, 1G)")
    return int(value * units[unit])


def integer(low: int, high: int | None = None):
    """An argparse type: an integer in [low, high] (no upper bound without `high`)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"want an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            want = f"in [{low}, {high}]" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"want an integer {want}, got {value}")
        return value
    return parse


def probability(text: str) -> float:
    """A fault probability in [0, 1)."""
    value = finite(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"want a probability in [0, 1), got {text!r}")
    return value


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layout", help="JSON layout [[name, [dims]], ...] (default: the arrays of --init FILE)")
    p.add_argument("--init", default="seed:0", help="seed:N or a .npz of initial parameters")


def add_fault_args(p: argparse.ArgumentParser, send_reorder: bool = False) -> None:
    """Seeded loss injection on the agent's own paths (tests); the node also duplicates and reorders."""
    p.add_argument("--drop-send", type=probability, default=0.0, help="test loss injection on sent frames")
    p.add_argument("--drop-recv", type=probability, default=0.0, help="test loss injection on received frames")
    if send_reorder:
        p.add_argument("--dup-send", type=probability, default=0.0, help="test duplication of sent frames")
        p.add_argument("--reorder-send", type=probability, default=0.0, help="test reordering of sent frames")
    p.add_argument("--fault-seed", type=int, default=0)


def faults_from_args(args: argparse.Namespace) -> rawsock.Faults | None:
    dup, reorder = getattr(args, "dup_send", 0.0), getattr(args, "reorder_send", 0.0)
    if not (args.drop_send or args.drop_recv or dup or reorder):
        return None
    return rawsock.Faults(args.drop_send, args.drop_recv, args.fault_seed, dup, reorder)


def host_fault_seed(seed: int, hosts, host: str) -> int:
    """A run's fault-injection seed for `host` (`hosts`: the topology's host names, in order): its
    own for each host (by its place in the topology), the same whichever process injects there."""
    return seed * 1000 + list(hosts).index(host) + 1


def init_seed(init: str, layout_path: str | None) -> int | None:
    """The N of --init seed:N (which needs --layout), or None when --init names a file."""
    if not init.startswith("seed:"):
        return None
    try:
        seed = int(init[5:])
    except ValueError:
        raise ConfigError(f"bad --init {init!r}: want seed:N or a file.npz") from None
    if not layout_path:
        raise ConfigError("--init seed:N needs --layout")
    return seed


def read_layout(layout_path: str) -> Layout:
    try:
        return optim.layout_from_json(json.loads(pathlib.Path(layout_path).read_text()))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read layout {layout_path}: {exc}") from None


def requested_layout(layout_path: str | None, init: str) -> Layout | None:
    """The layout --layout/--init describe, without loading a .npz's arrays (None for seed:N without --layout)."""
    if layout_path:
        return read_layout(layout_path)
    if not init.startswith("seed:"):
        return optim.npz_layout(init)
    return None


def model_init(layout_path: str | None, init: str) -> tuple[Layout, dict[str, np.ndarray] | None, int]:
    """--layout/--init as the worker and the node both read them (one reading, so that they agree on
    the model's order): (layout, the .npz's float32 arrays in the layout's order or None for seed:N,
    the seed). --layout, when given, is the order and the shapes even for an .npz; every tensor it
    names must be in the file with that shape, checked here before anything is made from them."""
    seed = init_seed(init, layout_path)
    if seed is not None:
        return read_layout(layout_path), None, seed
    arrays = optim.load_npz(init)
    if not layout_path:
        return optim.layout_of(arrays), arrays, 0
    layout = read_layout(layout_path)
    missing = [s.name for s in layout.specs if s.name not in arrays]
    if missing:
        raise ConfigError(f"--layout {layout_path} names tensor(s) {missing} that {init} lacks")
    for s in layout.specs:
        if tuple(arrays[s.name].shape) != s.shape:
            raise ConfigError(f"{s.name}: shape {arrays[s.name].shape} in {init}, {s.shape} in --layout {layout_path}")
    return layout, {s.name: arrays[s.name] for s in layout.specs}, 0


def load_model(layout_path: str | None, init: str) -> tuple[Layout, dict[str, np.ndarray]]:
    """(layout, float32 initial parameters) from --layout / --init, as the optimizer node reads them."""
    layout, arrays, seed = model_init(layout_path, init)
    return layout, arrays if arrays is not None else optim.seed_params(layout, seed)


def check_output(path: str | None, option: str) -> None:
    """Refuse at start an output file that could not be written at the end, when its failure would
    come after every step ran (and lose their result)."""
    if not path:
        return
    p = pathlib.Path(path)
    if not p.parent.is_dir():
        raise ConfigError(f"{option} {path}: no directory {p.parent}")
    if p.is_dir():
        raise ConfigError(f"{option} {path} is a directory")
    if not os.access(p.parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ConfigError(f"{option} {path}: not writable")
