"""Shared pieces of the host-agent tests: a small model and sums as the switch makes them."""
from __future__ import annotations

import numpy as np

from host_agent import optim, reference, worker
from mindp import codec
from mindp.protocol import K, Flag, Kind


#: A size in elements written for K = 32 times this is as many chunks at this process's K: the
#: tests' chunk indices, pages and slots hold at the large K too.
SCALE = max(1, K // 32)
#: A node's RAM budget that maps the small model's state whole (1 MiB at K = 32: 85 pages of 32 chunks).
BUDGET = SCALE << 20


def small_model(seed: int = 1) -> dict[str, np.ndarray]:
    """44 chunks (at any K a multiple of 32), no tensor a whole number of them."""
    rng = np.random.default_rng(seed)
    return {
        "embed": rng.standard_normal((40, 17 * SCALE)).astype(np.float32) * 0.1,
        "w": rng.standard_normal((33, 21 * SCALE)).astype(np.float32) * 0.1,
        "b": np.zeros(13 * SCALE, np.float32),
    }


def initial_fp16(init: dict) -> dict:
    lay = optim.layout_of(init)
    return lay.unflatten(lay.flatten(init, dtype=np.float32).astype(np.float16))


def sum_headers(job: int, step: int, chunks, layout, slots: int, nworkers: int, nonfinite=None) -> np.ndarray:
    chunks = np.asarray(chunks, dtype=np.int64)
    slot, ver = worker.slot_and_version(step, chunks, layout.n_chunks, slots)
    flags = 0 if nonfinite is None else np.where(nonfinite[chunks], int(Flag.NONFINITE), 0)
    return codec.header_array(len(chunks), kind=Kind.SUM, job=job, step=step, chunk=chunks, slot=slot, ver=ver,
                              count=[layout.chunk_count(int(c)) for c in chunks], nworkers=nworkers, flags=flags)


def step_sums(layout, grad_fn, n_workers: int, step: int, params: dict):
    """The exact per-chunk sums and non-finite flags the switch would produce for this step."""
    flats = [reference.flat_fp16(layout, grad_fn(w, step, params)) for w in range(n_workers)]
    return reference.chunk_sums(flats)


def same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and np.array_equal(a[k].view(np.uint8), b[k].view(np.uint8)) for k in a)


def with_nonfinite(grad_fn, worker_id: int, step: int, name: str, index: int):
    """grad_fn, but worker `worker_id` produces an Inf at `name`[index] in `step`."""
    def fn(w, s, params):
        g = grad_fn(w, s, params)
        if (w, s) == (worker_id, step):
            g[name] = g[name].copy()
            g[name].reshape(-1)[index] = np.inf
        return g

    return fn


def numbered_high(sock, low: int = 1024):
    """`sock` moved to a descriptor numbered `low` or more (closing the old one): select() refuses
    those (FD_SETSIZE), as a training process holding many files gives its agents' sockets."""
    import fcntl
    import socket

    fd = fcntl.fcntl(sock.fileno(), fcntl.F_DUPFD_CLOEXEC, low)
    high = socket.socket(sock.family, sock.type, sock.proto, fileno=fd)
    high.setblocking(sock.getblocking())
    sock.close()
    return high
