"""Command-line pieces shared by mindp-worker, mindp-optimizer and the training worker:
the model arguments (--layout, --init), the test fault flags, and the number types."""
from __future__ import annotations

import argparse
import json
import math
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


def load_model(layout_path: str | None, init: str) -> tuple[Layout, dict[str, np.ndarray]]:
    """(layout, float32 initial parameters) from --layout / --init, as the optimizer node reads them."""
    seed = init_seed(init, layout_path)
    if seed is not None:
        layout = read_layout(layout_path)
        return layout, optim.seed_params(layout, seed)
    arrays = optim.load_npz(init)
    return optim.layout_of(arrays), arrays
