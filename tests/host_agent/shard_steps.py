"""Sharded optimizer nodes' steps without a network, for node_steps' job (N workers, S slots, job JOB): a
step's sums fed to one shard's NodeCore, and the parameters a worker keeps from the shards' answers."""
import numpy as np

from mindp.protocol import K, Flag

from .helpers import sum_headers
from .node_steps import JOB, N, S  # the same job as one node's


def feed(core, lay, step, chunks, sums, nf):
    """Sums of `chunks` to one shard in batches of 5; {chunk: (flags, params)} of its first answers."""
    got = {}
    for i in range(0, len(chunks), 5):
        part = np.array(chunks[i : i + 5])
        hdr, vals = core.handle(sum_headers(JOB, step, part, lay, S, N, nf), sums[part])
        for h, v in zip(hdr, vals):
            got.setdefault(int(h["chunk"]), (int(h["flags"]), v.copy()))
    return got


def as_worker(lay, got, before):
    """A worker's parameters after the step: the answers, or those before it if any said NONFINITE."""
    if any(f & Flag.NONFINITE for f, _ in got.values()):
        return before
    flat = np.zeros(lay.n_chunks * K, np.float16)
    for c, (_, v) in got.items():
        flat[c * K : (c + 1) * K] = v
    return lay.unflatten(flat[: lay.total])
