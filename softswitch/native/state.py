"""The compiled program's view of the switch state, and the batch call.

Registers, counters and direct counters are the SAME memory for both paths and for the servers:
`array('Q')` objects of CompiledProgram (each register group's buffer, each counter's, each table
entry's) whose buffers the C code gets by address. Tables and multicast groups are flattened into numpy arrays here, rebuilt when a table's
`version` or the groups' `version` moved, before a batch and under the engine's lock (held by the
P4Runtime server for a whole Write), so a batch sees all of a write or none of it."""
from __future__ import annotations

import ctypes
from array import array

import numpy as np

from .. import tables as tables_module
from ..batch import Batch
from .cprogram import PRE_WORDS, TABLE_WORDS, CtxLayout
from .cpipeline import STAT_DROPPED, STAT_ERRORS, STAT_MCAST_EMPTY
from .serve import ServeLoop, error

U64 = (1 << 64) - 1
_DUMMY = np.zeros(1, np.uint64)
HUGE_PAGE = 2 << 20
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def huge_pages(cells: array) -> None:
    """Back the whole 2 MiB pages inside `cells`' buffer by transparent huge pages, contents kept
    (MADV_COLLAPSE, Linux 6.1+). A large K's register pool is megabytes that every packet touches
    somewhere new: with 4 KiB pages each packet's run of a cell costs TLB misses. A hint: where the
    kernel refuses (no THP, an older kernel), the pages stay as they are."""
    address, n = cells.buffer_info()
    first = -(-address // HUGE_PAGE) * HUGE_PAGE
    end = (address + n * cells.itemsize) // HUGE_PAGE * HUGE_PAGE
    if end > first:
        _libc.madvise(first, end - first, MADV_HUGEPAGE)
        _libc.madvise(first, end - first, MADV_COLLAPSE)


def key_hash(key: tuple) -> int:
    """prelude.h's key_hash."""
    h = 0x9E3779B97F4A7C15
    for k in key:
        h ^= k
        h = (h * 0xBF58476D1CE4E5B9) & U64
        h ^= h >> 31
    return h


def _address(a) -> int:
    if isinstance(a, np.ndarray):
        return a.ctypes.data
    return a.buffer_info()[0]


def _fits(v) -> bool:
    return 0 <= v <= U64


class FlatTable:
    """One Table as prelude.h's mtable_t words, with the arrays they point at kept alive."""

    def __init__(self, table):
        keys = table.keys
        nk = len(keys)
        if nk and table.exact:
            rows = [((k,) if not isinstance(k, tuple) else k, r) for k, r in list(table.d.items())]
            rows = [(tuple(int(x) for x in k), r) for k, r in rows if all(_fits(int(x)) for x in k)]
        elif nk:
            rows = []
            for masks, vals, ranges, r in list(table._scan):
                lo, hi = [0] * nk, [U64] * nk
                for i, a, b in ranges or ():
                    lo[i], hi[i] = max(a, 0), min(b, U64)
                if all(_fits(v) for v in vals) and all(a <= U64 and b >= 0 for a, b in zip(lo, hi)):
                    rows.append(((tuple(m & U64 for m in masks), tuple(vals), tuple(lo), tuple(hi)), r))
        else:
            rows = []
        miss = table.miss
        # room for every parameter of every action of the table: no read past a row
        nargs = max([len(r[3]) for _, r in rows] + [len(miss[3]), 1] +
                    [len(a.param_widths) for a in table.actions.values()])
        n = len(rows)
        self.aid = np.array([r[1] for _, r in rows] or [0], np.int64)
        args = np.zeros((max(n, 1), nargs), np.uint64)
        for i, (_, r) in enumerate(rows):
            args[i, :len(r[3])] = [v & U64 for v in r[3]]
        self.args = args
        self.counters = [r[4] for _, r in rows]  # kept alive while C may hold their addresses
        self.ctr = np.array([_address(c) if c is not None else 0 for c in self.counters] or [0], np.uint64)
        self.miss_args = np.zeros(nargs, np.uint64)
        self.miss_args[:len(miss[3])] = [v & U64 for v in miss[3]]
        self.masks = self.lo = self.hi = _DUMMY
        hcap = 0
        if nk and table.exact:
            self.vals = np.array([k for k, _ in rows] or [[0] * nk], np.uint64).reshape(-1)
            hcap = 1
            while hcap < 2 * n:
                hcap *= 2
            slots = np.full(hcap, -1, np.int64)
            for i, (k, _) in enumerate(rows):
                s = key_hash(k) & (hcap - 1)
                while slots[s] >= 0:
                    s = (s + 1) & (hcap - 1)
                slots[s] = i
            self.slots = slots
        else:
            self.slots = np.full(1, -1, np.int64)
            self.masks = np.array([k[0] for k, _ in rows] or [[0] * max(nk, 1)], np.uint64).reshape(-1)
            self.vals = np.array([k[1] for k, _ in rows] or [[0] * max(nk, 1)], np.uint64).reshape(-1)
            self.lo = np.array([k[2] for k, _ in rows] or [[0] * max(nk, 1)], np.uint64).reshape(-1)
            self.hi = np.array([k[3] for k, _ in rows] or [[0] * max(nk, 1)], np.uint64).reshape(-1)
        self.words = [n, nk, nargs, hcap, _address(self.masks), _address(self.vals), _address(self.lo),
                      _address(self.hi), _address(self.slots), _address(self.aid), _address(self.args),
                      _address(self.ctr), miss[1] & U64, _address(self.miss_args)]
        assert len(self.words) == TABLE_WORDS


class FlatGroups:
    """The multicast groups as prelude.h's pre_t words."""

    def __init__(self, groups: dict):
        items = list(groups.items())
        self.gid = np.array([g for g, _ in items] or [0], np.int64)
        first = [0]
        for _, replicas in items:
            first.append(first[-1] + len(replicas))
        self.first = np.array(first, np.int64)
        self.port = np.array([p for _, reps in items for p, _ in reps] or [0], np.int64)
        self.rid = np.array([r for _, reps in items for _, r in reps] or [0], np.int64)
        self.most = most = max([1] + [len(reps) for _, reps in items])
        self.words = [len(items), most, _address(self.gid), _address(self.first), _address(self.port),
                      _address(self.rid)]
        assert len(self.words) == PRE_WORDS


class NativeRunner:
    """Engine.run_batch on the compiled program `fn` (build.load) of `program`."""

    def __init__(self, program, engine, layout: CtxLayout, lib, fn):
        self.program = program
        self.engine = engine
        self.layout = layout
        self.lib = lib  # keeps the shared object loaded
        self.fn = fn
        self.tables = list(program.tables.values())
        self.ctx = np.zeros(layout.words, np.uint64)
        self.ctx[0] = int(engine._t0 * 1e9) & U64
        for g, cells in enumerate(program.register_buffers):
            self.ctx[layout.group(g)] = _address(_cells(cells))
            huge_pages(cells)
        for i, (packets, octets) in enumerate(program.counters.values()):
            self.ctx[layout.packets(i)] = _address(_cells(packets))
            self.ctx[layout.octets(i)] = _address(_cells(octets))
        self.flat_tables: list[FlatTable | None] = [None] * len(self.tables)
        self.seen_tables = [-1] * len(self.tables)
        self.seen_changes = -1
        self.flat_groups: FlatGroups | None = None
        self.seen_groups = (None, -1)
        self.ctx_address = self.ctx.ctypes.data
        self.txn = (ctypes.c_int64 * 1)()
        self.stats = (ctypes.c_uint64 * 4)()
        self.stats_address = ctypes.addressof(self.stats)
        self._rx = self._tx = None
        self.sync(force=True)

    def changed(self) -> bool:
        groups = self.engine.pre
        return tables_module.CHANGES[0] != self.seen_changes or groups is not self.seen_groups[0] or \
            groups.version != self.seen_groups[1]

    def sync(self, force: bool = False) -> None:
        """Rebuild what changed since the last batch, if no writer is in the middle of a write."""
        lock = self.engine.lock
        if not lock.acquire(blocking=force):
            return  # a write is under way: this batch sees the state before it
        try:
            self.seen_changes = tables_module.CHANGES[0]
            groups = self.engine.pre
            for i, t in enumerate(self.tables):
                version = t.version
                if version != self.seen_tables[i]:
                    self.flat_tables[i] = flat = FlatTable(t)
                    at = self.layout.table(i)
                    self.ctx[at:at + TABLE_WORDS] = flat.words
                    self.seen_tables[i] = version
            if groups is not self.seen_groups[0] or groups.version != self.seen_groups[1]:
                version = groups.version
                self.flat_groups = flat = FlatGroups(groups)
                self.ctx[self.layout.pre:self.layout.pre + PRE_WORDS] = flat.words
                self.seen_groups = (groups, version)
        finally:
            lock.release()

    def run_batch(self, rx: Batch, start: int, tx: Batch) -> int:
        if self.changed():
            self.sync()
        if rx is not self._rx:
            self._rx, self._rxp = rx, (rx.buf.ctypes.data, rx.lens.ctypes.data, rx.ports.ctypes.data)
        if tx is not self._tx:
            self._tx, self._txp = tx, (tx.buf.ctypes.data, tx.lens.ctypes.data, tx.ports.ctypes.data)
        rbuf, rlens, rports = self._rxp
        tbuf, tlens, tports = self._txp
        txn = self.txn
        txn[0] = tx.n
        stats = self.stats
        nxt = self.fn(self.ctx_address, rbuf, rlens, rports, rx.buf.shape[1], start, rx.n, tbuf, tlens, tports,
                      len(tx.lens), txn, stats)
        tx.n = txn[0]
        self._fold_stats()
        return nxt

    def serve(self, loop: ServeLoop) -> int | None:
        """io.h's packet loop over `loop`'s ports until they run dry or its budget is spent; the
        receives it made, or None where it cannot serve (one packet's replicas would not fit the
        output batch, which the Python loop handles frame by frame)."""
        if self.changed():
            self.sync()
        if self.flat_groups is not None and self.flat_groups.most > loop.tx.capacity:
            return None
        got = self.lib.mindp_serve(self.ctx_address, loop.address(self.stats_address))
        self._fold_stats()
        if got < 0:
            raise error(got)
        return got

    def _fold_stats(self) -> None:
        stats = self.stats
        if stats[STAT_DROPPED] or stats[STAT_MCAST_EMPTY] or stats[STAT_ERRORS]:
            s = self.engine.stats
            s.dropped += stats[STAT_DROPPED]
            s.mcast_empty += stats[STAT_MCAST_EMPTY]
            s.errors += stats[STAT_ERRORS]
            ctypes.memset(stats, 0, ctypes.sizeof(stats))


def _cells(cells):
    if not isinstance(cells, array) or cells.typecode != "Q":
        raise TypeError("register or counter storage is not array('Q')")
    return cells
