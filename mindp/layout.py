"""Named tensor layout: a model's arrays flattened into one chunk space.

Chunk c holds flat elements [c*K, (c+1)*K); the last chunk is padded. The
Reassembler takes chunks in any order and reports the missing ones.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import listed
from .protocol import K


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str = "float16"

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class MissingChunks(RuntimeError):
    def __init__(self, missing: list[int]):
        self.missing = missing
        super().__init__(f"{len(missing)} chunk(s) missing: {listed(missing, 20)}")


class Layout:
    """Where each named array lives in the flat element space."""

    def __init__(self, specs: list[TensorSpec]):
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError("tensor names must be unique")
        self.specs = list(specs)
        self.offsets: dict[str, int] = {}
        offset = 0
        for spec in self.specs:
            self.offsets[spec.name] = offset
            offset += spec.size
        self.total = offset
        self.n_chunks = -(-offset // K)

    @classmethod
    def of(cls, arrays: dict[str, np.ndarray]) -> Layout:
        return cls([TensorSpec(n, tuple(a.shape), str(a.dtype)) for n, a in arrays.items()])

    def flatten(self, arrays: dict[str, np.ndarray], dtype=np.float16) -> np.ndarray:
        flat = np.empty(self.total, dtype=dtype)
        for spec in self.specs:
            arr = np.asarray(arrays[spec.name])
            if tuple(arr.shape) != spec.shape:
                raise ValueError(f"{spec.name}: shape {arr.shape} != layout {spec.shape}")
            start = self.offsets[spec.name]
            flat[start : start + spec.size] = arr.reshape(-1)
        return flat

    def unflatten(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        out = {}
        for spec in self.specs:
            start = self.offsets[spec.name]
            out[spec.name] = flat[start : start + spec.size].reshape(spec.shape).astype(spec.dtype)
        return out

    def chunk_count(self, chunk: int) -> int:
        """Valid elements in `chunk`."""
        return min(K, self.total - chunk * K)


def shard_ranges(n_chunks: int, m: int) -> list[tuple[int, int]]:
    """The chunk ranges [lo, hi] (inclusive) of a job's M optimizer shards, in shard order:
    contiguous, sizes differing by at most one (the switch, the nodes and a restored checkpoint
    all split a chunk space by this rule)."""
    return [(i * n_chunks // m, (i + 1) * n_chunks // m - 1) for i in range(m)]


class Reassembler:
    """Collects chunks of one flat tensor, in any order, duplicates ignored."""

    def __init__(self, layout: Layout, dtype=np.float16):
        self.layout = layout
        self.flat = np.zeros(layout.n_chunks * K, dtype=dtype)
        self.have = np.zeros(layout.n_chunks, dtype=bool)

    def add(self, chunk: int, elements: np.ndarray) -> bool:
        """Store chunk `chunk`; False if it is a duplicate or out of range."""
        if not 0 <= chunk < self.layout.n_chunks or self.have[chunk]:
            return False
        self.flat[chunk * K : (chunk + 1) * K] = elements[:K]
        self.have[chunk] = True
        return True

    @property
    def complete(self) -> bool:
        return bool(self.have.all())

    def missing(self) -> list[int]:
        return [int(c) for c in np.flatnonzero(~self.have)]

    def arrays(self) -> dict[str, np.ndarray]:
        if not self.complete:
            raise MissingChunks(self.missing())
        return self.layout.unflatten(self.flat[: self.layout.total])
