"""The two state copies of a `state.Store`, a page at a time: the node's step-centric I/O pipeline.

Step t reads copy t % 2 and writes copy (t + 1) % 2 (see state.py). Out of core each page of the
step has one *working buffer* in the pager, read from the source copy (by the pager's reader
thread, ahead of use) and updated in place: for every chunk not yet applied it holds the source
record, for every chunk applied the new one. Applying records writes them at once to the
destination copy (pwrite into the page cache: a killed node keeps them) before they are marked
applied, so the destination is never read. A page whose chunks are all applied is retired: the
writer thread writes it back while the next pages are updated, and its buffer is freed, unless the
residency plan (`residency.decide`) keeps it for the next step, whose source it already is.

When the budget holds both copies, the files are mapped whole and updated in place (no copies).
"""
from __future__ import annotations

import pathlib

import numpy as np

from mindp.protocol import K

from . import residency
from .pager import MappedFile, Pager

def record(lanes: int) -> np.dtype:
    """One chunk's record: (master, m, v) x K float32 (3 lanes: AdamW), or (master, m) (2: SGD)."""
    return np.dtype((np.float32, (lanes, K)))


RECORD = record(3)  # master, m, v of one chunk (state.RECORD): AdamW's, and every format-1 state's


class PagedState:
    def __init__(self, paths: list[pathlib.Path], n_chunks: int, page_chunks: int, budget_bytes: int, *,
                 prefetch: bool = True, drop_cache: bool = True, window: int = 64, map_whole: bool = True,
                 lanes: int = 3):
        self.n_chunks = n_chunks
        self.page_chunks = page_chunks
        self.lanes = lanes
        self.record = record(lanes)
        self.page_bytes = page_chunks * self.record.itemsize
        self.workload = residency.Workload(n_chunks, page_chunks, window=window, record_bytes=self.record.itemsize)
        self.n_pages = self.workload.n_pages
        padded = self.n_pages * page_chunks
        self.plan = residency.decide(budget_bytes, self.workload, map_whole)
        self.mapped = self.plan.mode == "mapped"
        if self.mapped:
            self.files = [MappedFile(p, self.record, padded) for p in paths]
            self.pager = None
        else:
            self.files = None
            self.pager = Pager([str(p) for p in paths], self.page_bytes, budget_bytes, drop_cache=drop_cache,
                               prefetch=prefetch, ahead=self.plan.ahead)
        self.done = np.zeros(self.n_pages, dtype=np.int64)  # chunks of the current step applied, per page
        self.updated: dict[int, tuple[int, int]] = {}  # page -> (pager token, chunks updated in that buffer)
        self._hinted: tuple[int, int] | None = None

    @property
    def peak_pages(self) -> int:
        return self.n_pages * 2 if self.mapped else self.pager.stats.peak_pages

    @property
    def paging(self) -> dict[str, int]:
        """The pager's counts for the node's --stats (none when the state is mapped whole)."""
        if self.mapped:
            return {}
        s = self.pager.stats
        return {"page_faults": s.faults, "pages_prefetched": s.prefetched, "evictions": s.evictions,
                "writebacks": s.writebacks, "early_writebacks": s.early_writebacks}

    def chunks_in(self, page: int) -> int:
        return min(self.page_chunks, self.n_chunks - page * self.page_chunks)

    def _page(self, lo: int, hi: int) -> int:
        page = lo // self.page_chunks
        if hi <= lo or (hi - 1) // self.page_chunks != page:
            raise ValueError(f"records [{lo}, {hi}) are not within one page of {self.page_chunks} chunks")
        return page

    def _view(self, buf: np.ndarray) -> np.ndarray:
        return buf.view(np.float32).reshape(self.page_chunks, self.lanes, K)

    # --- the step ------------------------------------------------------------------------
    def start_step(self, applied: np.ndarray) -> None:
        """The current step's progress (chunks applied before, e.g. by a killed process)."""
        self.done[:] = 0
        hit = np.flatnonzero(applied)
        if len(hit):
            np.add.at(self.done, hit // self.page_chunks, 1)
        self._hinted = None

    def working(self, src: int, dst: int, lo: int, hi: int) -> np.ndarray:
        """Records [lo, hi) (one page, none applied yet) to update: read from copy src, written to
        copy dst (a view of the working buffer; of dst's mapping in RAM)."""
        if self.mapped:
            return self.files[dst].records[lo:hi]
        page = self._page(lo, hi)
        plo = page * self.page_chunks
        return self._view(self.pager.load(src, page))[lo - plo : hi - plo]

    def read(self, copy: int, lo: int, hi: int, buffered: bool) -> np.ndarray:
        """Records [lo, hi) (one page) of copy `copy`; `buffered`: the working buffer holds them
        (copy is the source and none of them is updated yet)."""
        if self.mapped:
            return self.files[copy].records[lo:hi]
        page = self._page(lo, hi)
        if buffered:
            buf = self.pager.buffer(page)
            if buf is not None:
                plo = page * self.page_chunks
                return self._view(buf)[lo - plo : hi - plo]
        rb = self.record.itemsize
        raw = self.pager.read(copy, lo * rb, (hi - lo) * rb)
        return raw.view(np.float32).reshape(hi - lo, self.lanes, K)

    def applied(self, dst: int | None, lo: int, hi: int) -> None:
        """Records [lo, hi) of one page were updated in the working buffer (dst: write them to that
        copy now) or answered unchanged (dst None); called before they are marked applied. Mapped
        whole, the records are in place already and [lo, hi) may span pages."""
        if self.mapped:
            return
        page = self._page(lo, hi)
        self.done[page] += hi - lo
        if dst is not None:
            buf = self.pager.buffer(page)
            if buf is None:
                raise RuntimeError(f"page {page} left the pager between its update and its write")
            plo = page * self.page_chunks
            rb = self.record.itemsize
            self.pager.write(dst, lo * rb, buf[(lo - plo) * rb : (hi - plo) * rb], page)
            token = self.pager.token[page]
            was, n = self.updated.get(page, (token, 0))
            self.updated[page] = (token, (n if was == token else 0) + hi - lo)
        if self.done[page] >= self.chunks_in(page):
            self.pager.retire(dst, page, keep=page in self.plan.resident)

    def prefetch(self, src: int, chunk: int, step: int) -> None:
        """The current step needs chunks from `chunk` on, in order: read ahead the next streamed pages."""
        if self.mapped:
            return
        first = min(chunk // self.page_chunks, self.n_pages - 1)
        if self._hinted == (step, first):
            return
        self._hinted = (step, first)
        wants = []
        for page in range(first, self.n_pages):
            if page in self.plan.resident and self.pager.buffer(page) is not None:
                continue
            if self.done[page] >= self.chunks_in(page):
                continue
            wants.append((src, page))
            if len(wants) >= self.plan.ahead + 1:
                break
        self.pager.hint(wants)

    def forget_updated(self) -> None:
        """Buffers holding updated records are no longer the source (a non-finite step answers
        from the state before it): drop them; the records are in the destination copy."""
        if self.mapped:
            return
        self.pager.settle()
        for page in list(self.updated):
            self.pager.drop(page)
        self.updated.clear()

    def forget_all(self) -> None:
        """The source copy changed under the buffers (a committed step undone): drop them all."""
        if self.mapped:
            return
        self.pager.settle()
        for page in self.pager.resident():
            self.pager.drop(page)
        self.updated.clear()

    def flush(self, copy: int | None = None, durable: bool = True) -> None:
        """Make the writes to the state durable: mapped whole, those to copy `copy` only (None:
        both), the only one a step writes (the other, its source, was made durable by the commit
        before); streamed, every page written back (each was written to the step's destination).
        durable=False: only as far as a killed process loses nothing (mapped whole: nothing to do)."""
        if self.mapped:
            for i, f in enumerate(self.files):
                if durable and (copy is None or i == copy):
                    f.flush()
        else:
            self.pager.flush(durable)

    def next_step(self, skipped: bool) -> None:
        """The step committed: keep the resident pages whose buffer is the next step's source (every
        chunk updated in it; after a skipped step, none), drop the rest."""
        if not self.mapped:
            self.pager.settle()  # read-ahead hinted for this step must not land in the next
            for page in self.pager.resident():
                token, n = self.updated.get(page, (None, 0))
                whole = token == self.pager.token.get(page) and n == self.chunks_in(page)
                if page not in self.plan.resident or not (n == 0 if skipped else whole):
                    self.pager.drop(page)
        self.updated.clear()
        self.done[:] = 0
        self._hinted = None

    def close(self) -> None:
        if self.mapped:
            for f in self.files:
                f.flush()
                f.close()
        else:
            self.pager.close()
