"""A worker's resume file: where it stands in the job, kept current at every parameter chunk it
receives, so that a worker killed at any moment (SIGKILL mid-step included) restarts where it was.

Rejoining a live job needs three things the network cannot give a fresh process: the step the job
is at, the parameters held before that step (to compute its gradients), and which chunks of the
step were already answered. The last matters because the switch keeps only the two newest uses of a
slot: a chunk answered a few uses back has no cell any more, and its gradient sent again is stale
(docs/P4.md), so only a worker that knows it has that chunk's parameters can go on. The file holds
exactly that, and the retransmission timer's estimates (window.RttEstimator.state: a restarted
worker goes on with what it learnt of the path), in a shared mapping (every store is in the page
cache the moment it is made, so a killed process loses nothing; no fsync: it survives the process,
not the machine):

    header | answered: int64[n_chunks] | parameters: fp16[2][n_chunks * K]

`answered[c] = 2 * step + nonfinite` once chunk c of `step` came back (any other value: not yet).
Parameters alternate between the two buffers: those before step s are in buffer s % 2, the answers
of step s go to buffer (s + 1) % 2, which is the 'before' of step s + 1; so completing a step is one
8-byte store of the header's step, and a kill between any two stores leaves a consistent file.
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import pathlib

import numpy as np

from mindp.layout import Layout
from mindp.protocol import K

from . import optim
from .optim import ConfigError

MAGIC = b"MINDPRS2"
#: Magics of earlier formats, refused in one line.
OLD_MAGICS = (b"MINDPRS1",)
#: Values a worker keeps with its step (the training worker: its loss scale), per parity of the step.
AUX = 4
HEADER = np.dtype([("magic", "S8"), ("job", "<u4"), ("worker", "<u4"), ("n_chunks", "<u8"), ("layout", "S32"),
                   ("step", "<i8"), ("aux", "<f8", (2, AUX)), ("rtt", "<f8", 3)])


def layout_digest(layout: Layout) -> bytes:
    return hashlib.sha256(json.dumps(optim.layout_to_json(layout)).encode()).digest()


class ResumeFile:
    """The mapped file; `step` is the step in progress (the first not completed)."""

    def __init__(self, path: str | os.PathLike, job: int, worker: int, layout: Layout):
        self.path = pathlib.Path(path)
        n = layout.n_chunks
        size = HEADER.itemsize + 8 * n + 2 * 2 * n * K
        try:
            fd = os.open(self.path, os.O_RDWR)
        except OSError as exc:
            raise ConfigError(f"cannot open resume file {self.path}: {exc.strerror}") from None
        try:
            if os.pread(fd, len(MAGIC), 0) in OLD_MAGICS:
                raise ConfigError(f"resume file {self.path} is of an earlier mindp's format: remove it to start "
                                  f"the worker afresh")
            if os.fstat(fd).st_size != size:
                raise ConfigError(f"resume file {self.path} is not one of this model at K = {K} (size differs)")
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.header = np.frombuffer(self._map, HEADER, 1)
        h = self.header[0]
        if h["magic"] != MAGIC:
            raise ConfigError(f"{self.path} is not a mindp worker resume file")
        if (int(h["job"]), int(h["worker"])) != (job, worker) or int(h["n_chunks"]) != n \
                or bytes(h["layout"]) != layout_digest(layout):
            raise ConfigError(f"resume file {self.path} belongs to job {int(h['job'])} worker {int(h['worker'])} "
                              f"or another model, not job {job} worker {worker} with this layout")
        self.answered = np.frombuffer(self._map, np.int64, n, HEADER.itemsize)
        self.buffers = np.frombuffer(self._map, np.float16, 2 * n * K, HEADER.itemsize + 8 * n).reshape(2, n * K)

    @classmethod
    def open(cls, path, job: int, worker: int, layout: Layout, before: np.ndarray, first_step: int = 0,
             aux=None) -> tuple[ResumeFile, bool]:
        """The resume file at `path`, created (at `first_step`, holding `before`, the flat fp16
        parameters before it) if there is none; (file, whether it existed)."""
        path = pathlib.Path(path)
        existed = path.exists()
        if not existed:
            create(path, job, worker, layout, before, first_step, aux)
        return cls(path, job, worker, layout), existed

    @property
    def step(self) -> int:
        return int(self.header[0]["step"])

    def before(self, step: int) -> np.ndarray:
        """The flat fp16 parameters held before `step` (a view)."""
        return self.buffers[step % 2]

    def answers(self, step: int) -> np.ndarray:
        """Where `step`'s parameters are received (a view; the 'before' of the next step)."""
        return self.buffers[(step + 1) % 2]

    def answered_in(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(chunks of `step` already answered, which of them came back NONFINITE) as masks."""
        done = (self.answered >> 1) == step
        return done, done & ((self.answered & 1) == 1)

    def record(self, step: int, chunks: np.ndarray, nonfinite: np.ndarray) -> None:
        """Chunks of `step` answered; their parameters are already in answers(step)."""
        self.answered[chunks] = 2 * step + np.asarray(nonfinite, dtype=np.int64)

    def aux(self, step: int) -> np.ndarray:
        return self.header["aux"][0, step % 2].copy()

    @property
    def rtt(self) -> np.ndarray:
        """The retransmission timer's estimates as of the last completed step (RttEstimator.state)."""
        return self.header["rtt"][0].copy()

    def complete(self, step: int, keep_before: bool, aux=None, rtt=None) -> None:
        """Step done; keep_before: it was skipped (non-finite), so the parameters before it stay;
        rtt: RttEstimator.state() (a torn write of it costs only a relearnt estimate)."""
        if keep_before:
            self.answers(step)[:] = self.before(step)
        if aux is not None:
            self.header["aux"][0, (step + 1) % 2] = aux
        if rtt is not None:
            self.header["rtt"][0] = rtt
        self.header["step"] = step + 1  # the one store that moves the worker on


def create(path: pathlib.Path, job: int, worker: int, layout: Layout, before: np.ndarray, step: int, aux) -> None:
    """Written whole to a temporary name and renamed, so a file that exists is complete."""
    n = layout.n_chunks
    h = np.zeros(1, HEADER)
    h["magic"], h["job"], h["worker"], h["n_chunks"] = MAGIC, job, worker, n
    h["layout"], h["step"] = layout_digest(layout), step
    h["rtt"] = np.nan  # nothing learnt yet
    if aux is not None:
        h["aux"][0, step % 2] = aux
    buffers = np.zeros((2, n * K), dtype=np.float16)
    buffers[step % 2, : len(before)] = before
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(h.tobytes())
            f.write(np.full(n, -1, dtype=np.int64).tobytes())
            f.write(buffers.tobytes())
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(f"cannot create resume file {path}: {exc.strerror}") from None
