"""The runtime glue: a BMv2 JSON checked, generated stage by stage into Python source,
compiled, audited and bound to its tables, registers and counters (CompiledProgram)."""
from __future__ import annotations

import hashlib
import json
import random
from array import array
from dataclasses import dataclass, field

from mindp import gcpause
from mindp.switch_constants import MAX_PORT

from .. import diskcache, hashing
from ..compiler_errors import ProgramError, UnsupportedConstruct
from ..tables import Table, noop
from . import registers as reg_store
from . import runtime, shape
from .calculations import generate_calculation
from .deparser import generate_deparser
from .expressions import ExpressionCompiler
from .layout import FieldLayout, build_layout, header_struct
from .parser import generate_parser
from .pipeline import ControlFlow, make_table
from .primitives import generate_action
from .registers import RegisterCells
from .trace import Tracer

DEFAULT_DROP_PORT = MAX_PORT + 1  # BMv2's: v1model's last 9-bit port
INSTANCE_NORMAL = 0
INSTANCE_REPLICATION = 5
INTRINSIC_FIELDS = ("ingress_port", "egress_spec", "egress_port", "instance_type", "packet_length",
                    "mcast_grp", "egress_rid", "checksum_error", "parser_error",
                    "ingress_global_timestamp", "egress_global_timestamp")
REQUIRED_INTRINSICS = ("ingress_port", "egress_spec", "egress_port", "instance_type", "packet_length")
REJECT_IF_PRESENT = [
    ("header_union_types", "header unions"),
    ("header_unions", "header unions"), ("header_union_stacks", "header union stacks"),
    ("parse_vsets", "parser value sets"), ("meter_arrays", "meters"),
    ("learn_lists", "digests (learn lists)"), ("extern_instances", "extern instances"),
]


@dataclass
class CompiledProgram:
    source: str
    ns: dict
    layout: FieldLayout
    tables: dict[str, Table]
    tables_by_id: dict[int, Table]
    registers: dict[str, RegisterCells]
    register_buffers: list  # per group of registers.py: its cells, interleaved
    reg_widths: dict[str, int]
    counters: dict[str, tuple[list, list]]
    counter_direct: dict[str, str]  # direct counter name -> table name
    actions: dict[int, dict]  # JSON actions by id
    init: list
    drop_port: int
    slots: dict[str, int]  # v1model intrinsic fields used by the engine
    program_json: dict = field(repr=False, default_factory=dict)
    traced_ns: dict | None = field(repr=False, default=None)
    # The ProgramBuilder that generated it: its layout, expressions and indexes, which the C
    # generator (softswitch.native) reuses rather than generating the program a second time.
    analysis: ProgramBuilder | None = field(repr=False, default=None)
    # SHA-256 of the JSON it was loaded from: what caches derived from the program are keyed by
    digest: str | None = None

    def traced(self) -> dict:
        """The namespace of the same program compiled with trace calls (built on first use),
        sharing this one's tables, registers and counters."""
        if self.traced_ns is None:
            self.traced_ns = ProgramBuilder(self.program_json, self.drop_port, traced=True).build_traced(self)
        return self.traced_ns


def load(json_bytes: bytes | str, drop_port: int = DEFAULT_DROP_PORT) -> CompiledProgram:
    """Compile a BMv2 JSON; any fault of the program is a one-line ProgramError."""
    try:
        with gcpause.paused():
            return _load(json_bytes, drop_port)
    except ProgramError as exc:
        raise type(exc)(_one_line(str(exc))) from None
    except (KeyError, TypeError, IndexError, ValueError, AttributeError, OverflowError, RecursionError,
            MemoryError) as exc:
        raise ProgramError(_one_line(f"malformed BMv2 JSON: {type(exc).__name__}: {exc}")) from None


def _one_line(message: str, limit: int = 300) -> str:
    """Control characters of names quoted in a message escaped, and the message cut to `limit`."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _load(json_bytes: bytes | str, drop_port: int) -> CompiledProgram:
    try:
        j = json.loads(json_bytes)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ProgramError(f"not valid JSON: {exc}") from None
    if type(drop_port) is not int or not 0 <= drop_port < 1 << 16:
        raise ProgramError(f"drop port {drop_port!r} is not a port number")
    raw = json_bytes.encode("utf-8", "surrogatepass") if isinstance(json_bytes, str) else bytes(json_bytes)
    digest = hashlib.sha256(raw).hexdigest()
    # A large K's program takes seconds to check and generate; the same JSON and code give the same
    # verdict and text, so a later start takes both from the cache (and the audit still runs).
    entry = hashlib.sha256(f"{diskcache.code_version()}\0{drop_port}\0{digest}".encode()).hexdigest() + ".pysrc"
    cached = diskcache.read(entry)
    program = None
    if cached is not None:
        try:
            program = ProgramBuilder(j, drop_port).build(cached.decode())
        except (ProgramError, UnicodeDecodeError):
            program = None  # a damaged entry: checked, generated and replaced below
    if program is None:
        shape.check(j)
        program = ProgramBuilder(j, drop_port).build()
        diskcache.write(entry, program.source.encode())
    program.digest = digest
    return program


class ProgramBuilder:
    """Generated source names every function and object by an index the builder assigns
    (A_<n> actions, P_<n> parser states, K_<n> calculations, T_<n> tables, G_<n> register groups,
    CP_/CB_<n> counters, S_<n> header structs, H_<n> hash algorithms); names and ids of the
    JSON are data only. With `traced`, the source also calls the Tracer `_trace`."""

    def __init__(self, j: dict, drop_port: int, traced: bool = False):
        self.j = j
        self.drop_port = drop_port
        self.traced = traced
        self.lines: list[str] = []
        self.state_names: list[str] = []  # set by the parser stage

    def emit(self, line: str, indent: int = 0) -> None:
        self.lines.append("    " * indent + line)

    # --- lookups shared by the stages ------------------------------------------
    def action(self, action_id) -> str:
        if action_id not in self.action_fn:
            raise ProgramError(f"unknown action id {action_id!r}")
        return self.action_fn[action_id]

    def register(self, param: dict) -> str:
        name = param["value"]
        if param["type"] != "register_array" or name not in self.registers:
            raise ProgramError(f"unknown register {name!r}")
        return name

    def lvalue(self, param: dict) -> int:
        if param["type"] != "field":
            raise UnsupportedConstruct(f"assignment to a {param['type']} (header stacks/unions)")
        return self.layout.field(param["value"])

    # --- building --------------------------------------------------------------
    def build(self, source: str | None = None) -> CompiledProgram:
        """`source`: the text an earlier build of the same JSON by the same code generated."""
        if source is None:
            source = self.generate()
        else:
            self.analyze()
        # one store the Python path, the compiled path (by address) and the servers share (registers.py)
        buffers = reg_store.allocate(self.registers, self.exprs.placement, self.reg_widths)
        registers = reg_store.views(self.registers, self.exprs.placement, buffers)
        counters = {name: (array("Q", bytes(8 * c["size"])), array("Q", bytes(8 * c["size"])))
                    for name, c in self.counters.items()}
        ns = self.namespace(buffers, counters, {})
        runtime.run(source, ns)
        tables = {}
        for name, spec in self.table_specs.items():
            tables[name] = make_table(self, spec, ns)
            ns[self.table_var[name]] = tables[name]
        init = [0] * self.layout.nslots
        for header in self.layout.headers.values():
            if header.metadata:
                init[header.valid] = 1
        return CompiledProgram(source, ns, self.layout, tables, {t.id: t for t in tables.values()}, registers,
                               buffers, self.reg_widths, counters, self.direct_counters, self.actions, init,
                               self.drop_port, self.slots, self.j, analysis=self)

    def build_traced(self, plain: CompiledProgram) -> dict:
        """The traced namespace over `plain`'s tables, registers and counters."""
        source = self.generate()
        ns = self.namespace(plain.register_buffers, plain.counters, plain.tables)
        ns["_trace"] = Tracer(self, plain.tables)
        ns["_actions"] = {-1: noop}  # JSON action id -> traced action function
        runtime.run(source, ns)
        ns["_actions"].update({aid: ns[fn] for aid, fn in self.action_fn.items()})
        return ns

    def namespace(self, register_buffers: list, counters: dict, tables: dict) -> dict:
        ns = runtime.base_namespace()
        ns["_rng"] = random.Random()
        ns["_hmod"] = hashing.hmod
        for i, calculation in enumerate(self.calcs.values()):
            ns[f"H_{i}"] = hashing.ALGOS[calculation["algo"]]
        for g, cells in enumerate(register_buffers):
            ns[f"G_{g}"] = cells
        for i, (packets, octets) in enumerate(counters.values()):
            ns[f"CP_{i}"] = packets
            ns[f"CB_{i}"] = octets
        for i, header in enumerate(self.layout.headers.values()):
            ns[f"S_{i}"] = header_struct(header)
        for name in self.table_specs:
            ns[self.table_var[name]] = tables.get(name)
        if self.traced:
            ns["_trace"] = ns["_actions"] = None
        return ns

    def generate(self) -> str:
        self.analyze()
        return self.emit_program()

    def analyze(self) -> None:
        """Everything but the source text: layout, expressions, indexes, and the checks of the JSON."""
        j = self.j
        for key, what in REJECT_IF_PRESENT:
            items = j.get(key) or []
            if items:
                names = ", ".join(repr(i.get("name", i)) if isinstance(i, dict) else repr(i) for i in items[:3])
                raise UnsupportedConstruct(f"{what} ({names})")
        self.layout = layout = build_layout(j)
        self.header_index = {name: i for i, name in enumerate(layout.headers)}
        self.errors = {name: code for name, code in j.get("errors", [])}
        self.registers = {r["name"]: r["size"] for r in j.get("register_arrays", [])}
        self.reg_widths = {r["name"]: r["bitwidth"] for r in j.get("register_arrays", [])}
        self.exprs = ExpressionCompiler(layout, self.registers, self.reg_widths,
                                        self.errors.get("PacketTooShort", 1))
        self.slots = {}
        for name in INTRINSIC_FIELDS:
            slot = layout.intrinsic(name)
            if slot is not None:
                self.slots[name] = slot
        for name in REQUIRED_INTRINSICS:
            if name not in self.slots:
                raise ProgramError(f"standard_metadata.{name} missing: not a v1model program")
        self.counters = {c["name"]: c for c in j.get("counter_arrays", []) if not c.get("is_direct")}
        for name, counter in self.counters.items():
            if counter.get("size") is None:
                raise ProgramError(f"counter {name!r} has no size")
        self.counter_index = {name: i for i, name in enumerate(self.counters)}
        self.direct_counters = {c["name"]: c.get("binding") for c in j.get("counter_arrays", []) if c.get("is_direct")}
        self.calcs = {c["name"]: c for c in j.get("calculations", [])}
        self.calc_index = {name: i for i, name in enumerate(self.calcs)}
        for calculation in self.calcs.values():
            hashing.check(calculation["algo"], calculation["name"])
        _unique_ids(j.get("actions", []), "actions")
        self.actions = {a["id"]: a for a in j.get("actions", [])}
        self.action_fn = {aid: f"A_{i}" for i, aid in enumerate(self.actions)}
        parsers = j.get("parsers", [])
        if len(parsers) != 1:
            raise UnsupportedConstruct(f"{len(parsers)} parsers (v1model has one)")
        pipelines = {p["name"]: p for p in j["pipelines"]}
        if set(pipelines) != {"ingress", "egress"} or len(j["pipelines"]) != 2:
            raise ProgramError(f"pipelines {sorted(pipelines)}: v1model needs ingress and egress")
        self.table_specs = {}
        for pipeline in pipelines.values():
            if pipeline.get("action_profiles"):
                raise UnsupportedConstruct(f"action profiles ({pipeline['action_profiles'][0]['name']!r})")
            for table in pipeline.get("tables", []):
                if table["name"] in self.table_specs:
                    raise ProgramError(f"two tables named {table['name']!r}")
                self.table_specs[table["name"]] = table
        self.table_number = {name: i for i, name in enumerate(self.table_specs)}
        self.table_var = {name: f"T_{i}" for name, i in self.table_number.items()}
        deparsers = j.get("deparsers", [])
        if len(deparsers) != 1:
            raise UnsupportedConstruct(f"{len(deparsers)} deparsers (v1model has one)")

    def emit_program(self) -> str:
        """The source text (after analyze)."""
        j = self.j
        self.emit("# generated by softswitch.compiler from a BMv2 JSON; do not edit")
        for action in self.actions.values():
            generate_action(self, action)
        for calculation in self.calcs.values():
            generate_calculation(self, calculation)
        generate_parser(self, j["parsers"][0])
        for pipeline in j["pipelines"]:
            ControlFlow(self, pipeline).generate()
        generate_deparser(self, j["deparsers"][0])
        return "\n".join(self.lines) + "\n"


def _unique_ids(items: list, what: str) -> None:
    seen = set()
    for item in items:
        if item["id"] in seen:
            raise ProgramError(f"two {what} with id {item['id']}")
        seen.add(item["id"])
