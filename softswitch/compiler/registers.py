"""Where register cells live: the registers of one size share one buffer, cell by cell
(cell c of the group's j-th register at c * R + j, R registers in the group).

Why: a program's per-element registers (a chunk's K accumulators, all indexed by the same cell)
then keep one cell's values side by side: a packet touches one contiguous run of memory, not a
cache line and a page in each of K arrays, and the compiled pipeline reads and writes the run with
vector loads. The Python pipeline indexes the same buffers (`G_<g>[i * R + j]`), the servers and
tests see each register as a sequence of its own (`RegisterCells`), and the compiled pipeline gets
each buffer's address: one store for all of them."""
from __future__ import annotations

from array import array
from dataclasses import dataclass

FIELD_BITS = 64  # wider registers hold Python ints (a list), never seen by the compiled pipeline


@dataclass(frozen=True)
class Placement:
    group: int
    stride: int  # registers in the group
    offset: int  # this register's place among them


def place(sizes: dict[str, int], widths: dict[str, int]) -> dict[str, Placement]:
    """Each register's group (registers of one size and storage kind, in the program's order)."""
    groups: dict[tuple[int, bool], list[str]] = {}
    for name, size in sizes.items():
        groups.setdefault((size, widths[name] > FIELD_BITS), []).append(name)
    return {name: Placement(g, len(names), j)
            for g, names in enumerate(groups.values()) for j, name in enumerate(names)}


def allocate(sizes: dict[str, int], placement: dict[str, Placement], widths: dict[str, int]) -> list:
    """The zeroed buffer of each group: array('Q'), or a list of ints for registers over 64 bits."""
    buffers: dict[int, object] = {}
    for name, p in placement.items():
        if p.group not in buffers:
            n = sizes[name] * p.stride
            buffers[p.group] = array("Q", bytes(8 * n)) if widths[name] <= FIELD_BITS else [0] * n
    return [buffers[g] for g in range(len(buffers))]


class RegisterCells:
    """One register's cells in its group's buffer, as a sequence (len, index, iterate, assign)."""

    __slots__ = ("buffer", "stride", "offset", "size")

    def __init__(self, buffer, stride: int, offset: int, size: int):
        self.buffer, self.stride, self.offset, self.size = buffer, stride, offset, size

    def __len__(self) -> int:
        return self.size

    def _at(self, i: int) -> int:
        if i < 0:
            i += self.size
        if not 0 <= i < self.size:
            raise IndexError("register index out of range")
        return i * self.stride + self.offset

    def __getitem__(self, i: int) -> int:
        return self.buffer[self._at(i)]

    def __setitem__(self, i: int, value: int) -> None:
        self.buffer[self._at(i)] = value

    def __iter__(self):
        return iter(self.buffer[self.offset::self.stride])

    def __eq__(self, other) -> bool:
        return isinstance(other, RegisterCells) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"RegisterCells({list(self)!r})"


def views(sizes: dict[str, int], placement: dict[str, Placement], buffers: list) -> dict[str, RegisterCells]:
    return {name: RegisterCells(buffers[p.group], p.stride, p.offset, sizes[name]) for name, p in placement.items()}
