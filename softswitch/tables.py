"""Match-action tables of the embedded switch, independent of P4Runtime.

A lookup returns a result tuple `(hit, action_id, action_fn, args, direct_counter)`
that the generated pipeline code unpacks. Exact tables are dicts keyed by the
field value (one key field) or a tuple of values; the other kinds scan entries in
priority order (LPM: longest prefix first).
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Callable

Result = tuple  # (hit: bool, action_id: int, fn, args: tuple, ctr: list | None)
#: Changes to any table so far: one read tells the compiled path whether to look for changed tables.
CHANGES = [0]


class TableError(ValueError):
    """A bad entry; `code` is the P4Runtime canonical code name to report."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass
class KeySpec:
    name: str
    kind: str  # exact | lpm | ternary | range | optional | valid
    width: int


@dataclass
class ActionSpec:
    id: int
    name: str
    fn: Callable
    param_widths: list[int]


@dataclass
class InstalledEntry:
    """One installed entry. `match` holds, per key field: exact -> value; lpm -> (value, prefix);
    ternary/optional -> (value, mask); range -> (lo, hi)."""

    match: tuple
    priority: int
    action_id: int
    args: tuple
    result: Result
    counter: array = field(default_factory=lambda: array("Q", (0, 0)))  # (packets, bytes), shared with C
    meta: object = None  # the control plane's own copy (P4Runtime TableEntry)


class Table:
    def __init__(self, name: str, tid: int, keys: list[KeySpec], size: int,
                 actions: dict[int, ActionSpec], with_counters: bool = False):
        self.name = name
        self.id = tid
        self.keys = keys
        self.size = size
        self.actions = actions
        self.with_counters = with_counters
        self.exact = all(k.kind in ("exact", "valid") for k in keys)
        self.d: dict = {}  # exact tables: key -> result
        self.entries: dict = {}  # canonical match (+ priority) -> InstalledEntry
        self._scan: list = []
        self.default_action_id = -1
        self.default_args: tuple = ()
        self.default_const = False
        self.default_meta = None  # P4Runtime default entry as last written
        self.miss: Result = (False, -1, noop, (), None)
        self.version = 0  # moves after every change the data plane sees (the compiled path rebuilds)

    # --- data plane -----------------------------------------------------
    def lookup(self, key) -> Result:
        for masks, vals, ranges, r in self._scan:
            for k, m, v in zip(key, masks, vals):
                if k & m != v:
                    break
            else:
                if ranges is None or all(lo <= key[i] <= hi for i, lo, hi in ranges):
                    return r
        return self.miss

    # --- control plane --------------------------------------------------
    def _changed(self) -> None:
        self.version += 1
        CHANGES[0] += 1

    def set_default(self, action_id: int, args: tuple) -> None:
        act = self.actions.get(action_id)
        if act is None:
            raise TableError("INVALID_ARGUMENT", f"action {action_id} not in table {self.name}")
        self.default_action_id = action_id
        self.default_args = tuple(args)
        self.miss = (False, action_id, act.fn, self.default_args, None)
        self._changed()

    def _result(self, e: InstalledEntry) -> Result:
        act = self.actions[e.action_id]
        if not isinstance(e.counter, array):
            e.counter = array("Q", e.counter)
        return (True, e.action_id, act.fn, e.args, e.counter if self.with_counters else None)

    def _canonical(self, match: tuple, priority: int):
        if self.exact:
            return match[0] if len(match) == 1 else match
        return (match, priority if self._needs_priority() else 0)

    def _needs_priority(self) -> bool:
        return any(k.kind in ("ternary", "range", "optional") for k in self.keys)

    def check_match(self, match: tuple, priority: int) -> None:
        if len(match) != len(self.keys):
            raise TableError("INVALID_ARGUMENT", f"{self.name}: {len(match)} key fields, table has {len(self.keys)}")
        if self._needs_priority():
            if priority <= 0:
                raise TableError("INVALID_ARGUMENT", f"{self.name}: a ternary/range/optional table needs priority > 0")
        elif priority != 0:
            raise TableError("INVALID_ARGUMENT", f"{self.name}: priority must be 0 for exact/lpm tables")

    def get(self, match: tuple, priority: int) -> InstalledEntry | None:
        return self.entries.get(self._canonical(match, priority))

    def insert(self, e: InstalledEntry) -> None:
        self.check_match(e.match, e.priority)
        ck = self._canonical(e.match, e.priority)
        if ck in self.entries:
            raise TableError("ALREADY_EXISTS", f"{self.name}: entry already exists")
        if len(self.entries) >= self.size:
            raise TableError("RESOURCE_EXHAUSTED", f"{self.name}: table full ({self.size} entries)")
        e.result = self._result(e)
        self.entries[ck] = e
        self._publish(ck, e)

    def modify(self, e: InstalledEntry) -> InstalledEntry:
        self.check_match(e.match, e.priority)
        ck = self._canonical(e.match, e.priority)
        old = self.entries.get(ck)
        if old is None:
            raise TableError("NOT_FOUND", f"{self.name}: no such entry")
        e.counter = old.counter
        e.result = self._result(e)
        self.entries[ck] = e
        self._publish(ck, e)
        return old

    def delete(self, match: tuple, priority: int) -> InstalledEntry:
        self.check_match(match, priority)
        ck = self._canonical(match, priority)
        old = self.entries.pop(ck, None)
        if old is None:
            raise TableError("NOT_FOUND", f"{self.name}: no such entry")
        if self.exact:
            self.d.pop(ck, None)
        else:
            self._rebuild()
        self._changed()
        return old

    def clear(self) -> None:
        self.entries.clear()
        self.d = {}
        self._scan = []
        self._changed()

    def _publish(self, ck, e: InstalledEntry) -> None:
        if self.exact:
            self.d[ck] = e.result
        else:
            self._rebuild()
        self._changed()

    def _rebuild(self) -> None:
        rows = []
        for (match, priority), e in self.entries.items():
            masks, vals, ranges = [], [], []
            order = priority
            for i, (spec, m) in enumerate(zip(self.keys, match)):
                full = (1 << spec.width) - 1
                if spec.kind in ("exact", "valid"):
                    masks.append(full)
                    vals.append(m)
                elif spec.kind == "lpm":
                    value, plen = m
                    mask = full ^ ((1 << (spec.width - plen)) - 1)
                    masks.append(mask)
                    vals.append(value & mask)
                    if not self._needs_priority():
                        order = plen
                elif spec.kind in ("ternary", "optional"):
                    value, mask = m
                    masks.append(mask)
                    vals.append(value & mask)
                else:  # range
                    masks.append(0)
                    vals.append(0)
                    ranges.append((i, m[0], m[1]))
            rows.append((order, (tuple(masks), tuple(vals), tuple(ranges) or None, e.result)))
        rows.sort(key=lambda r: -r[0])
        self._scan = [r for _, r in rows]


def noop(f, a):
    pass
