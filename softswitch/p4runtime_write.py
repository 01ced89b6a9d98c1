"""P4Runtime Write translated to the engine: one Update (table entry, default action, multicast
group, indirect counter) applied to the pipeline's tables and the replication engine, or refused
with the P4RTError (or TableError) BMv2 would give it."""
from __future__ import annotations

from p4.v1 import p4runtime_pb2

from .engine import Groups
from .p4runtime_codec import P4RTError, canonical_entry
from .p4runtime_entities import decode_action, decode_match, table_info
from .p4runtime_pipeline import Pipeline
from .tables import InstalledEntry


def apply_update(pl: Pipeline, groups: Groups, u) -> None:
    """One Update of a Write; `groups`: the engine's multicast groups (Engine.pre)."""
    which = u.entity.WhichOneof("entity")
    U = p4runtime_pb2.Update
    if u.type == U.UNSPECIFIED:
        raise P4RTError("INVALID_ARGUMENT", "update type not set")
    if which == "table_entry":
        write_table_entry(pl, u.type, u.entity.table_entry)
    elif which == "packet_replication_engine_entry":
        pre = u.entity.packet_replication_engine_entry
        if pre.WhichOneof("type") != "multicast_group_entry":
            raise P4RTError("UNIMPLEMENTED", "clone sessions are not supported")
        write_mcast(pl, groups, u.type, pre.multicast_group_entry)
    elif which == "counter_entry":
        write_counter(pl, u.type, u.entity.counter_entry)
    elif which == "register_entry":
        raise P4RTError("UNIMPLEMENTED", "P4Runtime register access is not supported (as BMv2)")
    else:
        raise P4RTError("UNIMPLEMENTED", f"writing {which} is not supported")


def write_table_entry(pl: Pipeline, utype: int, te) -> None:
    U = p4runtime_pb2.Update
    ti = table_info(pl, te.table_id)
    table = ti.table
    if te.is_default_action:
        if utype != U.MODIFY:
            raise P4RTError("INVALID_ARGUMENT", "the default entry can only be modified")
        if len(te.match):
            raise P4RTError("INVALID_ARGUMENT", "a default entry has no match fields")
        if ti.const_default:
            raise P4RTError("PERMISSION_DENIED", f"{table.name} has a const default action")
        if te.HasField("action"):
            jid, args = decode_action(ti, te, default=True)
        else:
            jid, args = ti.initial_default
        table.set_default(jid, args)
        table.default_meta = None
        return
    if te.HasField("action") is False and utype != U.DELETE:
        raise P4RTError("INVALID_ARGUMENT", f"{table.name}: no action given")
    if not ti.fields and utype == U.INSERT:
        raise P4RTError("INVALID_ARGUMENT", f"{table.name} has no key: only its default action can be set")
    match = decode_match(ti, te)
    if utype == U.DELETE:
        table.delete(match, te.priority)
        return
    jid, args = decode_action(ti, te, default=False)
    meta = p4runtime_pb2.TableEntry()
    meta.CopyFrom(te)
    meta.ClearField("counter_data")
    canonical_entry(meta)
    e = InstalledEntry(match, te.priority, jid, args, (), meta=meta)
    if utype == U.INSERT:
        table.insert(e)
        if te.HasField("counter_data"):
            e.counter[0] = te.counter_data.packet_count
            e.counter[1] = te.counter_data.byte_count
    else:
        table.modify(e)


def write_mcast(pl: Pipeline, groups: Groups, utype: int, g) -> None:
    U = p4runtime_pb2.Update
    gid = g.multicast_group_id
    if gid == 0:
        raise P4RTError("INVALID_ARGUMENT", "multicast group id 0 is reserved")
    if utype == U.DELETE:
        if gid not in groups:
            raise P4RTError("NOT_FOUND", f"multicast group {gid} does not exist")
        del groups[gid]
        pl.mcast_meta.pop(gid, None)
        return
    replicas = []
    for r in g.replicas:
        port = r.egress_port if r.WhichOneof("port_kind") != "port" else int.from_bytes(r.port, "big")
        key = (port, r.instance)
        if key in replicas:
            raise P4RTError("INVALID_ARGUMENT", f"duplicate replica (port {port}, instance {r.instance})")
        replicas.append(key)
    if utype == U.INSERT and gid in groups:
        raise P4RTError("ALREADY_EXISTS", f"multicast group {gid} already exists")
    if utype == U.MODIFY and gid not in groups:
        raise P4RTError("NOT_FOUND", f"multicast group {gid} does not exist")
    meta = p4runtime_pb2.MulticastGroupEntry()
    meta.CopyFrom(g)
    pl.mcast_meta[gid] = meta
    groups[gid] = replicas


def write_counter(pl: Pipeline, utype: int, ce) -> None:
    if utype != p4runtime_pb2.Update.MODIFY:
        raise P4RTError("INVALID_ARGUMENT", "counter entries can only be modified")
    info = pl.counters.get(ce.counter_id)
    if info is None:
        raise P4RTError("INVALID_ARGUMENT", f"Invalid counter id {ce.counter_id}")
    name, size, _ = info
    pk, by = pl.program.counters[name]
    idxs = [ce.index.index] if ce.HasField("index") else range(size)
    for i in idxs:
        if not 0 <= i < size:
            raise P4RTError("OUT_OF_RANGE", f"counter index {i} out of range")
        pk[i] = ce.data.packet_count
        by[i] = ce.data.byte_count
