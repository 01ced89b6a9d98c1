"""The aggregation slot pool: contiguous ranges handed to jobs, first fit.

Pure logic. A job gets [base, base + count); ranges of live jobs are disjoint
(docs/DESIGN.md invariant 5). A freed range is reusable at once because slots clean
themselves (invariant 3: the new job's epoch makes every old cell stale).
No defragmentation: a request that fits the free total but no single gap fails
with a message that says so.
"""
from __future__ import annotations

from dataclasses import dataclass

from .p4info_names import POOL_SLOTS


class SlotError(ValueError):
    """A range that cannot be allocated or recorded; the message says why."""


class PoolExhausted(SlotError):
    pass


class PoolFragmented(SlotError):
    pass


@dataclass(frozen=True)
class SlotRange:
    base: int
    count: int

    @property
    def end(self) -> int:
        return self.base + self.count

    def overlaps(self, other: SlotRange) -> bool:
        return self.base < other.end and other.base < self.end


class SlotPool:
    def __init__(self, size: int = POOL_SLOTS):
        if size < 1:
            raise ValueError("pool size must be >= 1")
        self.size = size
        self._owners: dict[int, SlotRange] = {}  # job id -> range

    def allocate(self, job_id: int, count: int) -> SlotRange:
        """First fit: the lowest gap of at least `count` slots."""
        if job_id in self._owners:
            raise SlotError(f"job {job_id} already holds slots {self._fmt(self._owners[job_id])}")
        if not 1 <= count <= self.size:
            raise SlotError(f"slot count {count} outside 1..{self.size}")
        gaps = self.free_ranges()
        for gap in gaps:
            if gap.count >= count:
                rng = SlotRange(gap.base, count)
                self._owners[job_id] = rng
                return rng
        free = sum(g.count for g in gaps)
        if free < count:
            raise PoolExhausted(f"slot pool exhausted: job {job_id} needs {count} slots, {free} of {self.size} free")
        largest = max(g.count for g in gaps)
        raise PoolFragmented(
            f"slot pool fragmented: job {job_id} needs {count} contiguous slots; {free} free "
            f"but the largest gap is {largest} (delete a job next to a gap, or ask for fewer slots)"
        )

    def claim(self, job_id: int, rng: SlotRange) -> None:
        """Record a range found on the switch (reconcile); it must not overlap another."""
        if rng.count < 1 or rng.base < 0 or rng.end > self.size:
            raise SlotError(f"job {job_id}: slots {self._fmt(rng)} outside the pool 0..{self.size - 1}")
        for other_id, other in self._owners.items():
            if other_id != job_id and other.overlaps(rng):
                raise SlotError(f"job {job_id}: slots {self._fmt(rng)} overlap job {other_id}'s {self._fmt(other)}")
        self._owners[job_id] = rng

    def release(self, job_id: int) -> SlotRange | None:
        return self._owners.pop(job_id, None)

    def owner_of(self, job_id: int) -> SlotRange | None:
        return self._owners.get(job_id)

    @property
    def allocations(self) -> dict[int, SlotRange]:
        return dict(sorted(self._owners.items(), key=lambda kv: kv[1].base))

    def free_ranges(self) -> list[SlotRange]:
        gaps, pos = [], 0
        for rng in sorted(self._owners.values(), key=lambda r: r.base):
            if rng.base > pos:
                gaps.append(SlotRange(pos, rng.base - pos))
            pos = max(pos, rng.end)
        if pos < self.size:
            gaps.append(SlotRange(pos, self.size - pos))
        return gaps

    @property
    def free(self) -> int:
        return sum(g.count for g in self.free_ranges())

    def map(self) -> list[tuple[int, int, int | None]]:
        """(base, count, job id or None for free) for the whole pool, in order."""
        rows = [(r.base, r.count, j) for j, r in self._owners.items()]
        rows += [(g.base, g.count, None) for g in self.free_ranges()]
        return sorted(rows)

    @staticmethod
    def _fmt(rng: SlotRange) -> str:
        return f"{rng.base}..{rng.end - 1}"
