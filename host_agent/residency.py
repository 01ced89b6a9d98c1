"""Which state pages stay resident and how far ahead to read, and the step time that follows.

Pure logic (no I/O), after Deep Optimizer States (arXiv 2410.21316), which places each subgroup's
update where its cost model says it is cheapest. Here the choice is per page of the state: a page
kept resident across steps costs RAM and saves its read every step; a page streamed costs one read
(page p+1 read while page p is updated) and, like every page, one write (p-1 written back). The
RAM budget is shared by

  - 2 units for the page being updated (its buffer, and its records written to the page cache),
  - `ahead` pages read ahead: enough to cover the arrival window (sums arrive up to the job's slot
    count of chunks out of order) plus one, so the disk always has the next read queued,
  - up to BEHIND pages being written back (so the disk's write queue stays full while the CPU
    updates the next pages), and one spare unit for the reader's hand-off,
  - the rest: resident pages, the first in arrival order (it hides the first read of each step,
    which nothing else can overlap) and the others evenly spaced after it (`spread`).

A budget that holds both copies maps the files whole (no copies at all). Sums out of order beyond
the window (one slot's chain stalled while the others run through the model) find the budget full
of partly applied pages: the pager then makes room itself (pager.py), at the cost of reads and
writes this plan does not count.

Step time: the disk moves the streamed reads and all writes (at its measured mixed rate while
both run, the reader and writer threads being concurrent, then alone), the CPU
updates every page, the network delivers the sums; the slowest of the three sets the pace, plus
what cannot overlap: the first read (unless resident pages cover it), the last write-back, and
the commit's fsync, which persists whatever a write cache acknowledged during the step (on this
VM's disk nearly all of it: `Machine.flush`, seconds per byte written, measured by the probe).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from mindp.protocol import K

from .optim import ConfigError

RECORD_BYTES = 3 * K * 4  # (master, m, v) x K float32 per chunk
ACTIVE_UNITS = 2
SPARE_UNITS = 1
MIN_PAGES = 4  # one page being updated (its buffer and its written records), one read ahead, one spare
BEHIND = 8  # pages written behind before any is kept: the disk's write queue stays full while the CPU updates


class PlanError(ConfigError):
    pass


@dataclass(frozen=True)
class Workload:
    n_chunks: int
    page_chunks: int
    window: int = 64  # how many chunks out of order sums may arrive (the job's slot count)
    order: Sequence[int] | None = None  # pages in the order their sums arrive (None: 0, 1, 2, ...)
    arrival: float | None = None  # chunks/s the network delivers (None: as fast as the node takes them)
    record_bytes: int = RECORD_BYTES  # one chunk's record (SGD's has no v: 2 * K * 4)

    @property
    def page_bytes(self) -> int:
        return self.page_chunks * self.record_bytes

    @property
    def n_pages(self) -> int:
        return -(-self.n_chunks // self.page_chunks)

    @property
    def copy_bytes(self) -> int:
        return self.n_pages * self.page_bytes


@dataclass(frozen=True)
class Machine:
    disk_read: float  # bytes/s, sequential, page-sized requests
    disk_write: float  # bytes/s, sequential, written back page by page
    update: float  # elements/s of the node's update streamed with a free disk (kernel, per-batch work, copies)
    sync: float = 0.0  # s of a commit's fsync and commit record
    disk_mixed: float | None = None  # bytes/s read + written while reads and writes run at once
    io_cpu: float = 0.0  # CPU seconds per byte read or written (I/O threads and the kernel's share)
    cores: float | None = None  # CPU cores this process gets on a shared machine (None: as many as it wants)
    flush: float = 0.0  # s per byte written that a commit's fsync still takes (a write cache persisting it)

    @property
    def durable_write(self) -> float:
        """bytes/s written and fsynced: the disk's sequential write bandwidth."""
        return 1 / (1 / self.disk_write + self.flush)

    def cpu_time(self, main: float, io: float) -> float:
        """Wall seconds for `main` CPU seconds on one thread and `io` on others, at the cores we get."""
        if self.cores is None:
            return main
        return max(main / min(1.0, self.cores), (main + io) / self.cores)

    def disk_time(self, reads: int, writes: int) -> float:
        """Seconds to read `reads` and write `writes` bytes, both streams running at once as long
        as both have bytes left (at disk_mixed), then the rest alone."""
        both = min(reads, writes)
        mixed = self.disk_mixed or 2 / (1 / self.disk_read + 1 / self.disk_write)  # unknown: in turn
        return 2 * both / mixed + (reads - both) / self.disk_read + (writes - both) / self.disk_write


@dataclass(frozen=True)
class Residency:
    mode: str  # "mapped" (both copies fit) or "stream"
    budget_pages: int
    ahead: int = 0
    behind: int = 0
    resident: frozenset[int] = field(default_factory=frozenset)  # pages kept across steps


@dataclass(frozen=True)
class Prediction:
    step_time: float  # s
    read_bytes: int  # per step
    write_bytes: int
    disk_time: float
    compute_time: float
    arrival_time: float
    bound: str  # "disk", "compute" or "arrival"


def mapped_budget(w: Workload) -> int:
    """The least RAM budget that maps the whole state (both copies) instead of streaming it."""
    return 2 * w.copy_bytes


def least_budget(w: Workload) -> int:
    """The least RAM budget decide() accepts: the whole state mapped, or MIN_PAGES pages streamed."""
    return min(mapped_budget(w), MIN_PAGES * w.page_bytes)


def decide(budget_bytes: int, w: Workload, map_whole: bool = True) -> Residency:
    """The residency and prefetch depth for a RAM budget (bytes of state buffers); map_whole=False
    streams even a state that fits (tests of the pipeline)."""
    pages = budget_bytes // w.page_bytes
    if map_whole and budget_bytes >= mapped_budget(w):
        return Residency("mapped", pages, resident=frozenset(range(w.n_pages)))
    if pages < MIN_PAGES:
        raise PlanError(f"RAM budget {budget_bytes} B holds {pages} pages of {w.page_bytes} B; need >= {MIN_PAGES}")
    free = pages - ACTIVE_UNITS - SPARE_UNITS  # >= 1
    ahead = min(free, math.ceil(w.window / w.page_chunks) + 1)
    behind = max(0, min(BEHIND, free - ahead))
    keep = max(0, min(w.n_pages, free - ahead - behind))
    order = list(range(w.n_pages)) if w.order is None else list(dict.fromkeys(w.order))
    return Residency("stream", pages, max(1, ahead), behind, frozenset(spread(order, keep)))


def spread(order: list[int], keep: int) -> list[int]:
    """`keep` pages of `order`, evenly spaced along it and the first among them: the streamed pages'
    reads then run beside the resident pages' writes all through the step (as the model's mixed
    disk rate assumes), where keeping the first `keep` left every read to the end of the step,
    queued behind the writes."""
    n = len(order)
    return [p for i, p in enumerate(order) if keep and -(-(i + 1) * keep // n) > -(-i * keep // n)]


def predict(r: Residency, w: Workload, m: Machine, durable: bool = True) -> Prediction:
    """The steady-state step time of residency `r` (every step after the first); durable=False:
    commits without fsync (--sync exit), so a mapped state is not written back each step."""
    elements = w.n_chunks * K
    compute = m.cpu_time(elements / m.update, 0.0)
    arrival = 0.0 if w.arrival is None else w.n_chunks / w.arrival
    if r.mode == "mapped" and not durable:  # in the page cache; the kernel writes it back now and then
        return Prediction(max(compute, arrival), 0, 0, 0.0, compute, arrival, "compute" if compute >= arrival else "arrival")
    if r.mode == "mapped":  # updated in place in the page cache, all written back at commit
        disk = w.copy_bytes * (1 / m.disk_write + m.flush)
        compute = m.cpu_time(elements / m.update, m.io_cpu * w.copy_bytes)
        t = max(compute, arrival) + disk + m.sync
        return Prediction(t, 0, w.copy_bytes, disk, compute, arrival, "disk" if disk > compute else "compute")
    streamed = w.n_pages - len(r.resident)
    reads, writes = streamed * w.page_bytes, w.copy_bytes
    t_read = w.page_bytes / m.disk_read
    t_write = w.page_bytes / m.disk_write
    # The updating thread's work (its pwrite copies included in `update`), then the reader's and
    # writer's work (and the kernel's) on top, on the cores we get.
    compute = m.cpu_time(elements / m.update, m.io_cpu * (reads + writes))
    disk = m.disk_time(reads, writes)
    pace = max(disk, compute, arrival)
    bound = "disk" if pace == disk else "compute" if pace == compute else "arrival"
    # Not overlapped: the first streamed read when no resident page comes before it in arrival order
    # (or too few to hide it), the write-back of the last page, the commit's sync.
    order = list(range(w.n_pages)) if w.order is None else list(dict.fromkeys(w.order))
    lead = 0
    for p in order:
        if p not in r.resident:
            break
        lead += 1
    fill = max(0.0, t_read - lead * (compute / w.n_pages))
    # The commit's fsync persists what a write cache acknowledged during the step.
    flush, sync = (writes * m.flush, m.sync) if durable else (0.0, 0.0)
    return Prediction(pace + fill + t_write + sync + flush, reads, writes, disk + flush, compute, arrival, bound)
