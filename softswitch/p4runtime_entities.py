"""A P4Runtime TableEntry decoded against the pipeline, as both Write and Read need it: its table,
its match key (the engine's form, checked as BMv2 checks it) and its action with arguments."""
from __future__ import annotations

from p4.config.v1 import p4info_pb2

from .p4runtime_codec import P4RTError, decode_int
from .p4runtime_pipeline import Pipeline, TableInfo


def table_info(pl: Pipeline, table_id: int) -> TableInfo:
    ti = pl.tables.get(table_id)
    if ti is None:
        raise P4RTError("NOT_FOUND" if table_id else "INVALID_ARGUMENT", f"Invalid table id {table_id}")
    return ti


def decode_match(ti: TableInfo, te) -> tuple:
    given = {}
    for fm in te.match:
        if fm.field_id in given:
            raise P4RTError("INVALID_ARGUMENT", f"duplicate match field id {fm.field_id}")
        given[fm.field_id] = fm
    known = {fid for fid, *_ in ti.fields}
    for fid in given:
        if fid not in known:
            raise P4RTError("INVALID_ARGUMENT", f"unknown match field id {fid} in table {ti.table.name}")
    out = []
    for fid, name, width, kind in ti.fields:
        fm = given.get(fid)
        full = (1 << width) - 1
        what = f"{ti.table.name} field {name}"
        if fm is None:
            if kind == "exact":
                raise P4RTError("INVALID_ARGUMENT", f"{what}: exact match field missing")
            out.append({"lpm": (0, 0), "ternary": (0, 0), "optional": (0, 0), "range": (0, full)}[kind])
            continue
        got = fm.WhichOneof("field_match_type")
        if got != kind:
            raise P4RTError("INVALID_ARGUMENT", f"{what}: {got} match given for a {kind} field")
        if kind == "exact":
            out.append(decode_int(fm.exact.value, width, what))
        elif kind == "lpm":
            v = decode_int(fm.lpm.value, width, what)
            plen = fm.lpm.prefix_len
            if not 0 < plen <= width:
                raise P4RTError("INVALID_ARGUMENT", f"{what}: prefix length {plen} out of range")
            if v & ((1 << (width - plen)) - 1):
                raise P4RTError("INVALID_ARGUMENT", f"{what}: LPM value has bits set beyond the prefix")
            out.append((v, plen))
        elif kind == "ternary":
            v = decode_int(fm.ternary.value, width, what)
            m = decode_int(fm.ternary.mask, width, what)
            if m == 0:
                raise P4RTError("INVALID_ARGUMENT", f"{what}: a don't-care ternary field must be omitted")
            if v & ~m:
                raise P4RTError("INVALID_ARGUMENT", f"{what}: ternary value has bits outside the mask")
            out.append((v, m))
        elif kind == "optional":
            out.append((decode_int(fm.optional.value, width, what), full))
        else:
            lo = decode_int(fm.range.low, width, what)
            hi = decode_int(fm.range.high, width, what)
            if lo > hi:
                raise P4RTError("INVALID_ARGUMENT", f"{what}: range low > high")
            if lo == 0 and hi == full:
                raise P4RTError("INVALID_ARGUMENT", f"{what}: a don't-care range must be omitted")
            out.append((lo, hi))
    return tuple(out)


def decode_action(ti: TableInfo, te, default: bool) -> tuple[int, tuple]:
    which = te.action.WhichOneof("type")
    if which != "action":
        raise P4RTError("UNIMPLEMENTED" if which else "INVALID_ARGUMENT",
                        f"{ti.table.name}: only direct actions are supported" if which
                        else f"{ti.table.name}: no action given")
    act = te.action.action
    spec = ti.actions.get(act.action_id)
    if spec is None:
        raise P4RTError("INVALID_ARGUMENT", f"Invalid action id {act.action_id} for table {ti.table.name}")
    jid, params, scope = spec
    if default and scope == p4info_pb2.ActionRef.TABLE_ONLY:
        raise P4RTError("INVALID_ARGUMENT", f"{ti.table.name}: action is TABLE_ONLY, not a default action")
    if not default and scope == p4info_pb2.ActionRef.DEFAULT_ONLY:
        raise P4RTError("INVALID_ARGUMENT", f"{ti.table.name}: action is DEFAULT_ONLY, not for entries")
    given = {}
    for p in act.params:
        if p.param_id in given:
            raise P4RTError("INVALID_ARGUMENT", f"duplicate action parameter id {p.param_id}")
        given[p.param_id] = p.value
    known = {pid for pid, _, _ in params}
    extra = set(given) - known
    if extra:
        raise P4RTError("INVALID_ARGUMENT", f"unknown action parameter id {min(extra)}")
    args = []
    for pid, name, width in params:
        if pid not in given:
            raise P4RTError("INVALID_ARGUMENT", f"action parameter {name} missing")
        args.append(decode_int(given[pid], width, f"action parameter {name}"))
    return jid, tuple(args)
