"""Single-process reference trainer: no network, the same math as the system.

Each worker's gradient is rounded to fp16, the workers' gradients are summed
exactly (mindp.fixedpoint, as the switch does), a step with an Inf/NaN in any
chunk changes nothing and does not count as an optimizer update (as the node does
on the switch's NONFINITE flag), and every other step goes through
`host_agent.optim.apply`, the node's code path.
A run through the network must end bit-identical to this (docs/DESIGN.md invariant 2).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from mindp import fixedpoint
from mindp.fixedpoint import fp16_to_fixed
from mindp.layout import Layout
from mindp.protocol import K

from . import lr, optim
from .optim import OptimizerConfig

GradFn = Callable[[int, int, dict], dict]


@dataclass
class Result:
    params: dict[str, np.ndarray]  # final fp16 parameters, as the workers hold them
    master: dict[str, np.ndarray]  # final fp32 master parameters, as the node holds them
    nonfinite: list[tuple[int, int]] = field(default_factory=list)  # the non-finite (step, chunk)s; those steps were skipped


def to_fp16(x) -> np.ndarray:
    """A numpy array or torch tensor -> numpy fp16 (round to nearest even)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().float().numpy()
    return fixedpoint.to_fp16(np.asarray(x))


def flat_fp16(layout: Layout, arrays: dict) -> np.ndarray:
    """Named gradients -> one zero-padded fp16 vector of n_chunks * K elements."""
    flat = np.zeros(layout.n_chunks * K, dtype=np.float16)
    flat[: layout.total] = layout.flatten({n: to_fp16(a) for n, a in arrays.items()}, dtype=np.float16)
    return flat


def chunk_sums(flats: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Workers' padded fp16 vectors -> (n_chunks, K) exact int64 sums, per-chunk non-finite flag."""
    total = None
    nonfinite = None
    for flat in flats:
        fixed, nf = fp16_to_fixed(flat)
        total = fixed if total is None else total + fixed
        nonfinite = nf if nonfinite is None else nonfinite | nf
    return total.reshape(-1, K), nonfinite.reshape(-1, K).any(axis=1)


def train(
    init: dict[str, np.ndarray],
    grad_fn: GradFn,
    n_workers: int,
    steps: int,
    opt: OptimizerConfig,
    layout: Layout | None = None,
    on_nonfinite: Callable[[int, int], None] | None = None,
    members: Callable[[int], list[int]] | None = None,
    told_lrs: dict[int, tuple[float, ...]] | None = None,
    more_grad_fns: Sequence[GradFn] = (),
    on_step: Callable[[int], None] | None = None,
) -> Result:
    """Train `steps` steps of `n_workers` data-parallel workers in one process.

    init: named initial float32 parameters (workers start from their fp16 rounding).
    grad_fn(worker, step, params_fp16) -> named gradients (numpy or torch, any float dtype).
    more_grad_fns: copies of grad_fn, each with state of its own (a torch module): a step's
    workers are then computed in as many threads, grad_fn's included (torch releases the GIL: a
    gpt's check after make run took as long again as training on 2 cores). Each gradient is the
    same computation in whichever thread, and the sums are exact in any order.
    members(step) -> the worker ids taking part in that step (default 0..n_workers-1), for a job
    whose membership changes between steps; the mean divides by their number.
    told_lrs: the "script" schedule's lrs of each step, a parameter group each (as the script's
    ranks told the node).
    on_step(done): called after each step (a skipped one too) with the steps done so far, e.g. to
    show the check's progress: a long run's reference takes about as long as its training.
    """
    layout = layout or optim.layout_of(init)
    n = layout.n_chunks
    master = np.zeros(n * K, dtype=np.float32)
    master[: layout.total] = layout.flatten(init, dtype=np.float32)
    m = np.zeros_like(master)
    v = np.zeros_like(master)
    skipped: list[tuple[int, int]] = []
    updates = 0  # Adam's bias correction counts updates: a skipped step is none
    # each parameter group's elements and lr (a skipped step still advances the schedule)
    runs = [(a, b, cfg, lr.Rates(cfg.lr, cfg.schedule, told_lrs, group)) for a, b, cfg, group in opt.group_runs(layout)]
    fns = [grad_fn, *more_grad_fns]
    with ThreadPoolExecutor(max(1, len(fns) - 1)) as pool:
        for step in range(steps):
            params = layout.unflatten(master[: layout.total].astype(np.float16))
            ids = list(range(n_workers)) if members is None else list(members(step))
            g, nonfinite = _mean_gradient(_gradients(fns, pool, layout, ids, step, params))
            if nonfinite.any():  # the whole step is a no-op, as at the node
                for c in np.flatnonzero(nonfinite):
                    skipped.append((step, int(c)))
                    if on_nonfinite:
                        on_nonfinite(step, int(c))
            else:
                for a, b, cfg, rates in runs:  # elementwise: each group's slices apart, a block at a time
                    rate = rates.at(step)
                    for x in range(a, b, SUM_BLOCK):
                        y = min(b, x + SUM_BLOCK)
                        optim.apply(cfg, master[x:y], m[x:y], v[x:y], g[x:y], updates, rate)
                updates += 1
            if on_step:
                on_step(step + 1)
    flat = master[: layout.total]
    return Result(layout.unflatten(flat.astype(np.float16)), unflatten_f32(layout, flat), skipped)


#: Elements whose exact sums (and update) are computed at a time: the int64 work costs ~60 bytes an
#: element, which over a whole model was most of the reference's memory (25.5M gpt: a peak of 3.5 GiB).
SUM_BLOCK = 1 << 18


def _mean_gradient(flats: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The workers' padded fp16 gradients -> (their float32 mean as the node computes it, the
    per-chunk non-finite flags), the exact sums taken a block of chunks at a time."""
    n = len(flats[0])
    g = np.empty(n, dtype=np.float32)
    nonfinite = np.empty(n // K, dtype=bool)
    step = max(1, SUM_BLOCK // K) * K
    for lo in range(0, n, step):
        sums, nonfinite[lo // K: (lo + step) // K] = chunk_sums([f[lo: lo + step] for f in flats])
        g[lo: lo + step] = optim.mean_gradient(sums.reshape(-1), len(flats))
    return g, nonfinite


def _gradients(fns: list[GradFn], pool: ThreadPoolExecutor, layout: Layout, ids: list[int], step: int,
               params: dict) -> list[np.ndarray]:
    """The workers' padded fp16 gradients of a step, in the order of `ids`: fns[t] computes every
    len(fns)-th worker from the t-th on, fns[0] in this thread, the others in the pool's."""
    def part(t: int) -> list[np.ndarray]:
        return [flat_fp16(layout, fns[t](w, step, params)) for w in ids[t:: len(fns)]]

    if len(fns) == 1 or len(ids) < 2:
        return [flat_fp16(layout, fns[0](w, step, params)) for w in ids]
    others = [pool.submit(part, t) for t in range(1, len(fns))]
    parts = [part(0), *(f.result() for f in others)]
    return [parts[i % len(fns)][i // len(fns)] for i in range(len(ids))]


def unflatten_f32(layout: Layout, flat: np.ndarray) -> dict[str, np.ndarray]:
    """A flat float32 vector -> named float32 arrays (copies)."""
    return {s.name: np.array(flat[layout.offsets[s.name] : layout.offsets[s.name] + s.size]).reshape(s.shape)
            for s in layout.specs}


def synthetic_grads(seed: int = 0, noise: float = 0.01, pull: float = 0.1) -> GradFn:
    """A deterministic gradient function of (worker, step, fp16 params), for runs without a model:
    pull * params + noise * N(0, 1), seeded per (seed, worker, step, tensor)."""
    def grad_fn(worker: int, step: int, params: dict) -> dict:
        out = {}
        for i, (name, p) in enumerate(params.items()):
            rng = np.random.default_rng([seed, worker, step, i])
            g = rng.standard_normal(p.shape, dtype=np.float32) * np.float32(noise)
            g += np.float32(pull) * np.asarray(p, dtype=np.float32)
            out[name] = g
        return out

    return grad_fn
