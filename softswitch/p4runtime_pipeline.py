"""The pipeline a P4Runtime controller sets: the compiled BMv2 JSON with the P4Info that describes
it, checked to match, and the P4Info ids mapped to the program's tables, actions and counters."""
from __future__ import annotations

from dataclasses import dataclass, field

from p4.config.v1 import p4info_pb2

from . import compiler
from .compiler_errors import ProgramError
from .p4runtime_codec import P4RTError
from .tables import Table

MATCH_KIND = {2: "exact", 3: "lpm", 4: "ternary", 5: "range", 6: "optional"}


@dataclass
class TableInfo:
    table: Table
    p4info: p4info_pb2.Table
    fields: list  # [(id, name, width, kind)]
    actions: dict  # p4info action id -> (json action id, [(param id, name, width)], scope)
    json_action: dict  # json action id -> p4info action id
    const_default: bool
    initial_default: tuple  # (json action id, args)


@dataclass
class Pipeline:
    p4info: p4info_pb2.P4Info
    device_config: bytes
    cookie: int
    program: compiler.CompiledProgram
    tables: dict[int, TableInfo]
    counters: dict[int, tuple]  # p4info id -> (name, size, unit)
    direct_counters: dict[int, int]  # p4info direct counter id -> p4info table id
    registers: set = field(default_factory=set)
    packet_out: list = field(default_factory=list)  # [(name, width)] of the packet_out header
    packet_in: list = field(default_factory=list)
    mcast_meta: dict = field(default_factory=dict)  # group id -> MulticastGroupEntry as written


def build_pipeline(p4info: p4info_pb2.P4Info, device_config: bytes, cookie: int, drop_port: int) -> Pipeline:
    """Compile the BMv2 JSON and check that the P4Info describes it."""
    try:
        prog = compiler.load(device_config, drop_port)
    except ProgramError as exc:
        raise P4RTError("INVALID_ARGUMENT", f"bad BMv2 JSON device config: {exc}") from None
    actions = {a.preamble.id: a for a in p4info.actions}
    tables: dict[int, TableInfo] = {}
    for t in p4info.tables:
        name = t.preamble.name
        table = prog.tables.get(name)
        if table is None:
            raise P4RTError("INVALID_ARGUMENT", f"P4Info does not match the JSON: no table {name!r} in the JSON")
        if len(t.match_fields) != len(table.keys):
            raise P4RTError("INVALID_ARGUMENT", f"P4Info does not match the JSON: table {name} key has "
                            f"{len(t.match_fields)} fields in P4Info, {len(table.keys)} in the JSON")
        fields = []
        for mf, ks in zip(t.match_fields, table.keys):
            kind = MATCH_KIND.get(mf.match_type)
            if kind is None or mf.bitwidth != ks.width or (kind != ks.kind and ks.kind != "valid"):
                raise P4RTError("INVALID_ARGUMENT", f"P4Info does not match the JSON: table {name} field "
                                f"{mf.name} ({kind}, {mf.bitwidth} bits) vs {ks.kind}, {ks.width} bits")
            fields.append((mf.id, mf.name, mf.bitwidth, kind))
        by_name = {spec.name: aid for aid, spec in table.actions.items()}
        amap, jmap = {}, {}
        for ref in t.action_refs:
            a = actions.get(ref.id)
            if a is None:
                raise P4RTError("INVALID_ARGUMENT", f"P4Info table {name} refers to unknown action id {ref.id}")
            jid = by_name.get(a.preamble.name)
            if jid is None:
                raise P4RTError("INVALID_ARGUMENT",
                                f"P4Info does not match the JSON: action {a.preamble.name} not in table {name}")
            widths = table.actions[jid].param_widths
            params = [(p.id, p.name, p.bitwidth) for p in a.params]
            if [p[2] for p in params] != widths:
                raise P4RTError("INVALID_ARGUMENT",
                                f"P4Info does not match the JSON: parameters of action {a.preamble.name}")
            amap[ref.id] = (jid, params, ref.scope)
            jmap[jid] = ref.id
        initial = (table.default_action_id, table.default_args)
        tables[t.preamble.id] = TableInfo(table, t, fields, amap, jmap,
                                          table.default_const or t.const_default_action_id != 0, initial)
    counters = {}
    for c in p4info.counters:
        if c.preamble.name not in prog.counters:
            raise P4RTError("INVALID_ARGUMENT", f"P4Info does not match the JSON: no counter {c.preamble.name!r}")
        counters[c.preamble.id] = (c.preamble.name, c.size, c.spec.unit)
    direct = {}
    for dc in p4info.direct_counters:
        direct[dc.preamble.id] = dc.direct_table_id
        if dc.direct_table_id not in tables:
            raise P4RTError("INVALID_ARGUMENT", f"direct counter {dc.preamble.name} on an unknown table")
    pl = Pipeline(p4info, device_config, cookie, prog, tables, counters, direct,
                  {r.preamble.id for r in p4info.registers})
    for cpm in p4info.controller_packet_metadata:
        md = [(m.name, m.bitwidth) for m in cpm.metadata]
        if cpm.preamble.name == "packet_out":
            pl.packet_out = md
        elif cpm.preamble.name == "packet_in":
            pl.packet_in = md
    return pl
