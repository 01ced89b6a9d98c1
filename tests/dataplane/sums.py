"""What an aggregation round must deliver: exactly the expected SUM frames at the optimizer node, and a
complete round of a job's workers summed exactly."""
import numpy as np

from mindp import codec
from mindp.fixedpoint import exact_sum
from mindp.protocol import Kind

from .fabric import random_fp16


def only_sums_at(fabric, got, host, n):
    """Exactly n frames arrived, all SUM frames at `host`; returns the decoded batch."""
    others = {h: len(f) for h, f in got.items() if f and h != host}
    assert not others, f"unexpected frames at {others}"
    assert len(got[host]) == n, f"{len(got[host])} frames at {host}, expected {n}"
    dec = codec.decode(got[host], Kind.SUM)
    assert len(dec.headers) == n, dec.rejects
    return dec


def complete_round(fabric, job, step, chunk, rng, ver=0):
    """Every worker of `job` contributes to (step, chunk); the exact sum must arrive."""
    grads = [random_fp16(rng) for _ in job.workers]
    for w, g in enumerate(grads):
        fabric.send(job.workers[w], fabric.grad(job, w, g, step=step, chunk=chunk, ver=ver))
    dec = only_sums_at(fabric, fabric.collect(1), job.optimizer, 1)
    assert np.array_equal(dec.elements[0], exact_sum(grads)[0])
