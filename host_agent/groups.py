"""A script's parameter groups at the node: each tensor at its group's lr and weight decay.

A chunk is K consecutive elements of the flat layout, so one chunk may hold tensors of two
groups. The update is elementwise, so a run of chunks of one group is one kernel call with that
group's config, and a chunk holding several is updated once per group it holds, each group's
elements taken from its own pass: the same bits as updating every element with its own group's.
Such chunks are few (at most one per change of group along the layout).
"""
from __future__ import annotations

import numpy as np

from mindp.layout import Layout
from mindp.protocol import K

from . import fused, lr
from .optim import OptimizerConfig


class GroupPlan:
    """Which config (lr, weight decay) each element of a job's chunks trains with, and the lr of
    each step for each (its schedule from the group's own base lr, or the lr the workers told)."""

    def __init__(self, cfg: OptimizerConfig, layout: Layout):
        self.runs = cfg.group_runs(layout)
        self._starts = np.array([r[0] for r in self.runs], dtype=np.int64)
        self.n_groups = 1 + len(cfg.groups)  # lrs a step's told tuple holds ("script" schedule)
        self.told: dict[int, tuple[float, ...]] = {}  # the "script" schedule: each step's lrs, a group each
        self.rates = {id(c): lr.Rates(c.lr, c.schedule, self.told, group) for _, _, c, group in self.runs}

    def _lr(self, cfg: OptimizerConfig, step: int) -> float:
        return self.rates[id(cfg)].at(step)

    def _run_of(self, element: int) -> int:
        return int(np.searchsorted(self._starts, element, side="right")) - 1

    def pieces(self, lo: int, hi: int) -> list[tuple[int, int, list]]:
        """Chunks [lo, hi) cut where the group changes: (a, b, [(e0, e1, cfg), ...]), one entry
        for a run of one group's chunks (e0, e1 spanning them), several for a chunk of groups."""
        out: list[tuple[int, int, list]] = []
        c = lo
        i = self._run_of(lo * K)
        while c < hi:
            a, b, cfg, _ = self.runs[i]
            if b >= (c + 1) * K:  # chunk c lies in run i: take every whole chunk of it
                end = min(hi, b // K)
                out.append((c, end, [(0, (end - c) * K, cfg)]))
                c = end
                i += b == end * K
                continue
            segs = []  # chunk c holds the end of run i and the start of the next run(s)
            while True:
                a, b, cfg, _ = self.runs[i]
                segs.append((max(a, c * K) - c * K, min(b, (c + 1) * K) - c * K, cfg))
                if b >= (c + 1) * K:
                    break
                i += 1
            out.append((c, c + 1, segs))
            i += b == (c + 1) * K
            c += 1
        return out

    def update(self, first: int, src: np.ndarray, dst: np.ndarray, sums: np.ndarray, nworkers, updates: int,
               out: np.ndarray, step: int, kernel: str | None = None) -> None:
        """fused.update_records of the records of chunks first, first + 1, ... (job-wide numbers),
        each element at its tensor's group's config and that group's lr of `step` (`updates`: the
        bias correction's count)."""
        _, end, cfg, _ = self.runs[self._run_of(first * K)]
        if end >= (first + len(src)) * K:  # all of one group (most batches): no cutting
            fused.update_records(cfg, src, dst, sums, nworkers, updates, out, kernel, lr=self._lr(cfg, step))
            return
        for a, b, segs in self.pieces(first, first + len(src)):
            i, j = a - first, b - first
            nw = nworkers[i:j] if np.ndim(nworkers) else nworkers
            if len(segs) == 1:
                cfg = segs[0][2]
                fused.update_records(cfg, src[i:j], dst[i:j], sums[i:j], nw, updates, out[i:j], kernel,
                                     lr=self._lr(cfg, step))
                continue
            # (copies of the old record: SGD's kernel leaves a format-1 state's v lane as it was)
            rec, new = np.array(src[i:j]), np.array(src[i:j])
            par, half = np.empty_like(out[i:j]), np.empty_like(out[i:j])
            for e0, e1, cfg in segs:  # each pass reads the old record: src may be dst
                fused.update_records(cfg, src[i:j], rec, sums[i:j], nw, updates, half, kernel, lr=self._lr(cfg, step))
                new[..., e0:e1], par[..., e0:e1] = rec[..., e0:e1], half[..., e0:e1]
            dst[i:j], out[i:j] = new, par
