"""P4Runtime server of the embedded switch (grpcio, the p4runtime package's protos).

Behaves like BMv2's PI server where a client can tell: arbitration by election
id (only the primary writes or sets the pipeline), a Write that fails returns
gRPC UNKNOWN with one p4.v1.Error per update in grpc-status-details-bin, and the
per-update canonical codes BMv2 uses (INVALID_ARGUMENT, ALREADY_EXISTS,
NOT_FOUND, RESOURCE_EXHAUSTED, PERMISSION_DENIED); FAILED_PRECONDITION with no
pipeline; UNIMPLEMENTED for P4Runtime register access, as BMv2.
"""
from __future__ import annotations

import asyncio
import collections
import errno
import functools
import logging
import socket
import threading
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, status_pb2
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from . import compiler
from .compiler_errors import ProgramError
from .engine import Engine
from .tables import InstalledEntry, Table, TableError

log = logging.getLogger("softswitch")
API_VERSION = "1.4.1"
MATCH_KIND = {2: "exact", 3: "lpm", 4: "ternary", 5: "range", 6: "optional"}
COUNTER_BYTES, COUNTER_PACKETS, COUNTER_BOTH = 1, 2, 3
UNARY_THREADS = 16  # unary RPCs in parallel; streams run on the event loop and take none
MAX_STREAMS = 256  # open StreamChannels; more are refused with RESOURCE_EXHAUSTED
STREAM_QUEUE = 1024  # messages waiting for one client that does not read


class P4RTError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def _int(b: bytes, width: int, what: str) -> int:
    if not b:
        raise P4RTError("INVALID_ARGUMENT", f"{what}: empty bytestring")
    v = int.from_bytes(b, "big")
    if v >> width:
        raise P4RTError("INVALID_ARGUMENT", f"{what}: value does not fit in {width} bits")
    return v


def _bytes(v: int, width: int) -> bytes:
    """P4Runtime canonical bytestring: no leading zero bytes, at least one byte."""
    return v.to_bytes(max(1, (v.bit_length() + 7) // 8), "big")


def _canon(b: bytes) -> bytes:
    return b.lstrip(b"\0") or b"\0"


def canonical_entry(te) -> None:
    """Rewrite a TableEntry's bytestrings in canonical form, as reads return them."""
    for fm in te.match:
        kind = fm.WhichOneof("field_match_type")
        if kind == "exact":
            fm.exact.value = _canon(fm.exact.value)
        elif kind == "lpm":
            fm.lpm.value = _canon(fm.lpm.value)
        elif kind == "ternary":
            fm.ternary.value = _canon(fm.ternary.value)
            fm.ternary.mask = _canon(fm.ternary.mask)
        elif kind == "range":
            fm.range.low = _canon(fm.range.low)
            fm.range.high = _canon(fm.range.high)
        elif kind == "optional":
            fm.optional.value = _canon(fm.optional.value)
    for p in te.action.action.params:
        p.value = _canon(p.value)


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


class _Outbox:
    """Messages to one stream's client: put from any thread, awaited on the server's event loop.

    Bounded, so a client that does not read cannot grow the switch: a packet-in beyond the bound is
    dropped (counted by the service); any other message beyond it ends the stream with
    RESOURCE_EXHAUSTED, since the client would otherwise miss an arbitration change."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int):
        self.loop = loop
        self.limit = limit
        self.items: collections.deque = collections.deque()
        self.lock = threading.Lock()
        self.ready = asyncio.Event()
        self.closed = False

    def put(self, item, droppable: bool = False) -> bool:
        """False if the item was not queued (a dropped packet-in, or the stream is ending)."""
        with self.lock:
            if self.closed:
                return False
            if len(self.items) >= self.limit:
                if droppable:
                    return False
                self.items.clear()
                item = (grpc.StatusCode.RESOURCE_EXHAUSTED, "stream closed: the client does not read its messages")
            if item is None or isinstance(item, tuple):
                self.closed = True  # the end (or an error ending the stream) is the last message
            self.items.append(item)
        self.loop.call_soon_threadsafe(self.ready.set)
        return True

    async def get(self):
        while True:
            with self.lock:
                if self.items:
                    return self.items.popleft()
                self.ready.clear()
            await self.ready.wait()


@dataclass(eq=False)
class _Stream:
    outbox: _Outbox
    election_id: int | None = None


def _rpc(*, primary: bool = False, pipeline: bool = False):
    """The checks a unary RPC repeats, in BMv2's order: device id; then, under the service lock,
    the caller is the primary, a pipeline is set. A P4RTError or TableError raised by the method
    ends the call with its canonical code."""
    def wrap(method):
        @functools.wraps(method)
        def handler(self, request, context):
            if request.device_id != self.device_id:
                context.abort(grpc.StatusCode.NOT_FOUND, f"Invalid device id {request.device_id}")
            with self.lock:
                if primary and not self.is_primary(request.election_id):
                    context.abort(grpc.StatusCode.PERMISSION_DENIED, "Not primary")
                if pipeline and self.pipeline is None:
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION, "No forwarding pipeline config set")
                try:
                    return method(self, request, context)
                except (P4RTError, TableError) as exc:
                    context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
        return handler
    return wrap


class SwitchService(p4runtime_pb2_grpc.P4RuntimeServicer):
    """Unary RPCs run on the server's thread pool under `lock`; StreamChannel runs on its event loop
    and takes only `arb_lock` (held for list updates and queue puts), so idle streams hold no thread
    and a long pipeline compile does not stall them."""

    def __init__(self, engine: Engine, device_id: int = 0, drop_port: int = compiler.DEFAULT_DROP_PORT,
                 cpu_port: int | None = None, inject=None):
        self.engine = engine
        self.device_id = device_id
        self.drop_port = drop_port
        self.cpu_port = cpu_port
        self.inject = inject  # callable(frame, port) for packet-out; set by the data plane
        self.pipeline: Pipeline | None = None
        self.saved: Pipeline | None = None
        self.lock = engine.lock  # the compiled path syncs its tables under it: a batch sees whole writes
        self.arb_lock = threading.Lock()
        self.streams: list[_Stream] = []
        self.packet_in_dropped = 0  # packet-ins the primary's full stream queue had no room for
        self.startup_json = b""  # the program given on the command line, until a controller sets one

    def load_startup_program(self, program: compiler.CompiledProgram, json_bytes: bytes) -> bool:
        """Run the command line's program, unless a controller pushed a pipeline meanwhile (it wins)."""
        with self.lock:
            if self.pipeline is not None:
                return False
            self.engine.load(program)
            self.startup_json = json_bytes
            return True

    def running_json(self) -> bytes:
        """The BMv2 JSON the engine runs (b"" with none), as BMv2's bm_get_config returns it."""
        pl = self.pipeline
        return pl.device_config if pl is not None else self.startup_json

    # --- arbitration ----------------------------------------------------
    def primary_election_id(self) -> int | None:
        ids = [s.election_id for s in self.streams if s.election_id is not None]
        return max(ids) if ids else None

    def is_primary(self, election_id) -> bool:
        with self.arb_lock:
            primary = self.primary_election_id()
        return primary is not None and (election_id.high << 64) | election_id.low == primary

    def _notify_all(self) -> None:
        primary = self.primary_election_id()
        for s in self.streams:
            if s.election_id is not None:
                self._send_arbitration(s, primary)

    def _send_arbitration(self, s: _Stream, primary: int | None) -> None:
        resp = p4runtime_pb2.StreamMessageResponse()
        arb = resp.arbitration
        arb.device_id = self.device_id
        if primary is not None:
            arb.election_id.high = primary >> 64
            arb.election_id.low = primary & ((1 << 64) - 1)
        if s.election_id == primary:
            arb.status.code = code_pb2.OK
            arb.status.message = "Is master"
        else:
            arb.status.code = code_pb2.ALREADY_EXISTS
            arb.status.message = "Is slave"
        s.outbox.put(resp)

    async def StreamChannel(self, request_iterator, context):
        s = _Stream(_Outbox(asyncio.get_running_loop(), STREAM_QUEUE))
        with self.arb_lock:
            full = len(self.streams) >= MAX_STREAMS
            if not full:
                self.streams.append(s)
        if full:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"too many streams (at most {MAX_STREAMS})")
        reader = asyncio.ensure_future(self._read_stream(s, request_iterator))
        try:
            while True:
                item = await s.outbox.get()
                if item is None:
                    break
                if isinstance(item, tuple):  # (grpc code, message): end the stream with an error
                    await context.abort(item[0], item[1])
                yield item
        finally:
            reader.cancel()
            with self.arb_lock:
                self.streams.remove(s)
                if s.election_id is not None:
                    self._notify_all()

    async def _read_stream(self, s: _Stream, request_iterator) -> None:
        try:
            async for req in request_iterator:
                if not self._on_stream_message(s, req):
                    break
        except Exception:  # the client went away
            pass
        finally:
            s.outbox.put(None)

    def _on_stream_message(self, s: _Stream, req) -> bool:
        which = req.WhichOneof("update")
        if which == "arbitration":
            arb = req.arbitration
            if arb.device_id != self.device_id:
                s.outbox.put((grpc.StatusCode.NOT_FOUND, f"Invalid device id {arb.device_id}"))
                return False
            eid = (arb.election_id.high << 64) | arb.election_id.low
            with self.arb_lock:
                if any(o is not s and o.election_id == eid for o in self.streams):
                    s.outbox.put((grpc.StatusCode.INVALID_ARGUMENT, "Election id already in use by another client"))
                    return False
                s.election_id = eid
                self._notify_all()
        elif which == "packet":
            with self.arb_lock:
                if s.election_id is None or s.election_id != self.primary_election_id():
                    return True  # only the primary may send packets; ignored like BMv2
            self._packet_out(req.packet)
        return True

    def _packet_out(self, pkt) -> None:
        pl = self.pipeline
        if pl is None or self.inject is None or self.cpu_port is None:
            return
        header = b""
        if pl.packet_out:
            values = {m.metadata_id: m.value for m in pkt.metadata}
            v, bits = 0, 0
            for i, (name, width) in enumerate(pl.packet_out, start=1):
                v = (v << width) | (int.from_bytes(values.get(i, b"\0"), "big") & ((1 << width) - 1))
                bits += width
            header = v.to_bytes((bits + 7) // 8, "big")
        self.inject(header + pkt.payload, self.cpu_port)

    def packet_in(self, frame: bytes) -> None:
        """A frame the pipeline sent to the CPU port: to the primary controller as PacketIn."""
        pl = self.pipeline
        resp = p4runtime_pb2.StreamMessageResponse()
        payload = frame
        if pl and pl.packet_in:
            bits = sum(w for _, w in pl.packet_in)
            nbytes = (bits + 7) // 8
            v = int.from_bytes(frame[:nbytes], "big") >> (nbytes * 8 - bits)
            shift = bits
            for i, (_, width) in enumerate(pl.packet_in, start=1):
                shift -= width
                md = resp.packet.metadata.add()
                md.metadata_id = i
                md.value = _bytes((v >> shift) & ((1 << width) - 1), width)
            payload = frame[nbytes:]
        resp.packet.payload = payload
        with self.arb_lock:
            primary = self.primary_election_id()
            to = [s for s in self.streams if primary is not None and s.election_id == primary]
        for s in to:
            if not s.outbox.put(resp, droppable=True):
                self.packet_in_dropped += 1

    # --- pipeline ---------------------------------------------------------
    @_rpc(primary=True)
    def SetForwardingPipelineConfig(self, request, context):
        A = p4runtime_pb2.SetForwardingPipelineConfigRequest
        action = request.action
        if action == A.UNSPECIFIED:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Invalid SetForwardingPipelineConfig action")
        if action == A.COMMIT:
            if self.saved is None:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, "No saved config to commit")
            self._commit(self.saved)
            self.saved = None
            return p4runtime_pb2.SetForwardingPipelineConfigResponse()
        cfg = request.config
        pl = build_pipeline(cfg.p4info, cfg.p4_device_config, cfg.cookie.cookie, self.drop_port)
        if action == A.VERIFY_AND_SAVE:
            self.saved = pl
        elif action == A.RECONCILE_AND_COMMIT and self.pipeline is not None \
                and self.pipeline.device_config == pl.device_config \
                and self.pipeline.p4info == pl.p4info:
            self.pipeline.cookie = pl.cookie  # same program: keep all state
        elif action != A.VERIFY:
            self._commit(pl)
        return p4runtime_pb2.SetForwardingPipelineConfigResponse()

    def _commit(self, pl: Pipeline) -> None:
        self.pipeline = pl
        self.engine.load(pl.program)
        log.info("pipeline set: %d tables, %d counters", len(pl.tables), len(pl.counters))

    @_rpc()
    def GetForwardingPipelineConfig(self, request, context):
        resp = p4runtime_pb2.GetForwardingPipelineConfigResponse()
        pl = self.pipeline
        if pl is None:
            return resp
        R = p4runtime_pb2.GetForwardingPipelineConfigRequest
        rt = request.response_type
        resp.config.cookie.cookie = pl.cookie
        if rt in (R.ALL, R.P4INFO_AND_COOKIE):
            resp.config.p4info.CopyFrom(pl.p4info)
        if rt in (R.ALL, R.DEVICE_CONFIG_AND_COOKIE):
            resp.config.p4_device_config = pl.device_config
        return resp

    def Capabilities(self, request, context):
        return p4runtime_pb2.CapabilitiesResponse(p4runtime_api_version=API_VERSION)

    # --- write ---------------------------------------------------------------
    @_rpc(primary=True, pipeline=True)
    def Write(self, request, context):
        if request.atomicity != p4runtime_pb2.WriteRequest.CONTINUE_ON_ERROR:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Only CONTINUE_ON_ERROR atomicity is supported")
        results = []
        for u in request.updates:
            try:
                self._update(u)
                results.append(None)
            except (P4RTError, TableError) as exc:
                results.append((exc.code, str(exc)))
        if any(results):
            status = status_pb2.Status(code=code_pb2.UNKNOWN, message="Write failure.")
            for r in results:
                err = p4runtime_pb2.Error()
                if r is None:
                    err.canonical_code = code_pb2.OK
                else:
                    err.canonical_code = getattr(code_pb2, r[0])
                    err.message = r[1]
                    err.space = "ALL-sswitch-p4org"
                a = any_pb2.Any()
                a.Pack(err)
                status.details.append(a)
            context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
            first = next(r for r in results if r)
            context.abort(grpc.StatusCode.UNKNOWN, f"Write failure: {first[1]}")
        return p4runtime_pb2.WriteResponse()

    def _update(self, u) -> None:
        which = u.entity.WhichOneof("entity")
        U = p4runtime_pb2.Update
        if u.type == U.UNSPECIFIED:
            raise P4RTError("INVALID_ARGUMENT", "update type not set")
        if which == "table_entry":
            self._write_table_entry(u.type, u.entity.table_entry)
        elif which == "packet_replication_engine_entry":
            pre = u.entity.packet_replication_engine_entry
            if pre.WhichOneof("type") != "multicast_group_entry":
                raise P4RTError("UNIMPLEMENTED", "clone sessions are not supported")
            self._write_mcast(u.type, pre.multicast_group_entry)
        elif which == "counter_entry":
            self._write_counter(u.type, u.entity.counter_entry)
        elif which == "register_entry":
            raise P4RTError("UNIMPLEMENTED", "P4Runtime register access is not supported (as BMv2)")
        else:
            raise P4RTError("UNIMPLEMENTED", f"writing {which} is not supported")

    def _table(self, table_id: int) -> TableInfo:
        ti = self.pipeline.tables.get(table_id)
        if ti is None:
            raise P4RTError("NOT_FOUND" if table_id else "INVALID_ARGUMENT", f"Invalid table id {table_id}")
        return ti

    def _match(self, ti: TableInfo, te) -> tuple:
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
                out.append(_int(fm.exact.value, width, what))
            elif kind == "lpm":
                v = _int(fm.lpm.value, width, what)
                plen = fm.lpm.prefix_len
                if not 0 < plen <= width:
                    raise P4RTError("INVALID_ARGUMENT", f"{what}: prefix length {plen} out of range")
                if v & ((1 << (width - plen)) - 1):
                    raise P4RTError("INVALID_ARGUMENT", f"{what}: LPM value has bits set beyond the prefix")
                out.append((v, plen))
            elif kind == "ternary":
                v = _int(fm.ternary.value, width, what)
                m = _int(fm.ternary.mask, width, what)
                if m == 0:
                    raise P4RTError("INVALID_ARGUMENT", f"{what}: a don't-care ternary field must be omitted")
                if v & ~m:
                    raise P4RTError("INVALID_ARGUMENT", f"{what}: ternary value has bits outside the mask")
                out.append((v, m))
            elif kind == "optional":
                out.append((_int(fm.optional.value, width, what), full))
            else:
                lo = _int(fm.range.low, width, what)
                hi = _int(fm.range.high, width, what)
                if lo > hi:
                    raise P4RTError("INVALID_ARGUMENT", f"{what}: range low > high")
                if lo == 0 and hi == full:
                    raise P4RTError("INVALID_ARGUMENT", f"{what}: a don't-care range must be omitted")
                out.append((lo, hi))
        return tuple(out)

    def _action(self, ti: TableInfo, te, default: bool) -> tuple[int, tuple]:
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
            args.append(_int(given[pid], width, f"action parameter {name}"))
        return jid, tuple(args)

    def _write_table_entry(self, utype: int, te) -> None:
        U = p4runtime_pb2.Update
        ti = self._table(te.table_id)
        table = ti.table
        if te.is_default_action:
            if utype != U.MODIFY:
                raise P4RTError("INVALID_ARGUMENT", "the default entry can only be modified")
            if len(te.match):
                raise P4RTError("INVALID_ARGUMENT", "a default entry has no match fields")
            if ti.const_default:
                raise P4RTError("PERMISSION_DENIED", f"{table.name} has a const default action")
            if te.HasField("action"):
                jid, args = self._action(ti, te, default=True)
            else:
                jid, args = ti.initial_default
            table.set_default(jid, args)
            table.default_meta = None
            return
        if te.HasField("action") is False and utype != U.DELETE:
            raise P4RTError("INVALID_ARGUMENT", f"{table.name}: no action given")
        if not ti.fields and utype == U.INSERT:
            raise P4RTError("INVALID_ARGUMENT", f"{table.name} has no key: only its default action can be set")
        match = self._match(ti, te)
        if utype == U.DELETE:
            table.delete(match, te.priority)
            return
        jid, args = self._action(ti, te, default=False)
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

    def _write_mcast(self, utype: int, g) -> None:
        U = p4runtime_pb2.Update
        gid = g.multicast_group_id
        if gid == 0:
            raise P4RTError("INVALID_ARGUMENT", "multicast group id 0 is reserved")
        pre = self.engine.pre
        if utype == U.DELETE:
            if gid not in pre:
                raise P4RTError("NOT_FOUND", f"multicast group {gid} does not exist")
            del pre[gid]
            self.pipeline.mcast_meta.pop(gid, None)
            return
        replicas = []
        for r in g.replicas:
            port = r.egress_port if r.WhichOneof("port_kind") != "port" else int.from_bytes(r.port, "big")
            key = (port, r.instance)
            if key in replicas:
                raise P4RTError("INVALID_ARGUMENT", f"duplicate replica (port {port}, instance {r.instance})")
            replicas.append(key)
        if utype == U.INSERT and gid in pre:
            raise P4RTError("ALREADY_EXISTS", f"multicast group {gid} already exists")
        if utype == U.MODIFY and gid not in pre:
            raise P4RTError("NOT_FOUND", f"multicast group {gid} does not exist")
        meta = p4runtime_pb2.MulticastGroupEntry()
        meta.CopyFrom(g)
        self.pipeline.mcast_meta[gid] = meta
        pre[gid] = replicas

    def _write_counter(self, utype: int, ce) -> None:
        if utype != p4runtime_pb2.Update.MODIFY:
            raise P4RTError("INVALID_ARGUMENT", "counter entries can only be modified")
        info = self.pipeline.counters.get(ce.counter_id)
        if info is None:
            raise P4RTError("INVALID_ARGUMENT", f"Invalid counter id {ce.counter_id}")
        name, size, _ = info
        pk, by = self.pipeline.program.counters[name]
        idxs = [ce.index.index] if ce.HasField("index") else range(size)
        for i in idxs:
            if not 0 <= i < size:
                raise P4RTError("OUT_OF_RANGE", f"counter index {i} out of range")
            pk[i] = ce.data.packet_count
            by[i] = ce.data.byte_count

    # --- read ------------------------------------------------------------------
    @_rpc(pipeline=True)
    def Read(self, request, context):
        resp = p4runtime_pb2.ReadResponse()
        for ent in request.entities:
            self._read_entity(ent, resp)
        return iter((resp,))

    def _read_entity(self, ent, resp) -> None:
        which = ent.WhichOneof("entity")
        if which == "table_entry":
            self._read_tables(ent.table_entry, resp)
        elif which == "counter_entry":
            self._read_counters(ent.counter_entry, resp)
        elif which == "direct_counter_entry":
            self._read_direct(ent.direct_counter_entry, resp)
        elif which == "packet_replication_engine_entry":
            pre = ent.packet_replication_engine_entry
            if pre.WhichOneof("type") != "multicast_group_entry":
                raise P4RTError("UNIMPLEMENTED", "clone sessions are not supported")
            gid = pre.multicast_group_entry.multicast_group_id
            for g, meta in sorted(self.pipeline.mcast_meta.items()):
                if gid in (0, g):
                    resp.entities.add().packet_replication_engine_entry.multicast_group_entry.CopyFrom(meta)
        elif which == "register_entry":
            raise P4RTError("UNIMPLEMENTED", "P4Runtime register access is not supported (as BMv2)")
        else:
            raise P4RTError("UNIMPLEMENTED", f"reading {which} is not supported")

    def _read_tables(self, req, resp) -> None:
        tids = [req.table_id] if req.table_id else sorted(self.pipeline.tables)
        for tid in tids:
            ti = self._table(tid)
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
                        prm.value = _bytes(v, width)
                continue
            if len(req.match):
                match = self._match(ti, req)
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

    def _read_counters(self, req, resp) -> None:
        cids = [req.counter_id] if req.counter_id else sorted(self.pipeline.counters)
        for cid in cids:
            info = self.pipeline.counters.get(cid)
            if info is None:
                raise P4RTError("INVALID_ARGUMENT", f"Invalid counter id {cid}")
            name, size, unit = info
            pk, by = self.pipeline.program.counters[name]
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

    def _read_direct(self, req, resp) -> None:
        te = req.table_entry
        tids = [te.table_id] if te.table_id else [tid for tid, ti in self.pipeline.tables.items()
                                                   if ti.table.with_counters]
        for tid in tids:
            ti = self._table(tid)
            if not ti.table.with_counters:
                raise P4RTError("INVALID_ARGUMENT", f"table {ti.table.name} has no direct counter")
            if len(te.match):
                e = ti.table.get(self._match(ti, te), te.priority)
                entries = [e] if e else []
            else:
                entries = list(ti.table.entries.values())
            for e in entries:
                out = resp.entities.add().direct_counter_entry
                out.table_entry.CopyFrom(e.meta)
                out.data.packet_count = e.counter[0]
                out.data.byte_count = e.counter[1]


def server_credentials(cert: str, key: str, cacert: str | None = None,
                       client_auth: bool = False) -> grpc.ServerCredentials:
    """TLS as BMv2's --grpc-server-ssl options give it; with client_auth, clients must present a
    certificate signed by cacert. OSError names a file that cannot be read or holds no PEM
    (gRPC itself would only say that it failed to bind)."""
    def read(path: str) -> bytes:
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError as exc:
            raise OSError(f"cannot read {path}: {exc.strerror}") from None
        if b"-----BEGIN " not in data:
            raise OSError(f"{path} is not a PEM file")
        return data

    return grpc.ssl_server_credentials([(read(key), read(cert))], root_certificates=read(cacert) if cacert else None,
                                       require_client_auth=client_auth)


def check_address_free(addr: str) -> None:
    """OSError naming `addr` if another process listens there. gRPC alone would say only that it
    failed to bind, and without SO_REUSEADDR-only binding two switches could share the port."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or host.startswith("unix"):
        return
    try:
        infos = socket.getaddrinfo(host.strip("[]") or None, int(port), type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"cannot listen on {addr}: {exc.strerror}") from None
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC: TIME_WAIT is no conflict
            try:
                s.bind(sockaddr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise OSError(f"{addr} is already in use by another process") from None
                raise OSError(f"cannot listen on {addr}: {exc.strerror}") from None


class Server:
    """The gRPC server around a SwitchService; plaintext unless given TLS credentials.

    An asyncio server on its own thread: StreamChannel calls are coroutines on its event loop, so
    any number of idle streams leave the unary RPCs (run on a thread pool) free. The port is
    bound without SO_REUSEPORT: a second switch on the same address fails instead of sharing it."""

    def __init__(self, service: SwitchService, addr: str, credentials: grpc.ServerCredentials | None = None):
        self.service = service
        self.addr = addr
        check_address_free(addr)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="p4rt-loop", daemon=True)
        self._thread.start()
        try:
            self.grpc = self._call(self._create(credentials))
        except BaseException:
            self._close_loop()
            raise

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _create(self, credentials):
        srv = grpc.aio.server(futures.ThreadPoolExecutor(max_workers=UNARY_THREADS, thread_name_prefix="p4rt"),
                              options=[("grpc.so_reuseport", 0)])
        p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(self.service, srv)
        try:
            port = srv.add_secure_port(self.addr, credentials) if credentials else srv.add_insecure_port(self.addr)
        except RuntimeError:
            port = 0
        if port == 0:
            raise OSError(f"cannot listen on {self.addr}")
        return srv

    def start(self) -> None:
        self._call(self.grpc.start())

    def stop(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._call(asyncio.wait_for(self.grpc.stop(grace=0.5), 2))
        except (asyncio.TimeoutError, futures.TimeoutError):
            pass
        self._close_loop()

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(2)
        if not self._loop.is_running():
            self._loop.close()
