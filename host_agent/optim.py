"""The optimizer math shared by the optimizer node and the reference trainer.

Everything is elementwise float32 with IEEE-exact operations (+ - * / sqrt) and
scalars rounded to float32 once, so applying a slice of chunks gives the same
bits as applying the whole tensor: the node (chunk by chunk, in any order) and
the reference (whole arrays) agree bit for bit (docs/DESIGN.md invariant 2).
"""
from __future__ import annotations

import functools
import math
import pathlib
import zipfile
from dataclasses import asdict, dataclass, replace

import numpy as np

from mindp import listed
from mindp.layout import Layout, TensorSpec
from mindp.protocol import K, SCALE_BITS

KINDS = ("adamw", "sgd")
F32 = np.float32


class ConfigError(ValueError):
    """An optimizer or model description that cannot be used; the message says why."""


SCHEDULES = ("constant", "step", "cosine", "linear", "multistep", "exponential", "restarts", "script")


@dataclass(frozen=True)
class Schedule:
    """The lr schedule of an optimizer (host_agent.lr replays it as torch.optim.lr_scheduler does)."""

    kind: str = "constant"
    total: int = 0  # cosine/linear: steps of the whole schedule, warmup included
    warmup: int = 0  # steps of linear warmup (LinearLR from warmup_start to 1) before the decay
    warmup_start: float = 0.1  # LinearLR's start_factor
    eta_min: float = 0.0  # cosine, restarts: the lowest lr
    end_factor: float = 0.0  # linear: the last lr as a fraction of the base lr
    step_size: int = 1  # step
    gamma: float = 0.1  # step, multistep, exponential: the factor of each decay
    milestones: tuple[int, ...] = ()  # multistep: the steps whose lr is gamma times the one before
    t_0: int = 1  # restarts: steps to the first restart
    t_mult: int = 1  # restarts: each period is t_mult times the one before

    def __post_init__(self):
        if self.kind not in SCHEDULES:
            raise ConfigError(f"unknown lr schedule {self.kind!r}: choose one of {', '.join(SCHEDULES)}")
        for name in ("total", "warmup", "step_size", "t_0", "t_mult"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), int):
                raise ConfigError(f"schedule {name} must be an integer, got {getattr(self, name)!r}")
        for name in ("warmup_start", "eta_min", "end_factor", "gamma"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"schedule {name} must be a finite number, got {value!r}")
            object.__setattr__(self, name, float(value))
        if self.kind in ("cosine", "linear") and not 0 <= self.warmup < self.total:
            raise ConfigError(f"{self.kind} schedule: need 0 <= warmup < total, got warmup {self.warmup}, "
                              f"total {self.total}")
        if self.warmup < 0 or (self.kind in ("constant", "script") and self.warmup):
            raise ConfigError(f"warmup must be >= 0 steps before a decaying schedule, got {self.warmup} "
                              f"({self.kind})")
        if self.warmup and not 0 < self.warmup_start <= 1:
            raise ConfigError(f"warmup_start must be in (0, 1], got {self.warmup_start}")
        if self.kind == "linear" and not 0 <= self.end_factor <= 1:
            raise ConfigError(f"end_factor must be in [0, 1], got {self.end_factor}")
        if self.kind == "restarts" and (self.t_0 < 1 or self.t_mult < 1):
            raise ConfigError(f"restarts schedule: need t_0 >= 1 and t_mult >= 1, got {self.t_0}, {self.t_mult}")
        if self.kind in ("cosine", "restarts") and self.eta_min < 0:
            raise ConfigError(f"eta_min must be >= 0, got {self.eta_min}")
        if self.kind == "step" and (self.step_size < 1 or not 0 < self.gamma <= 1):
            raise ConfigError(f"step schedule: need step_size >= 1 and gamma in (0, 1], got {self.step_size}, "
                              f"{self.gamma}")
        if self.kind in ("multistep", "exponential") and not 0 < self.gamma <= 1:
            raise ConfigError(f"{self.kind} schedule: need gamma in (0, 1], got {self.gamma}")
        if not isinstance(self.milestones, (list, tuple)) \
                or any(isinstance(m, bool) or not isinstance(m, int) or m < 0 for m in self.milestones):
            raise ConfigError(f"schedule milestones must be a list of steps (integers >= 0), got {self.milestones!r}")
        object.__setattr__(self, "milestones", tuple(self.milestones))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> Schedule:
        try:
            return cls(**(d or {}))
        except TypeError as exc:
            raise ConfigError(f"malformed lr schedule: {exc}") from None


def _finite(value) -> bool:
    """A real number (numpy's too), not a bool, not NaN or infinite: NaN passes any `<`/`>` test."""
    return not isinstance(value, bool) and isinstance(value, (int, float, np.floating, np.integer)) \
        and math.isfinite(value)


@dataclass(frozen=True)
class ParamGroup:
    """Tensors a script's optimizer trains at another lr or weight decay than its first group's
    (torch's param_groups beyond the first: biases and norms without decay, a head at 10x the lr).
    The schedule applies to each group's lr as torch's schedulers do: from the group's own base."""

    params: tuple[str, ...]
    lr: float
    weight_decay: float

    def __post_init__(self):
        if isinstance(self.params, str) or not all(isinstance(n, str) for n in self.params):
            raise ConfigError(f"a parameter group's params must be tensor names, got {self.params!r}")
        object.__setattr__(self, "params", tuple(self.params))
        for name in ("lr", "weight_decay"):
            value = getattr(self, name)
            if not _finite(value) or value < 0 or (name == "lr" and value == 0):
                raise ConfigError(f"a parameter group's {name} must be a finite number "
                                  f"{'> 0' if name == 'lr' else '>= 0'}, got {value!r}")
            object.__setattr__(self, name, float(value))


@dataclass(frozen=True)
class OptimizerConfig:
    kind: str = "adamw"
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01
    momentum: float = 0.9  # sgd only
    schedule: Schedule = Schedule()  # the lr of step s: host_agent.lr.Rates(lr, schedule).at(s)
    # Tensors trained at another lr or weight decay (a script's other parameter groups); the
    # rest train at lr and weight_decay above.
    groups: tuple[ParamGroup, ...] = ()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ConfigError(f"unknown optimizer {self.kind!r}: choose one of {', '.join(KINDS)}")
        try:
            b1, b2 = self.betas
        except (TypeError, ValueError):
            raise ConfigError(f"betas must be two numbers, got {self.betas!r}") from None
        # Every hyper-parameter a finite real number: NaN passes any `<`/`>` test, so check it first.
        for name, value in (("lr", self.lr), ("betas[0]", b1), ("betas[1]", b2), ("eps", self.eps),
                            ("weight_decay", self.weight_decay), ("momentum", self.momentum)):
            if not _finite(value):
                raise ConfigError(f"{name} must be a finite number, got {value!r}")
        if not self.lr > 0:
            raise ConfigError(f"learning rate must be positive, got {self.lr}")
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ConfigError(f"betas must be in [0, 1), got {self.betas}")
        if self.eps <= 0 or self.weight_decay < 0 or not 0 <= self.momentum < 1:
            raise ConfigError("eps must be > 0, weight_decay >= 0, momentum in [0, 1)")
        object.__setattr__(self, "betas", (float(b1), float(b2)))
        try:
            groups = tuple(ParamGroup(**g) if isinstance(g, dict) else g for g in self.groups)
        except TypeError as exc:
            raise ConfigError(f"malformed parameter group: {exc}") from None
        if not all(isinstance(g, ParamGroup) for g in groups):
            raise ConfigError(f"groups must be ParamGroups, got {self.groups!r}")
        names = [n for g in groups for n in g.params]
        if len(set(names)) != len(names):
            raise ConfigError(f"parameter groups name a tensor twice: "
                              f"{listed(sorted({n for n in names if names.count(n) > 1}), 5)}")
        object.__setattr__(self, "groups", groups)
        if isinstance(self.schedule, dict):
            object.__setattr__(self, "schedule", Schedule.from_dict(self.schedule))
        if not isinstance(self.schedule, Schedule):
            raise ConfigError(f"schedule must be a Schedule, got {self.schedule!r}")

    @property
    def lanes(self) -> int:
        """float32 lanes of a chunk's state record: master, m and v for AdamW; SGD has no v."""
        return 3 if self.kind == "adamw" else 2

    @functools.cached_property
    def _group_index(self) -> dict[str, int]:
        # the first group naming a tensor wins: later ones are written first
        return {n: i + 1 for i, g in reversed(list(enumerate(self.groups))) for n in g.params}

    def group_of(self, name: str) -> int:
        """The parameter group tensor `name` trains in: 0 the optimizer's own (its first), i + 1
        groups[i], the first naming it."""
        return self._group_index.get(name, 0)

    def hyper_of(self, name: str) -> tuple[float, float]:
        """(lr, weight_decay) of tensor `name`: its group's, else the optimizer's."""
        i = self.group_of(name)
        return (self.groups[i - 1].lr, self.groups[i - 1].weight_decay) if i else (self.lr, self.weight_decay)

    def group_runs(self, layout: Layout) -> list[tuple[int, int, OptimizerConfig, int]]:
        """The flat element ranges [a, b) of `layout`, the config each trains with (its group's lr
        and weight decay, no groups) and its group (group_of), merged where neighbours share a
        config; they cover the padded chunks, n_chunks * K elements. Under the "script" schedule a
        group is its own config whatever its hyper-parameters: the script may set its lr apart."""
        unknown = sorted({n for g in self.groups for n in g.params} - set(layout.offsets))
        if unknown:
            raise ConfigError(f"parameter groups name tensors the model lacks: {listed(unknown, 5)}")
        base = replace(self, groups=())
        apart = self.schedule.kind == "script"
        at: dict = {}
        runs: list[tuple[int, int, OptimizerConfig, int]] = []
        for spec in layout.specs:
            lo, group, hyper = layout.offsets[spec.name], self.group_of(spec.name), self.hyper_of(spec.name)
            key = group if apart else hyper
            if key not in at:
                at[key] = (replace(base, lr=hyper[0], weight_decay=hyper[1]) if group else base, group)
            cfg, first = at[key]
            if runs and runs[-1][2] is cfg:
                runs[-1] = (runs[-1][0], lo + spec.size, cfg, first)
            elif spec.size:
                runs.append((lo, lo + spec.size, cfg, first))
        end = layout.n_chunks * K
        if runs:
            runs[-1] = (runs[-1][0], end, *runs[-1][2:])
        return runs or [(0, end, base, 0)]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> OptimizerConfig:
        try:
            return cls(**{**d, "betas": tuple(d.get("betas", (0.9, 0.999)))})
        except TypeError as exc:
            raise ConfigError(f"malformed optimizer description: {exc}") from None

    def differences(self, other: OptimizerConfig) -> str:
        """The hyper-parameters where `other` differs, as `name self -> other` (empty: none)."""
        def flat(cfg: OptimizerConfig) -> dict:
            d = cfg.to_dict()
            return {**{k: v for k, v in d.items() if k != "schedule"},
                    **{f"schedule.{k}": v for k, v in d["schedule"].items()}}

        mine, theirs = flat(self), flat(other)
        return ", ".join(f"{k} {mine[k]!r} -> {theirs[k]!r}" for k in mine if mine[k] != theirs[k])


def mean_gradient(sums: np.ndarray, nworkers: int) -> np.ndarray:
    """Exact int64 sums at scale 2**24 -> float32 mean: float64(sum) * 2**-24 / nworkers."""
    return (np.asarray(sums, dtype=np.int64).astype(np.float64) * 2.0**-SCALE_BITS / nworkers).astype(np.float32)


def apply(cfg: OptimizerConfig, master: np.ndarray, m: np.ndarray, v: np.ndarray, grad: np.ndarray, step: int,
          lr: float | None = None) -> None:
    """One optimizer step on float32 arrays of any (equal) shape, in place.

    `step` is the 0-based training step; Adam's bias correction uses step + 1
    for every chunk, also after a skipped (non-finite) step of that chunk.
    AdamW and SGD follow torch.optim's formulas (decoupled weight decay for AdamW;
    L2 weight decay, momentum without dampening for SGD). `lr`: the step's scheduled lr (a
    Python float, as torch's schedulers give it; default cfg.lr).
    """
    lr = cfg.lr if lr is None else lr
    if cfg.kind == "adamw":
        b1, b2 = cfg.betas
        t = step + 1
        if cfg.weight_decay:
            master *= F32(1.0 - lr * cfg.weight_decay)
        m *= F32(b1)
        m += F32(1.0 - b1) * grad
        v *= F32(b2)
        v += F32(1.0 - b2) * (grad * grad)
        denom = np.sqrt(v)
        denom /= F32(math.sqrt(1.0 - b2**t))
        denom += F32(cfg.eps)
        upd = m / denom
        upd *= F32(lr / (1.0 - b1**t))
        master -= upd
    else:
        g = grad + F32(cfg.weight_decay) * master if cfg.weight_decay else grad
        m *= F32(cfg.momentum)
        m += g
        master -= F32(lr) * m


def seed_params(layout: Layout, seed: int, scale: float = 0.02) -> dict[str, np.ndarray]:
    """Deterministic float32 initial parameters from a seed (the same in every process)."""
    return {spec.name: seed_tensor(seed, i, spec.size, scale).reshape(spec.shape) for i, spec in enumerate(layout.specs)}


def seed_tensor(seed: int, index: int, size: int, scale: float = 0.02) -> np.ndarray:
    """The index-th tensor of a seeded initialisation, flat float32 (N(0, scale^2), PCG64)."""
    return np.random.default_rng([seed, index]).standard_normal(size, dtype=np.float32) * F32(scale)


def load_npz(path: str | pathlib.Path) -> dict[str, np.ndarray]:
    """Named float arrays from an .npz file, as float32 (order kept)."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: np.asarray(npz[name]) for name in npz.files}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read parameters from {path}: {exc}") from None
    if not arrays:
        raise ConfigError(f"{path} holds no arrays")
    bad = [n for n, a in arrays.items() if a.dtype.kind != "f"]
    if bad:
        raise ConfigError(f"{path}: arrays {bad} are not floating point")
    with np.errstate(over="ignore"):  # a float64 beyond float32 becomes inf: its user says so (state.init_pieces)
        return {n: a.astype(np.float32) for n, a in arrays.items()}


def npz_layout(path: str | pathlib.Path) -> Layout:
    """The layout of an .npz's arrays from their headers only (no data read)."""
    try:
        with zipfile.ZipFile(path) as zf:
            specs = []
            for name in zf.namelist():
                with zf.open(name) as f:
                    fmt = np.lib.format
                    version = fmt.read_magic(f)
                    read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
                    shape, _, dtype = read(f)
                if dtype.kind != "f":
                    raise ConfigError(f"{path}: array {name[:-4]!r} is not floating point")
                specs.append(TensorSpec(name.removesuffix(".npy"), tuple(shape), "float16"))
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"cannot read parameters from {path}: {exc}") from None
    return Layout(specs)


def layout_of(arrays: dict[str, np.ndarray]) -> Layout:
    """The fp16 layout of named arrays (workers hold fp16 parameters)."""
    return Layout([TensorSpec(n, tuple(a.shape), "float16") for n, a in arrays.items()])


def layout_to_json(layout: Layout) -> list:
    return [[s.name, list(s.shape)] for s in layout.specs]


def layout_from_json(data) -> Layout:
    try:
        return Layout([TensorSpec(str(name), tuple(int(d) for d in shape), "float16") for name, shape in data])
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"malformed layout (want [[name, [dims...]], ...]): {exc}") from None
