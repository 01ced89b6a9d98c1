"""P4Runtime Read translated from the engine: the entities a ReadRequest names (table entries and
default actions, indirect and direct counters, multicast groups), as BMv2 returns them."""
from __future__ import annotations

from .p4runtime_codec import P4RTError, encode_int
from .p4runtime_entities import decode_match, table_info
from .p4runtime_pipeline import Pipeline

COUNTER_BYTES, COUNTER_PACKETS, COUNTER_BOTH = 1, 2, 3


def read_entity(pl: Pipeline, ent, resp) -> None:
    which = ent.WhichOneof("entity")
    if which == "table_entry":
        read_tables(pl, ent.table_entry, resp)
    elif which == "counter_entry":
        read_counters(pl, ent.counter_entry, resp)
    elif which == "direct_counter_entry":
        read_direct(pl, ent.direct_counter_entry, resp)
    elif which == "packet_replication_engine_entry":
        pre = ent.packet_replication_engine_entry
        if pre.WhichOneof("type") != "multicast_group_entry":
            raise P4RTError("UNIMPLEMENTED", "clone sessions are not supported")
        gid = pre.multicast_group_entry.multicast_group_id
        for g, meta in sorted(pl.mcast_meta.items()):
            if gid in (0, g):
                resp.entities.add().packet_replication_engine_entry.multicast_group_entry.CopyFrom(meta)
    elif which == "register_entry":
        raise P4RTError("UNIMPLEMENTED", "P4Runtime register access is not supported (as BMv2)")
    else:
        raise P4RTError("UNIMPLEMENTED", f"reading {which} is not supported")


def read_tables(pl: Pipeline, req, resp) -> None:
    tids = [req.table_id] if req.table_id else sorted(pl.tables)
    for tid in tids:
        ti = table_info(pl, tid)
        if req.is_default_action:
            out = resp.entities.add().table_entry
            out.table_id = tid
            out.is_default_action = True
            pid = ti.json_action.get(ti.table.default_action_id)
            if pid is not None:
                out.action.action.action_id = pid
                _, params, _ = ti.actions[pid]
                for (p_id, _, width), v in zip(params, ti.table.default_args):
                    prm = out.action.action.params.add()
                    prm.param_id = p_id
                    prm.value = encode_int(v, width)
            continue
        if len(req.match):
            match = decode_match(ti, req)
            e = ti.table.get(match, req.priority)
            entries = [e] if e is not None else []
        else:
            entries = list(ti.table.entries.values())
        for e in entries:
            out = resp.entities.add().table_entry
            out.CopyFrom(e.meta)
            if req.HasField("counter_data") and ti.table.with_counters:
                out.counter_data.packet_count = e.counter[0]
                out.counter_data.byte_count = e.counter[1]


def read_counters(pl: Pipeline, req, resp) -> None:
    cids = [req.counter_id] if req.counter_id else sorted(pl.counters)
    for cid in cids:
        info = pl.counters.get(cid)
        if info is None:
            raise P4RTError("INVALID_ARGUMENT", f"Invalid counter id {cid}")
        name, size, unit = info
        pk, by = pl.program.counters[name]
        if req.HasField("index"):
            i = req.index.index
            if not 0 <= i < size:
                raise P4RTError("OUT_OF_RANGE", f"counter index {i} out of range (size {size})")
            idxs = [i]
        else:
            idxs = range(size)
        for i in idxs:
            out = resp.entities.add().counter_entry
            out.counter_id = cid
            out.index.index = i
            if unit in (COUNTER_PACKETS, COUNTER_BOTH):
                out.data.packet_count = pk[i]
            if unit in (COUNTER_BYTES, COUNTER_BOTH):
                out.data.byte_count = by[i]


def read_direct(pl: Pipeline, req, resp) -> None:
    te = req.table_entry
    tids = [te.table_id] if te.table_id else [tid for tid, ti in pl.tables.items()
                                               if ti.table.with_counters]
    for tid in tids:
        ti = table_info(pl, tid)
        if not ti.table.with_counters:
            raise P4RTError("INVALID_ARGUMENT", f"table {ti.table.name} has no direct counter")
        if len(te.match):
            e = ti.table.get(decode_match(ti, te), te.priority)
            entries = [e] if e else []
        else:
            entries = list(ti.table.entries.values())
        for e in entries:
            out = resp.entities.add().direct_counter_entry
            out.table_entry.CopyFrom(e.meta)
            out.data.packet_count = e.counter[0]
            out.data.byte_count = e.counter[1]
