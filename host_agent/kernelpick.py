"""The update kernel the optimizer node runs under MINDP_KERNEL=auto: where the CPU runs both, the
one faster on this CPU, measured once at start-up.

Neither wins everywhere. On the AVX2 hosts mindp was built on, the AVX2 kernel did 1.7-2x the
portable one's elements/s; on an AMD EPYC with AVX-512 the portable one (plain loops, which LLVM
vectorises for the host's widest vectors) did 1.15-1.27x the AVX2 one (`bench/agents.py --only
ram`, both side by side). Both give the same bits (tests/host_agent/test_fused.py), so the choice
is about speed alone: a start-up on a loaded machine that measures wrong costs speed, never results.
The worker's fp16 rounding keeps `fused.selected()`: there the AVX2 kernel's F16C led the portable
integer rounding 18x on that EPYC.
"""
from __future__ import annotations

import functools
import os
import time
from typing import Callable

import numpy as np

from mindp.protocol import K

from . import fused
from .optim import OptimizerConfig

#: Records (K elements each) a measurement updates: its two state copies (24 MiB at K = 1,024)
#: overflow a core's caches as a model's state does, in about a millisecond a call.
RECORDS = max(1, 2**20 // K)
#: Calls per kernel, alternating; the fastest of each counts.
ROUNDS = 5


def update_kernel(cfg: OptimizerConfig) -> str:
    """The kernel the node runs: MINDP_KERNEL's, or under auto the faster of the two where the
    CPU runs both (else the one it runs)."""
    chosen = fused.selected()
    asked = os.environ.get("MINDP_KERNEL", "auto").strip().lower() or "auto"
    if asked != "auto" or chosen != "avx2":
        return chosen
    return faster(cfg.kind)


@functools.cache
def faster(kind: str, clock: Callable[[], float] = time.perf_counter) -> str:
    """'avx2' or 'portable', whichever updated RECORDS records of `kind` fastest here."""
    cfg = OptimizerConfig(kind=kind)
    rng = np.random.default_rng(0)
    src = rng.standard_normal((RECORDS, 3, K)).astype(np.float32)
    src[:, 2] = np.abs(src[:, 2])  # v >= 0, as AdamW keeps it
    dst = np.empty_like(src)
    sums = rng.integers(-(2**30), 2**30, (RECORDS, K), dtype=np.int64)
    out = np.empty((RECORDS, K), np.float16)
    best = {"avx2": float("inf"), "portable": float("inf")}
    for kernel in best:  # compiled, or loaded from numba's cache, and its threads started, untimed
        fused.update_records(cfg, src, dst, sums, 2, 0, out, kernel)
    for _ in range(ROUNDS):
        for kernel in best:
            start = clock()
            fused.update_records(cfg, src, dst, sums, 2, 0, out, kernel)
            best[kernel] = min(best[kernel], clock() - start)
    return min(best, key=best.get)
