"""The aggregation cells of a job, decoded from the switch's registers.

Pure logic: `decode` turns raw register values (read over BMv2's Thrift API,
`mindp.bmthrift`, by `read_job_cells`) into what a person debugging a run wants:
the use each cell holds (epoch, step, chunk), the workers counted (as ids), the
count, the gradients in the sums, the non-finite bit and the partial sums as values. Cell layout and
meaning: docs/P4.md, "Aggregation".
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from mindp.protocol import K, SCALE_BITS

from . import p4info_names as n
from .jobs import JobState

#: The per-cell registers, besides the K accumulators.
CELL_REGISTERS = (n.CELL_TAG_EPOCH, n.CELL_TAG_STEP_CHUNK, n.CELL_BITMAP, n.CELL_COUNT, n.CELL_CONTRIBUTIONS,
                  n.CELL_NONFINITE)
ACC_REGISTERS = tuple(n.CELL_ACC.format(i) for i in range(K))


def cell_index(slot_base: int, slot: int, ver: int) -> int:
    """The register index of one version of one slot (p4src/aggregation.p4)."""
    return (slot_base + slot) * 2 + ver


def signed64(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >> 63 else value


@dataclass(frozen=True)
class Cell:
    slot: int
    ver: int
    index: int
    epoch: int
    step: int
    chunk: int
    workers: list[int]  # worker ids whose gradient is in the sums
    count: int  # members counted (workers; child switches on a parent)
    contributions: int  # gradients in the sums (a child's PARTIAL brings its own count)
    nonfinite: bool
    sums: list[int]  # exact sums, value * 2^24
    mine: bool  # held for the job's current epoch (else: left by an earlier job or incarnation)
    complete: bool

    @property
    def values(self) -> list[float]:
        return [s / (1 << SCALE_BITS) for s in self.sums]

    @property
    def state(self) -> str:
        if not self.mine:
            return "other epoch" if self.epoch else "unused"
        return "complete" if self.complete else "partial"

    def to_dict(self) -> dict:
        return {**asdict(self), "values": self.values, "state": self.state}


@dataclass(frozen=True)
class JobProgress:
    """The job's newest completed step on the switch, when the switch knows it (docs/P4.md)."""
    newest_step: int | None


def decode(job: JobState, slots: list[int], raw: dict[str, dict[int, int]]) -> list[Cell]:
    """Cells of `job` for these slots (both versions each) from {register: {index: value}}."""
    out = []
    for slot in slots:
        for ver in (0, 1):
            i = cell_index(job.slot_base, slot, ver)
            epoch = raw[n.CELL_TAG_EPOCH][i]
            use = raw[n.CELL_TAG_STEP_CHUNK][i] & (1 << 64) - 1  # Thrift reads are signed 64-bit
            bitmap = raw[n.CELL_BITMAP][i] & 0xFFFFFFFF
            mine = epoch == job.epoch
            count = raw[n.CELL_COUNT][i]
            out.append(Cell(
                slot=slot, ver=ver, index=i, epoch=epoch, step=use >> 32, chunk=use & 0xFFFFFFFF,
                workers=[w for w in range(n.MAX_WORKERS) if bitmap >> w & 1], count=count,
                contributions=raw[n.CELL_CONTRIBUTIONS][i],
                nonfinite=bool(raw[n.CELL_NONFINITE][i]), sums=[signed64(raw[a][i]) for a in ACC_REGISTERS],
                mine=mine, complete=mine and count == len(job.workers)))
    return out


def progress(job: JobState, epoch_cell: int, newest_cell: int) -> JobProgress:
    return JobProgress(newest_cell if epoch_cell == job.epoch else None)


def read_job_cells(thrift, job: JobState, slot: int | None = None) -> tuple[list[Cell], JobProgress]:
    """Read and decode over a `mindp.bmthrift.ThriftClient`: one slot (both versions) or all of the job's."""
    slots = list(range(job.slot_count)) if slot is None else [slot]
    if slot is None:
        lo, hi = cell_index(job.slot_base, 0, 0), cell_index(job.slot_base, job.slot_count, 0)
        raw = {}
        for name in (*CELL_REGISTERS, *ACC_REGISTERS):
            values = thrift.register_read_all(name)
            raw[name] = {i: values[i] for i in range(lo, hi)}
    else:
        cells = [cell_index(job.slot_base, slot, v) for v in (0, 1)]
        raw = {name: {i: thrift.register_read(name, i) for i in cells} for name in (*CELL_REGISTERS, *ACC_REGISTERS)}
    prog = progress(job, thrift.register_read(n.JOB_PROGRESS_EPOCH, job.job_id),
                    thrift.register_read(n.JOB_NEWEST_STEP, job.job_id))
    return decode(job, slots, raw), prog


def text(job: JobState, cells: list[Cell], prog: JobProgress, show_all: bool, elements: int = 4) -> str:
    newest = "unknown (no completion in this epoch yet)" if prog.newest_step is None else str(prog.newest_step)
    mine = [c for c in cells if c.mine]
    head = (f"job {job.job_id} (epoch {job.epoch}, {len(job.workers)} workers): slots {job.slot_base}.."
            f"{job.slot_base + job.slot_count - 1}, {len(mine)} of {len(cells)} cells hold a use of this epoch; "
            f"newest completed step {newest}")
    shown = cells if show_all else mine
    if not shown:
        return head
    rows = [[c.slot, c.ver, c.index, c.epoch, c.step, c.chunk, ",".join(map(str, c.workers)) or "-", c.count,
             c.contributions, "yes" if c.nonfinite else "no", c.state,
             ", ".join(f"{v:.6g}" for v in c.values[:elements]) + (", ..." if elements < K else "")]
            for c in shown]
    header = ["slot", "ver", "cell", "epoch", "step", "chunk", "workers", "count", "grads", "nonfinite", "state",
              f"sums (first {elements} of {K})"]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return head + "\n" + "\n".join(lines)
