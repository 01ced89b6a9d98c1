"""What a workload is and what it trains on: its description (WorkloadConfig), the data shipped with
mindp (the 8x8 digits; the gpt's text sits beside them), their seeded split, and each worker's shard
and batch at each step. The numpy MLP (mindp.workload) and the torch models (mindp.torch) both
build on it; it imports neither."""
from __future__ import annotations

import functools
import gzip
import json
import pathlib
from dataclasses import asdict, dataclass, field

import numpy as np

MODELS = ("mlp", "cnn", "gpt")


class WorkloadError(ValueError):
    """A workload description that cannot be used; the message says why."""


@dataclass(frozen=True)
class WorkloadConfig:
    n_workers: int
    seed: int = 0
    hidden: int = 64
    batch: int = 32  # per worker and step
    test_fraction: float = 0.2
    model: str = "mlp"
    model_args: dict = field(default_factory=dict)  # torch models: constructor arguments (e.g. gpt's d, layers)
    loss_scale: float = 0.0  # torch models: initial dynamic loss scale (mindp.lossscale); 0: no scaling
    scale_growth_interval: int = 2000

    def __post_init__(self):
        if self.model not in MODELS:
            raise WorkloadError(f"unknown model {self.model!r}: choose one of {', '.join(MODELS)}")
        if self.model == "mlp" and (self.model_args or self.loss_scale):
            raise WorkloadError("the mlp model takes no model_args and no loss scaling")
        if self.loss_scale < 0 or self.scale_growth_interval < 1:
            raise WorkloadError("loss_scale must be >= 0 and scale_growth_interval >= 1")
        if self.n_workers < 1:
            raise WorkloadError(f"n_workers must be >= 1, got {self.n_workers}")
        if self.hidden < 1 or self.batch < 1:
            raise WorkloadError(f"hidden and batch must be >= 1, got {self.hidden} and {self.batch}")
        if not 0.0 < self.test_fraction < 1.0:
            raise WorkloadError(f"test_fraction must be in (0, 1), got {self.test_fraction}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> WorkloadConfig:
        try:
            return cls(**d)
        except TypeError as exc:
            raise WorkloadError(f"malformed workload description: {exc}") from None

    def dump(self, path: str | pathlib.Path) -> None:
        pathlib.Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | pathlib.Path) -> WorkloadConfig:
        try:
            return cls.from_dict(json.loads(pathlib.Path(path).read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            raise WorkloadError(f"cannot read workload {path}: {exc}") from None


@dataclass(frozen=True)
class Dataset:
    x_train: np.ndarray  # (n, 64) float32 in [0, 1]
    y_train: np.ndarray  # (n,) int64
    x_test: np.ndarray
    y_test: np.ndarray


#: The digits and the gpt's text (mindp/data/LICENSE says where they come from).
DATA_DIR = pathlib.Path(__file__).resolve().with_name("data")


@functools.lru_cache(maxsize=1)
def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """The digits as (data float64 (1797, 64), values 0..16; target int), as scikit-learn's
    `load_digits` gives them (its CSV); read-only, shared by every caller."""
    with gzip.open(DATA_DIR / "digits.csv.gz", "rt") as f:
        table = np.loadtxt(f, delimiter=",")
    data, target = table[:, :-1], table[:, -1].astype(int)
    data.flags.writeable = target.flags.writeable = False
    return data, target


@functools.lru_cache(maxsize=4)
def load_dataset(seed: int, test_fraction: float = 0.2) -> Dataset:
    """Digits split into train and test by a seeded permutation."""
    data, target = load_digits()
    x = (data / 16.0).astype(np.float32)
    y = target.astype(np.int64)
    order = np.random.default_rng([seed, 0xD161]).permutation(len(y))
    n_test = int(round(len(y) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return Dataset(x[train], y[train], x[test], y[test])


def shard(cfg: WorkloadConfig, worker: int, n_train: int) -> np.ndarray:
    """Training indices owned by `worker`: every n_workers-th example, disjoint across workers."""
    if not 0 <= worker < cfg.n_workers:
        raise WorkloadError(f"worker {worker} outside 0..{cfg.n_workers - 1}")
    return np.arange(worker, n_train, cfg.n_workers)


def batch_indices(cfg: WorkloadConfig, worker: int, step: int, n_train: int) -> np.ndarray:
    """The fixed batch of `worker` at `step`, drawn from its own shard."""
    own = shard(cfg, worker, n_train)
    rng = np.random.default_rng([cfg.seed, worker, step])
    return own[rng.choice(len(own), size=min(cfg.batch, len(own)), replace=False)]
