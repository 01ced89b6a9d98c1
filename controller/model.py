"""What the controller writes to the switch, as plain data: table entries and
multicast groups, and the ordered changes between two configurations.

Pure logic, no I/O. Values are Python ints, MAC strings ("02:00:...") and
dotted IPv4 strings; p4runtime.py encodes them with the P4Info.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


@dataclass
class Entry:
    """One table entry: match fields -> action(params).

    A match value is an int or address string for an exact field and an inclusive
    (lo, hi) tuple for a range field; tables with a range field need priority > 0
    (P4Runtime), exact-only tables priority 0.
    """
    table: str
    match: dict[str, int | str | tuple[int, int]]
    action: str
    params: dict[str, int | str] = field(default_factory=dict)
    priority: int = 0

    def key(self) -> tuple:
        return (self.table, tuple(sorted(self.match.items())), self.priority)

    def same_action(self, other: Entry) -> bool:
        return self.action == other.action and self.params == other.params

    def to_dict(self) -> dict:
        out = {"table": self.table, "match": {k: list(v) if isinstance(v, tuple) else v for k, v in self.match.items()},
               "action": self.action, "params": dict(self.params)}
        if self.priority:
            out["priority"] = self.priority
        return out


@dataclass
class Group:
    """A PRE multicast group: replicas (egress port, replication id), kept sorted."""
    group_id: int
    replicas: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.replicas = sorted((int(p), int(r)) for p, r in self.replicas)

    def to_dict(self) -> dict:
        return {"group_id": self.group_id, "replicas": [{"port": p, "rid": r} for p, r in self.replicas]}


class OpKind(enum.Enum):
    INSERT = "insert"
    MODIFY = "modify"
    DELETE = "delete"


@dataclass
class Op:
    kind: OpKind
    item: Entry | Group  # the new value (the old one for DELETE)
    previous: Entry | Group | None = None  # the value a MODIFY replaces

    def inverse(self) -> Op:
        if self.kind is OpKind.INSERT:
            return Op(OpKind.DELETE, self.item)
        if self.kind is OpKind.DELETE:
            return Op(OpKind.INSERT, self.item)
        return Op(OpKind.MODIFY, self.previous, self.item)

    def describe(self) -> str:
        if isinstance(self.item, Group):
            return f"{self.kind.value} multicast group {self.item.group_id}"
        return f"{self.kind.value} {self.item.table.rsplit('.', 1)[-1]} {self.item.match}"


def diff_entries(old: list[Entry], new: list[Entry]) -> tuple[list[Op], list[Op]]:
    """(inserts and modifies, deletes) turning `old` into `new`."""
    before = {e.key(): e for e in old}
    after = {e.key(): e for e in new}
    upserts = []
    for k, e in after.items():
        if k not in before:
            upserts.append(Op(OpKind.INSERT, e))
        elif not before[k].same_action(e):
            upserts.append(Op(OpKind.MODIFY, e, before[k]))
    deletes = [Op(OpKind.DELETE, e) for k, e in before.items() if k not in after]
    return upserts, deletes


def diff_group(old: Group | None, new: Group | None) -> tuple[list[Op], list[Op]]:
    if old is None and new is None:
        return [], []
    if old is None:
        return [Op(OpKind.INSERT, new)], []
    if new is None:
        return [], [Op(OpKind.DELETE, old)]
    if old.replicas != new.replicas:
        return [Op(OpKind.MODIFY, new, old)], []
    return [], []
