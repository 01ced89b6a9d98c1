"""Compile a BMv2 JSON (p4c-bm2-ss, v1model) into Python source, once.

The packet state is one flat list `f` of ints: for each header instance its
validity slot followed by its fields (metadata headers are always valid), plus
hidden slots (ingress length, packet length register). Parser states, actions,
pipelines and the deparser become Python functions over `f` whose text is
generated here and exec'd; nothing looks at the JSON per packet.

Expressions follow bmv2's: values are unbounded integers, p4c inserts the masks
that give bit<W> its wrap-around, fields are truncated (unsigned) or wrapped to
two's complement (signed) on assignment. Masks that cannot change a value (its
width is already known to fit) are elided, and subexpressions repeated in a
straight-line action are computed once.

Anything the compiler does not implement is rejected at load time with its name
(`UnsupportedConstruct`), never ignored.
"""
from __future__ import annotations

import json
import logging
import re
import struct
import sys
import types
from dataclasses import dataclass, field

from . import hashing, program_shape
from .compiler_errors import ProgramError, UnsupportedConstruct
from .tables import ActionSpec, KeySpec, Table, noop

DEFAULT_DROP_PORT = 511
INSTANCE_NORMAL = 0
INSTANCE_REPLICATION = 5
trace_log = logging.getLogger("softswitch.trace")
SHIFT_CAP = 1 << 13  # runtime shift amounts beyond any field width all give 0 after masking


def _hex(s: str) -> int:
    neg = s.startswith("-")
    v = int(s[1:] if neg else s, 16)
    return -v if neg else v


@dataclass
class HeaderLayout:
    name: str
    valid: int  # slot of the validity bit; fields follow
    fields: list[tuple[str, int, bool]]  # (name, width, signed)
    metadata: bool

    @property
    def first(self) -> int:
        return self.valid + 1

    @property
    def end(self) -> int:
        return self.valid + 1 + len(self.fields)

    @property
    def nbits(self) -> int:
        return sum(w for _, w, _ in self.fields)

    def index(self, fname: str) -> int:
        for i, (n, _, _) in enumerate(self.fields):
            if n == fname:
                return self.first + i
        raise ProgramError(f"header {self.name} has no field {fname!r}")


@dataclass
class Layout:
    headers: dict[str, HeaderLayout]
    widths: list[int]  # per slot (validity: 1)
    signed: list[bool]
    nslots: int
    ilen: int  # hidden: ingress length (counter bytes)
    plen: int  # hidden: packet length register (add/remove_header)
    aliases: dict[str, tuple[str, str]] = field(default_factory=dict)
    # header stack -> (hidden slot of its next index, its element headers in order)
    stacks: dict[str, tuple[int, list[HeaderLayout]]] = field(default_factory=dict)

    def stack(self, name: str) -> tuple[int, list[HeaderLayout]]:
        if name not in self.stacks:
            raise ProgramError(f"unknown header stack {name!r}")
        return self.stacks[name]

    def field(self, ref) -> int:
        hname, fname = ref
        h = self.headers.get(hname)
        if h is None:
            raise ProgramError(f"unknown header instance {hname!r}")
        if fname == "$valid$":
            return h.valid
        return h.index(fname)

    def std(self, fname: str) -> int | None:
        """A v1model intrinsic field, through field_aliases (e.g. intrinsic_metadata.mcast_grp)."""
        for alias, target in self.aliases.items():
            if alias.endswith("." + fname):
                return self.field(target)
        h = self.headers.get("standard_metadata")
        if h and any(n == fname for n, _, _ in h.fields):
            return h.index(fname)
        return None


def build_layout(j: dict) -> Layout:
    types = {}
    for ht in j.get("header_types", []):
        fields = []
        for fdef in ht["fields"]:
            name, width = fdef[0], fdef[1]
            signed = bool(fdef[2]) if len(fdef) > 2 else False
            if not isinstance(width, int):
                raise UnsupportedConstruct(f"varbit field {ht['name']}.{name}")
            if name == "$valid$":
                continue
            fields.append((name, width, signed))
        types[ht["name"]] = fields
    headers: dict[str, HeaderLayout] = {}
    widths: list[int] = []
    signed: list[bool] = []
    for h in j.get("headers", []):
        if h["header_type"] not in types:
            raise ProgramError(f"header {h['name']}: unknown type {h['header_type']!r}")
        hl = HeaderLayout(h["name"], len(widths), types[h["header_type"]], bool(h.get("metadata")))
        headers[h["name"]] = hl
        widths.append(1)
        signed.append(False)
        for _, w, s in hl.fields:
            widths.append(w)
            signed.append(s)
    ilen = len(widths)
    plen = ilen + 1
    widths += [32, 32]
    signed += [False, False]
    by_id = {h["id"]: h["name"] for h in j.get("headers", [])}
    stacks = {}
    for st in j.get("header_stacks", []):
        elems = [headers[by_id[i]] for i in st["header_ids"]]
        if any([w for _, w, _ in e.fields] != [w for _, w, _ in elems[0].fields] for e in elems):
            raise ProgramError(f"header stack {st['name']}: elements of different types")
        stacks[st["name"]] = (len(widths), elems)
        widths.append(32)
        signed.append(False)
    aliases = {a[0]: tuple(a[1]) for a in j.get("field_aliases", [])}
    return Layout(headers, widths, signed, len(widths), ilen, plen, aliases, stacks)


# --- expressions -------------------------------------------------------------
# Normalised nodes (hashable tuples):
#   ("c", value)  ("b", bool)  ("f", slot)  ("a", index, width)  ("valid", slot)
#   ("lk", bit_offset, width)  ("reg", name, index_node)
#   (op, left, right) / ("?", cond, left, right) / (unop, None, right)

BOOL_OPS = {"==", "!=", "<", ">", "<=", ">=", "and", "or", "not", "valid", "d2b", "b"}


class ExprCompiler:
    def __init__(self, layout: Layout, registers: dict[str, int], reg_widths: dict[str, int]):
        self.layout = layout
        self.registers = registers
        self.reg_widths = reg_widths
        self.register_index = {name: i for i, name in enumerate(registers)}

    # JSON -> node
    def node(self, tv, params: list[int] | None = None):
        t = tv["type"]
        v = tv["value"]
        if t == "expression":
            if isinstance(v, dict) and "op" not in v:  # {"type":"expression","value":{...}}
                return self.node(v, params)
            return self.op(v, params)
        if t == "field":
            return ("f", self.layout.field(v))
        if t == "hexstr":
            return ("c", _hex(v))
        if t == "bool":
            return ("b", bool(v))
        if t in ("runtime_data", "local"):
            if params is None or not 0 <= v < len(params):
                raise ProgramError(f"runtime_data {v} outside an action or out of range")
            return ("a", v, params[v])
        if t == "header":
            if v not in self.layout.headers:
                raise ProgramError(f"unknown header {v!r}")
            return ("hdr", v)
        if t == "lookahead":
            return ("lk", v[0], v[1])
        if t == "register":
            name, idx = v
            if name not in self.registers:
                raise ProgramError(f"unknown register {name!r}")
            return ("reg", name, self.node(idx, params))
        raise UnsupportedConstruct(f"expression operand of type {t!r}")

    def op(self, e: dict, params):
        op = e["op"]
        left = e.get("left")
        right = e.get("right")
        if op == "valid":
            r = self.node(right, params)
            if r[0] != "hdr":
                raise UnsupportedConstruct("valid() on a non-header operand")
            return ("valid", self.layout.headers[r[1]].valid)
        if op == "?":
            return ("?", self.node(e["cond"], params), self.node(left, params), self.node(right, params))
        if op in ("two_comp_mod", "usat_cast", "sat_cast"):
            w = self.node(right, params)
            if w[0] != "c":
                raise UnsupportedConstruct(f"{op} with a runtime width")
            if not 1 <= w[1] <= program_shape.MAX_WIDTH:
                raise ProgramError(f"{op} to a width of {w[1]} bits")
            return (op, self.node(left, params), w)
        if op in ("not", "~", "d2b", "b2d"):
            return (op, None, self.node(right, params))
        if op == "last_stack_index" and right.get("type") == "header_stack":
            nxt, _ = self.layout.stack(right["value"])
            return ("-", ("f", nxt), ("c", 1))
        if op == "-" and left is None:
            return ("-", ("c", 0), self.node(right, params))
        if op in ("+", "-", "*", "/", "%", "<<", ">>", "==", "!=", "<", ">", "<=", ">=",
                  "and", "or", "&", "|", "^"):
            return self.simplify((op, self.node(left, params), self.node(right, params)))
        raise UnsupportedConstruct(f"expression operator {op!r}")

    def simplify(self, n):
        op, l, r = n
        if op == "&" and r[0] == "c" and r[1] >= 0:
            m = r[1]
            if l[0] == "&" and l[2][0] == "c" and l[2][1] >= 0:
                return self.simplify(("&", l[1], ("c", l[2][1] & m)))
            w = self.width(l)
            if w is not None and (m + 1) & m == 0 and w <= m.bit_length():
                return l
        return n

    def width(self, n) -> int | None:
        """Bits needed for the value if it is known non-negative, else None."""
        k = n[0]
        if k == "c":
            return n[1].bit_length() if n[1] >= 0 else None
        if k == "f":
            return None if self.layout.signed[n[1]] else self.layout.widths[n[1]]
        if k == "a":
            return n[2]
        if k == "lk":
            return n[2]
        if k == "reg":
            return self.reg_widths[n[1]]
        if k in BOOL_OPS or k == "b2d":
            return 1
        if k == "?":
            a, b = self.width(n[2]), self.width(n[3])
            return None if a is None or b is None else max(a, b)
        if k == "two_comp_mod" or k == "sat_cast":
            return None
        if k == "usat_cast":
            return n[2][1]
        l, r = n[1], n[2]
        wl = self.width(l) if l is not None else None
        wr = self.width(r) if r is not None else None
        if k == "&":
            known = [w for w in (wl, wr) if w is not None]
            return min(known) if known else None
        if k in ("|", "^"):
            return None if wl is None or wr is None else max(wl, wr)
        if k == "+":
            return None if wl is None or wr is None else max(wl, wr) + 1
        if k == "*":
            return None if wl is None or wr is None else wl + wr
        if k in ("/", "%"):
            return wl
        if k == ">>":
            if wl is None:
                return None
            return max(wl - r[1], 0) if r[0] == "c" else wl
        if k == "<<":
            if wl is None or r[0] != "c":
                return None
            return wl + r[1]
        return None


def _leaves(n, out: set):
    if not isinstance(n, tuple):
        return
    if n[0] in ("f", "valid"):
        out.add(n[1])
    for c in n[1:]:
        if isinstance(c, tuple):
            _leaves(c, out)


def _has_reg(n) -> bool:
    if not isinstance(n, tuple):
        return False
    if n[0] in ("reg", "lk"):
        return True
    return any(_has_reg(c) for c in n[1:] if isinstance(c, tuple))


def _count(n, counts: dict):
    if not isinstance(n, tuple) or n[0] in ("c", "b", "a", "hdr"):
        return
    counts[n] = counts.get(n, 0) + 1
    if counts[n] > 1:
        return  # children were counted with the first occurrence
    for c in n[1:]:
        if isinstance(c, tuple):
            _count(c, counts)


class Emitter:
    """Python text for nodes, with common subexpressions bound to locals."""

    def __init__(self, ec: ExprCompiler, counts: dict | None = None):
        self.ec = ec
        self.counts = counts or {}
        self.avail: dict = {}  # node -> temp name
        self.deps: dict = {}  # temp name -> slots read
        self.n = 0
        self.pre: list[str] = []

    def invalidate(self, slots) -> None:
        slots = set(slots)
        for node, name in list(self.avail.items()):
            if self.deps[name] & slots:
                del self.avail[node]

    def invalidate_regs(self) -> None:
        for node, name in list(self.avail.items()):
            if _has_reg(node):
                del self.avail[node]

    def take_pre(self) -> list[str]:
        pre, self.pre = self.pre, []
        return pre

    def expr(self, n) -> str:
        if n in self.avail:
            return self.avail[n]
        code = self._expr(n)
        if self.counts.get(n, 0) > 1 and n[0] not in ("c", "b", "a") and not _has_reg(n):
            name = f"_t{self.n}"
            self.n += 1
            self.pre.append(f"{name} = {code}")
            self.avail[n] = name
            deps = set()
            _leaves(n, deps)
            self.deps[name] = deps
            return name
        return code

    def cond(self, n) -> str:
        return self.expr(n)

    def _expr(self, n) -> str:
        k = n[0]
        e = self.expr
        if k == "c":
            return str(n[1]) if n[1] >= 0 else f"({n[1]})"
        if k == "b":
            return "True" if n[1] else "False"
        if k == "f":
            return f"f[{n[1]}]"
        if k == "valid":
            return f"(f[{n[1]}] == 1)"
        if k == "a":
            return f"a[{n[1]}]"
        if k == "lk":
            return f"_lookahead(data, off, {n[1]}, {n[2]})"
        if k == "reg":
            name = n[1]
            size = self.ec.registers[name]
            idx = e(n[2])
            return f"(R_{self.ec.register_index[name]}[{idx}] if {idx} < {size} else 0)"
        if k == "?":
            return f"({e(n[2])} if {e(n[1])} else {e(n[3])})"
        if k == "not":
            return f"(not {e(n[2])})"
        if k == "~":
            return f"(~{e(n[2])})"
        if k == "d2b":
            return f"({e(n[2])} != 0)"
        if k == "b2d":
            return f"(1 if {e(n[2])} else 0)"
        if k == "two_comp_mod":
            w = n[2][1]
            h = 1 << (w - 1)
            return f"((({e(n[1])} + {h}) & {(1 << w) - 1}) - {h})"
        if k == "usat_cast":
            w = n[2][1]
            return f"min(max({e(n[1])}, 0), {(1 << w) - 1})"
        if k == "sat_cast":
            w = n[2][1]
            return f"min(max({e(n[1])}, {-(1 << (w - 1))}), {(1 << (w - 1)) - 1})"
        op, l, r = n
        if op == "and":
            return f"({e(l)} and {e(r)})"
        if op == "or":
            return f"({e(l)} or {e(r)})"
        if op == "/":
            return f"_div({e(l)}, {e(r)})"
        if op == "%":
            return f"_mod({e(l)}, {e(r)})"
        if op == "<<" and (r[0] != "c" or not 0 <= r[1] < SHIFT_CAP):
            return f"_shl({e(l)}, {e(r)})"
        if op == ">>" and (r[0] != "c" or not 0 <= r[1] < SHIFT_CAP):
            return f"_shr({e(l)}, {e(r)})"
        return f"({e(l)} {op} {e(r)})"

    def store(self, slot: int, n) -> str:
        """`f[slot] = value`, truncated/wrapped to the field's width when needed."""
        w = self.ec.layout.widths[slot]
        code = self.expr(n)
        if self.ec.layout.signed[slot]:
            h = 1 << (w - 1)
            code = f"((({code}) + {h}) & {(1 << w) - 1}) - {h}"
        else:
            nw = self.ec.width(n)
            if nw is None or nw > w:
                code = f"{code} & {(1 << w) - 1}"
        return f"f[{slot}] = {code}"


def _int(v) -> str:
    """An integer of the JSON as source text; anything else never reaches generated code."""
    if type(v) is not int:
        raise ProgramError(f"expected an integer, got {v!r:.40}")
    return str(v)


def _div(a, b):
    return a // b if b > 0 and a >= 0 else 0


def _mod(a, b):
    return a % b if b > 0 and a >= 0 else 0


def _shl(a, b):
    return a << b if b < SHIFT_CAP else 0


def _shr(a, b):
    return a >> b if b < SHIFT_CAP else (-1 if a < 0 else 0)


class ParserError(Exception):
    """A parser error; `off` is where the packet's payload starts (bytes extracted so far)."""

    def __init__(self, code: int, off: int):
        self.code = code
        self.off = off


class _Exit(Exception):
    pass


def _lookahead(data, off, bit_off, width):
    start = off + bit_off // 8
    end = off + (bit_off + width + 7) // 8
    if end > len(data):
        raise ParserError(_lookahead.too_short, off)
    v = int.from_bytes(data[start:end], "big")
    return (v >> ((end - start) * 8 - bit_off % 8 - width)) & ((1 << width) - 1)


# --- the program ---------------------------------------------------------------
SUPPORTED_PRIMITIVES = {
    "assign", "assign_header", "add_header", "remove_header", "mark_to_drop", "drop",
    "register_read", "register_write", "count", "modify_field_with_hash_based_offset",
    "modify_field_rng_uniform", "exit", "log_msg", "assume", "assert", "push", "pop",
}
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
    layout: Layout
    tables: dict[str, Table]
    tables_by_id: dict[int, Table]
    registers: dict[str, list]
    reg_widths: dict[str, int]
    counters: dict[str, tuple[list, list]]
    counter_direct: dict[str, str]  # direct counter name -> table name
    actions: dict[int, dict]  # JSON actions by id
    init: list
    drop_port: int
    slots: dict[str, int]  # v1model intrinsic fields used by the engine
    program_json: dict = field(repr=False, default_factory=dict)
    traced_ns: dict | None = field(repr=False, default=None)

    def traced(self) -> dict:
        """The namespace of the same program compiled with trace calls (built on first use),
        sharing this one's tables, registers and counters."""
        if self.traced_ns is None:
            self.traced_ns = ProgramBuilder(self.program_json, self.drop_port, traced=True).build_traced(self)
        return self.traced_ns


class Tracer:
    """What traced code calls: one DEBUG line per parser state, extracted header, table
    lookup, register write and counter update, on the "softswitch.trace" logger. Names come
    from the JSON as data, shown with repr() so a line stays one line."""

    def __init__(self, builder: "ProgramBuilder", tables: dict[str, Table]):
        self.states: list[str] = []  # filled by gen_parser
        self.headers = list(builder.layout.headers)
        self.tables = [tables[name] for name in builder.table_specs]
        self.registers = list(builder.registers)
        self.counters = list(builder.counters)
        self.param_names = {aid: [rd.get("name", f"p{i}") for i, rd in enumerate(a.get("runtime_data", []))]
                            for aid, a in builder.actions.items()}
        self.errors = {code: name for name, code in builder.errors.items()}
        self.packet = 0
        self.log = trace_log

    def state(self, i: int) -> None:
        self.log.debug("pkt %d: parser state %r", self.packet, self.states[i])

    def extract(self, i: int) -> None:
        self.log.debug("pkt %d: extracted header %r", self.packet, self.headers[i])

    def parser_error(self, code: int) -> None:
        self.log.debug("pkt %d: parser error %s", self.packet, self.errors.get(code, code))

    def table(self, i: int, result) -> None:
        table = self.tables[i]
        hit, aid, _, args, _ = result
        spec = table.actions.get(aid)
        params = ", ".join(f"{n}={v:#x}" for n, v in zip(self.param_names.get(aid, []), args))
        self.log.debug("pkt %d: table %r: %s, action %r(%s)", self.packet, table.name,
                       "hit" if hit else "miss", spec.name if spec else "NoAction", params)

    def reg(self, i: int, index: int, value: int) -> None:
        self.log.debug("pkt %d: register %r[%d] <- %d", self.packet, self.registers[i], index, value)

    def count(self, i: int, index: int) -> None:
        self.log.debug("pkt %d: counter %r[%d] += 1", self.packet, self.counters[i], index)


def load(json_bytes: bytes | str, drop_port: int = DEFAULT_DROP_PORT) -> CompiledProgram:
    """Compile a BMv2 JSON; any fault of the program is a one-line ProgramError."""
    try:
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
    program_shape.check(j)
    return ProgramBuilder(j, drop_port).build()


def _unique_ids(items: list, what: str) -> None:
    seen = set()
    for item in items:
        if item["id"] in seen:
            raise ProgramError(f"two {what} with id {item['id']}")
        seen.add(item["id"])


# What the compiled program may name besides the compiler's own `[A-Z]+_<n>` objects and `_t<n>`
# temporaries, and the only constants it may hold besides integers: nothing of the JSON's text.
_GENERATED_NAME = re.compile(r"(?:[A-Z]{1,2}_\d+|_t\d+)\Z")
_CODE_NAMES = frozenset({
    "<module>", "state", "extract", "table", "reg", "count", "parser_error", "f", "a", "data", "off", "v", "n", "k", "pad", "out", "st", "e", "_r", "_aid", "_nv", "_n",
    "pipe_ingress", "pipe_egress", "parse", "deparse", "min", "max", "len", "int",
    "d", "get", "miss", "lookup", "unpack_from", "pack", "to_bytes", "from_bytes", "append", "randint",
    "code", "join",
})
_CODE_STRINGS = ("big", b"")
_BUILTINS = {"min": min, "max": max, "len": len, "int": int}


def _audit(code: types.CodeType, allowed: frozenset) -> None:
    """Refuse compiled code naming anything or holding a constant the compiler did not make."""
    for name in (code.co_name,) + code.co_names + code.co_varnames + code.co_cellvars + code.co_freevars:
        if name not in allowed and not _GENERATED_NAME.match(name):
            raise ProgramError(f"internal: generated code uses the name {name[:40]!r}")
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _audit(const, allowed)
        elif isinstance(const, tuple):
            if not all(type(x) is int for x in const):
                raise ProgramError("internal: generated code holds a constant that is not an integer")
        elif not (const is None or type(const) in (int, bool) or const in _CODE_STRINGS):
            raise ProgramError("internal: generated code holds a constant that is not an integer")


class ProgramBuilder:
    """Generated source names every function and object by an index the builder assigns
    (A_<n> actions, P_<n> parser states, K_<n> calculations, T_<n> tables, R_<n> registers,
    CP_/CB_<n> counters, S_<n> header structs, H_<n> hash algorithms); names and ids of the
    JSON are data only."""

    def __init__(self, j: dict, drop_port: int, traced: bool = False):
        self.j = j
        self.drop_port = drop_port
        self.traced = traced  # emit _trace.* calls (see Tracer)
        self.lines: list[str] = []

    def w(self, line: str, ind: int = 0) -> None:
        self.lines.append("    " * ind + line)

    def build(self) -> CompiledProgram:
        source = self.generate()
        registers = {name: [0] * size for name, size in self.registers.items()}
        counters = {name: ([0] * c["size"], [0] * c["size"]) for name, c in self.counters.items()}
        ns = self.namespace(registers, counters, {})
        self.run(source, ns)
        tables = {}
        for name, t in self.table_specs.items():
            tables[name] = self.make_table(t, ns)
            ns[self.table_var[name]] = tables[name]
        init = [0] * self.layout.nslots
        for h in self.layout.headers.values():
            if h.metadata:
                init[h.valid] = 1
        return CompiledProgram(source, ns, self.layout, tables, {t.id: t for t in tables.values()}, registers,
                               self.reg_widths, counters, self.direct_counters, self.actions, init, self.drop_port,
                               self.slots, self.j)

    def build_traced(self, plain: CompiledProgram) -> dict:
        """The traced namespace over `plain`'s state."""
        source = self.generate()
        ns = self.namespace(plain.registers, plain.counters, plain.tables)
        tracer = Tracer(self, plain.tables)
        tracer.states = self.state_names
        ns["_trace"] = tracer
        ns["_actions"] = {-1: noop}
        self.run(source, ns)
        ns["_actions"].update({aid: ns[fn] for aid, fn in self.action_fn.items()})
        return ns

    def namespace(self, registers: dict, counters: dict, tables: dict) -> dict:
        ns: dict = {
            "__builtins__": dict(_BUILTINS),
            "_div": _div, "_mod": _mod, "_shl": _shl, "_shr": _shr, "_lookahead": _lookahead,
            "PErr": ParserError, "_Exit": _Exit, "_rng": __import__("random").Random(),
        }
        ns["_hmod"] = hashing.namespace()["_hmod"]
        for i, c in enumerate(self.calcs.values()):
            ns[f"H_{i}"] = hashing.ALGOS[c["algo"]]
        for i, cells in enumerate(registers.values()):
            ns[f"R_{i}"] = cells
        for i, (pk, by) in enumerate(counters.values()):
            ns[f"CP_{i}"] = pk
            ns[f"CB_{i}"] = by
        for i, h in enumerate(self.layout.headers.values()):
            ns[f"S_{i}"] = self.header_struct(h)
        for name in self.table_specs:
            ns[self.table_var[name]] = tables.get(name)
        if self.traced:
            ns["_trace"] = ns["_actions"] = None
        return ns

    @staticmethod
    def run(source: str, ns: dict) -> None:
        try:
            code = compile(source, "<softswitch program>", "exec")
        except (SyntaxError, RecursionError) as exc:
            raise ProgramError(f"internal: generated code does not compile: {exc}") from None
        _audit(code, _CODE_NAMES | set(ns))
        exec(code, ns)

    def generate(self) -> str:
        j = self.j
        for key, what in REJECT_IF_PRESENT:
            items = j.get(key) or []
            if items:
                names = ", ".join(repr(i.get("name", i)) if isinstance(i, dict) else repr(i) for i in items[:3])
                raise UnsupportedConstruct(f"{what} ({names})")
        self.layout = L = build_layout(j)
        self.header_index = {name: i for i, name in enumerate(L.headers)}
        self.errors = {name: code for name, code in j.get("errors", [])}
        _lookahead.too_short = self.errors.get("PacketTooShort", 1)
        self.registers = {r["name"]: r["size"] for r in j.get("register_arrays", [])}
        self.reg_widths = {r["name"]: r["bitwidth"] for r in j.get("register_arrays", [])}
        self.ec = ExprCompiler(L, self.registers, self.reg_widths)
        slots = {}
        for name in ("ingress_port", "egress_spec", "egress_port", "instance_type", "packet_length",
                     "mcast_grp", "egress_rid", "checksum_error", "parser_error",
                     "ingress_global_timestamp", "egress_global_timestamp"):
            s = L.std(name)
            if s is not None:
                slots[name] = s
        for req in ("ingress_port", "egress_spec", "egress_port", "instance_type", "packet_length"):
            if req not in slots:
                raise ProgramError(f"standard_metadata.{req} missing: not a v1model program")
        self.slots = slots
        self.counters = {c["name"]: c for c in j.get("counter_arrays", []) if not c.get("is_direct")}
        for name, c in self.counters.items():
            if c.get("size") is None:
                raise ProgramError(f"counter {name!r} has no size")
        self.counter_index = {name: i for i, name in enumerate(self.counters)}
        self.direct_counters = {c["name"]: c.get("binding") for c in j.get("counter_arrays", []) if c.get("is_direct")}
        self.calcs = {c["name"]: c for c in j.get("calculations", [])}
        self.calc_index = {name: i for i, name in enumerate(self.calcs)}
        for c in self.calcs.values():
            hashing.check(c["algo"], c["name"])
        _unique_ids(j.get("actions", []), "actions")
        self.actions = {a["id"]: a for a in j.get("actions", [])}
        self.action_fn = {aid: f"A_{i}" for i, aid in enumerate(self.actions)}

        self.w("# generated by softswitch.compiler from a BMv2 JSON; do not edit")
        for aid, a in self.actions.items():
            self.gen_action(a)
        for c in self.calcs.values():
            self.gen_calc(c)
        parsers = j.get("parsers", [])
        if len(parsers) != 1:
            raise UnsupportedConstruct(f"{len(parsers)} parsers (v1model has one)")
        pipes = {p["name"]: p for p in j["pipelines"]}
        if set(pipes) != {"ingress", "egress"} or len(j["pipelines"]) != 2:
            raise ProgramError(f"pipelines {sorted(pipes)}: v1model needs ingress and egress")
        self.table_specs = {}
        for p in pipes.values():
            for t in p.get("tables", []):
                if t["name"] in self.table_specs:
                    raise ProgramError(f"two tables named {t['name']!r}")
                self.table_specs[t["name"]] = t
        self.table_var = {name: f"T_{i}" for i, name in enumerate(self.table_specs)}
        self.gen_parser(parsers[0])
        for p in pipes.values():
            if p.get("action_profiles"):
                raise UnsupportedConstruct(f"action profiles ({p['action_profiles'][0]['name']!r})")
            self.gen_pipeline(p)
        deps = j.get("deparsers", [])
        if len(deps) != 1:
            raise UnsupportedConstruct(f"{len(deps)} deparsers (v1model has one)")
        self.gen_deparser(deps[0])
        return "\n".join(self.lines) + "\n"

    def action(self, aid) -> str:
        if aid not in self.action_fn:
            raise ProgramError(f"unknown action id {aid!r}")
        return self.action_fn[aid]

    def register(self, param: dict) -> str:
        name = param["value"]
        if param["type"] != "register_array" or name not in self.registers:
            raise ProgramError(f"unknown register {name!r}")
        return name

    # --- actions ---------------------------------------------------------
    def prim_param(self, p, params):
        return self.ec.node(p, params)

    def gen_action(self, a: dict) -> None:
        params = [rd["bitwidth"] for rd in a.get("runtime_data", [])]
        prims = a.get("primitives", [])
        for p in prims:
            if p["op"] not in SUPPORTED_PRIMITIVES:
                raise UnsupportedConstruct(f"primitive {p['op']!r} in action {a['name']!r}")
        self.w(f"def {self.action_fn[a['id']]}(f, a):")
        body = self.gen_block(prims, params, 1)
        if not body:
            self.w("pass", 1)
        self.w("")

    def gen_block(self, prims: list, params, ind: int) -> int:
        """Straight-line primitives; returns the number of lines written."""
        counts: dict = {}
        nodes = []
        for p in prims:
            ns = []
            for q in p.get("parameters", []):
                if q["type"] in ("expression", "field", "hexstr", "runtime_data", "local", "bool", "register"):
                    try:
                        ns.append(self.ec.node(q, params))
                    except ProgramError:
                        ns.append(None)
            nodes.append(ns)
            for n in ns:
                if n is not None:
                    _count(n, counts)
        em = Emitter(self.ec, counts)
        start = len(self.lines)
        for p in prims:
            for line in self.gen_primitive(p, params, em):
                self.w(line, ind)
        return len(self.lines) - start

    def lvalue(self, p) -> int:
        if p["type"] != "field":
            raise UnsupportedConstruct(f"assignment to a {p['type']} (header stacks/unions)")
        return self.layout.field(p["value"])

    def gen_primitive(self, p: dict, params, em: Emitter) -> list[str]:
        op = p["op"]
        ps = p.get("parameters", [])
        L = self.layout
        out: list[str] = []

        def rv(q):
            return em.expr(self.ec.node(q, params))

        if op == "assign":
            slot = self.lvalue(ps[0])
            if slot == self.layout.headers[ps[0]["value"][0]].valid:
                raise ProgramError("assignment to $valid$")
            line = em.store(slot, self.ec.node(ps[1], params))
            out += em.take_pre() + [line]
            em.invalidate([slot])
        elif op == "assign_header":
            dst = L.headers[ps[0]["value"]]
            src = L.headers[ps[1]["value"]]
            if [w for _, w, _ in dst.fields] != [w for _, w, _ in src.fields]:
                raise ProgramError(f"assign_header {src.name} -> {dst.name}: different types")
            out.append(f"f[{dst.valid}:{dst.end}] = f[{src.valid}:{src.end}]")
            em.invalidate(range(dst.valid, dst.end))
        elif op == "add_header":
            h = L.headers[ps[0]["value"]]
            out += [f"if not f[{h.valid}]:",
                    f"    f[{h.first}:{h.end}] = {[0] * len(h.fields)!r}",
                    f"    f[{h.valid}] = 1",
                    f"    f[{L.plen}] += {h.nbits // 8}"]
            em.invalidate(range(h.valid, h.end))
        elif op in ("push", "pop"):
            out += self.gen_push_pop(op, ps)
            nxt, elems = L.stack(ps[0]["value"])
            em.invalidate([nxt] + [s for e in elems for s in range(e.valid, e.end)])
        elif op == "remove_header":
            h = L.headers[ps[0]["value"]]
            out += [f"if f[{h.valid}]:", f"    f[{h.valid}] = 0", f"    f[{L.plen}] -= {h.nbits // 8}"]
            em.invalidate([h.valid])
        elif op in ("mark_to_drop", "drop"):
            es = self.slots["egress_spec"]
            out.append(f"f[{es}] = {self.drop_port}")
            inv = [es]
            if "mcast_grp" in self.slots:
                out.append(f"f[{self.slots['mcast_grp']}] = 0")
                inv.append(self.slots["mcast_grp"])
            em.invalidate(inv)
        elif op == "register_read":
            slot = self.lvalue(ps[0])
            reg = self.register(ps[1])
            size = self.registers[reg]
            idx = rv(ps[2])
            out += em.take_pre()
            out += [f"if {idx} < {size}:", f"    f[{slot}] = R_{self.ec.register_index[reg]}[{idx}]"]
            em.invalidate([slot])
        elif op == "register_write":
            reg = self.register(ps[0])
            size = self.registers[reg]
            idx = rv(ps[1])
            val_node = self.ec.node(ps[2], params)
            val = em.expr(val_node)
            w = self.reg_widths[reg]
            nw = self.ec.width(val_node)
            if nw is None or nw > w:
                val = f"{val} & {(1 << w) - 1}"
            out += em.take_pre()
            ri = self.ec.register_index[reg]
            out += [f"if {idx} < {size}:", f"    R_{ri}[{idx}] = {val}"]
            if self.traced:
                out.append(f"    _trace.reg({ri}, {idx}, R_{ri}[{idx}])")
            em.invalidate_regs()
        elif op == "count":
            name = ps[0]["value"]
            c = self.counters.get(name)
            if c is None:
                raise ProgramError(f"unknown counter {name!r}")
            idx = rv(ps[1])
            i = self.counter_index[name]
            out += em.take_pre()
            out += [f"if {idx} < {c['size']}:",
                    f"    CP_{i}[{idx}] += 1",
                    f"    CB_{i}[{idx}] += f[{L.ilen}]"]
            if self.traced:
                out.append(f"    _trace.count({i}, {idx})")
        elif op == "modify_field_with_hash_based_offset":
            slot = self.lvalue(ps[0])
            base = rv(ps[1])
            calc = ps[2]["value"]
            if calc not in self.calcs:
                raise ProgramError(f"unknown calculation {calc!r}")
            size = rv(ps[3])
            w = L.widths[slot]
            out += em.take_pre()
            out.append(f"f[{slot}] = ({base} + _hmod(K_{self.calc_index[calc]}(f), {size})) & {(1 << w) - 1}")
            em.invalidate([slot])
        elif op == "modify_field_rng_uniform":
            slot = self.lvalue(ps[0])
            lo, hi = rv(ps[1]), rv(ps[2])
            w = L.widths[slot]
            out += em.take_pre()
            out.append(f"f[{slot}] = _rng.randint({lo}, max({lo}, {hi})) & {(1 << w) - 1}")
            em.invalidate([slot])
        elif op == "exit":
            self.uses_exit = True
            out.append("raise _Exit()")
        elif op in ("log_msg",):
            pass  # bmv2 prints it with --log-console only; no effect on packets
        elif op in ("assume", "assert"):
            pass  # bmv2 aborts the switch on failure; we keep forwarding
        else:
            raise UnsupportedConstruct(f"primitive {op!r}")
        return out

    # --- calculations (hash, checksum) -------------------------------------
    def gen_calc(self, c: dict) -> None:
        L = self.layout
        index = self.calc_index[c["name"]]
        self.w(f"def K_{index}(f):")
        self.w("v = 0", 1)
        self.w("n = 0", 1)
        for inp in c["input"]:
            t = inp["type"]
            if t == "field":
                slot = L.field(inp["value"])
                h = L.headers[inp["value"][0]]
                wd = L.widths[slot]
                self.w(f"if f[{h.valid}]:", 1)
                self.w(f"v = (v << {wd}) | (f[{slot}] & {(1 << wd) - 1}); n += {wd}", 2)
            elif t == "hexstr":
                wd = inp["bitwidth"]
                self.w(f"v = (v << {wd}) | {_hex(inp['value']) & ((1 << wd) - 1)}; n += {wd}", 1)
            elif t == "header":
                h = L.headers[inp["value"]]
                self.w(f"if f[{h.valid}]:", 1)
                for i, (_, wd, _) in enumerate(h.fields):
                    self.w(f"v = (v << {wd}) | (f[{h.first + i}] & {(1 << wd) - 1}); n += {wd}", 2)
            else:
                raise UnsupportedConstruct(f"calculation input of type {t!r} in {c['name']!r}")
        self.w("pad = -n % 8", 1)
        self.w(f"return H_{index}((v << pad).to_bytes((n + pad) // 8, 'big'))", 1)
        self.w("")

    # --- parser ------------------------------------------------------------
    def header_struct(self, h: HeaderLayout):
        fmt = {8: "B", 16: "H", 32: "I", 64: "Q"}
        sfmt = {8: "b", 16: "h", 32: "i", 64: "q"}
        if h.metadata or not h.fields:
            return None
        if all(w in fmt for _, w, _ in h.fields):
            return struct.Struct("!" + "".join((sfmt if s else fmt)[w] for _, w, s in h.fields))
        return None

    def gen_parser(self, p: dict) -> None:
        L = self.layout
        states = {s["name"]: s for s in p["parse_states"]}
        if len(states) != len(p["parse_states"]):
            raise ProgramError("two parser states with one name")
        state_fn = {name: f"P_{i}" for i, name in enumerate(states)}
        self.state_names = list(states)
        too_short = self.errors.get("PacketTooShort", 1)
        for s in p["parse_states"]:
            self.w(f"def {state_fn[s['name']]}(f, data, off):")
            if self.traced:
                self.w(f"_trace.state({self.state_names.index(s['name'])})", 1)
            for op in s["parser_ops"]:
                kind = op["op"]
                ps = op["parameters"]
                if kind == "extract" and ps[0]["type"] == "stack":
                    # extract(stack.next): the element at the next index, StackOutOfBounds past the end
                    nxt, elems = L.stack(ps[0]["value"])
                    self.w(f"if f[{nxt}] >= {len(elems)}:", 1)
                    self.w(f"raise PErr({self.errors.get('StackOutOfBounds', 3)}, off)", 2)
                    for i, h in enumerate(elems):
                        self.w(f"{'if' if i == 0 else 'elif'} f[{nxt}] == {i}:", 1)
                        self.gen_extract(h, too_short, 2)
                    self.w(f"f[{nxt}] += 1", 1)
                elif kind == "extract":
                    if ps[0]["type"] != "regular":
                        raise UnsupportedConstruct(f"extract to a {ps[0]['type']} in state {s['name']}")
                    self.gen_extract(L.headers[ps[0]["value"]], too_short, 1)
                elif kind == "set":
                    slot = self.lvalue(ps[0])
                    em = Emitter(self.ec)
                    line = em.store(slot, self.ec.node(ps[1]))
                    for pre in em.take_pre():
                        self.w(pre, 1)
                    self.w(line, 1)
                elif kind == "verify":
                    em = Emitter(self.ec)
                    cond = em.expr(self.ec.node(ps[0]))
                    err = em.expr(self.ec.node(ps[1]))
                    self.w(f"if not {cond}:", 1)
                    self.w(f"raise PErr({err}, off)", 2)
                elif kind in ("advance", "shift"):
                    em = Emitter(self.ec)
                    amount = em.expr(self.ec.node(ps[0]))
                    nbytes = f"({amount}) // 8" if kind == "advance" else f"({amount})"
                    self.w(f"_n = {nbytes}", 1)
                    self.w("if off + _n > len(data):", 1)
                    self.w(f"raise PErr({too_short}, off)", 2)
                    self.w("off += _n", 1)
                elif kind == "primitive":
                    prim = ps[0]
                    if prim["op"] not in SUPPORTED_PRIMITIVES or prim["op"] == "exit":
                        raise UnsupportedConstruct(f"primitive {prim['op']!r} in parser state {s['name']}")
                    for line in self.gen_primitive(prim, None, Emitter(self.ec)):
                        self.w(line, 1)
                else:
                    raise UnsupportedConstruct(f"parser operation {kind!r} in state {s['name']}")
            key = s.get("transition_key", [])
            parts = []
            em = Emitter(self.ec)
            for k in key:
                if k["type"] == "field":
                    slot = L.field(k["value"])
                    wd = L.widths[slot]
                    parts.append((f"(f[{slot}] & {(1 << wd) - 1})", (wd + 7) // 8 * 8))
                elif k["type"] == "stack_field":  # stack.last.field: the element last extracted
                    nxt, elems = L.stack(k["value"][0])
                    slots = tuple(e.index(k["value"][1]) for e in elems)
                    wd = L.widths[slots[0]]
                    parts.append((f"(f[{slots!r}[f[{nxt}] - 1]] & {(1 << wd) - 1})", (wd + 7) // 8 * 8))
                elif k["type"] == "lookahead":
                    off_b, wd = k["value"]
                    parts.append((f"_lookahead(data, off, {off_b}, {wd})", (wd + 7) // 8 * 8))
                else:
                    raise UnsupportedConstruct(f"transition key of type {k['type']!r} in state {s['name']}")
            if parts:
                code = parts[0][0]
                for c, bits in parts[1:]:
                    code = f"(({code}) << {bits}) | {c}"
                self.w(f"k = {code}", 1)
            for t in s["transitions"]:
                nxt = t["next_state"]
                if nxt is not None and nxt not in states:
                    raise ProgramError(f"state {s['name']!r}: unknown next state {nxt!r}")
                target = state_fn[nxt] if nxt is not None else "None"
                tt = t["type"]
                if tt == "default":
                    self.w(f"return {target}, off", 1)
                    break
                if tt != "hexstr":
                    raise UnsupportedConstruct(f"transition of type {tt!r} in state {s['name']}")
                value = _hex(t["value"])
                if t.get("mask") is not None:
                    mask = _hex(t["mask"])
                    self.w(f"if k & {mask} == {value & mask}:", 1)
                else:
                    self.w(f"if k == {value}:", 1)
                self.w(f"return {target}, off", 2)
            else:
                self.w("return None, off", 1)
            self.w("")
        if p["init_state"] not in states:
            raise ProgramError(f"unknown initial parser state {p['init_state']!r}")
        init = state_fn[p["init_state"]]
        pe = self.slots.get("parser_error")
        self.w("def parse(f, data):")
        self.w(f"st = {init}", 1)
        self.w("off = 0", 1)
        self.w("try:", 1)
        self.w("while st is not None:", 2)
        self.w("st, off = st(f, data, off)", 3)
        self.w("except PErr as e:", 1)
        self.w("off = e.off", 2)
        if self.traced:
            self.w("_trace.parser_error(e.code)", 2)
        if pe is not None:
            self.w(f"f[{pe}] = e.code", 2)
        else:
            self.w("pass", 2)
        self.gen_checksums(verify=True, ind=1)
        self.w("return off", 1)
        self.w("")

    def gen_push_pop(self, op: str, ps: list) -> list[str]:
        """push_front(n) / pop_front(n): elements move n places up / down, the n freed ones
        become invalid, the next index follows (clamped), packet length by the valid count."""
        L = self.layout
        if ps[0]["type"] != "header_stack" or ps[1]["type"] != "hexstr":
            raise UnsupportedConstruct(f"{op} on a {ps[0]['type']} with a {ps[1]['type']} count")
        nxt, elems = L.stack(ps[0]["value"])
        size, n = len(elems), _hex(ps[1]["value"])
        valid = " + ".join(f"f[{e.valid}]" for e in elems)
        out = [f"_nv = {valid}"]
        order = range(size - 1, -1, -1) if op == "push" else range(size)
        for i in order:
            src = i - n if op == "push" else i + n
            d = elems[i]
            if 0 <= src < size:
                out.append(f"f[{d.valid}:{d.end}] = f[{elems[src].valid}:{elems[src].end}]")
            else:
                out.append(f"f[{d.valid}:{d.end}] = {[0] * (1 + len(d.fields))!r}")
        out.append(f"f[{nxt}] = min({size}, f[{nxt}] + {n})" if op == "push" else f"f[{nxt}] = max(0, f[{nxt}] - {n})")
        out.append(f"f[{L.plen}] += ({valid} - _nv) * {elems[0].nbits // 8}")
        return out

    def gen_extract(self, h: HeaderLayout, too_short: int, ind: int) -> None:
        nb = h.nbits // 8
        if h.nbits % 8:
            raise ProgramError(f"header {h.name} is not a whole number of bytes")
        self.w(f"if off + {nb} > len(data):", ind)
        self.w(f"raise PErr({too_short}, off)", ind + 1)
        self.gen_unpack(h, ind)
        self.w(f"f[{h.valid}] = 1", ind)
        self.w(f"off += {nb}", ind)
        if self.traced:
            self.w(f"_trace.extract({self.header_index[h.name]})", ind)

    def gen_unpack(self, h: HeaderLayout, ind: int) -> None:
        nb = h.nbits // 8
        if self.header_struct(h) is not None:
            self.w(f"f[{h.first}:{h.end}] = S_{self.header_index[h.name]}.unpack_from(data, off)", ind)
            return
        self.w(f"v = int.from_bytes(data[off:off + {nb}], 'big')", ind)
        shift = h.nbits
        for i, (_, wd, signed) in enumerate(h.fields):
            shift -= wd
            val = f"(v >> {shift}) & {(1 << wd) - 1}" if shift else f"v & {(1 << wd) - 1}"
            if signed:
                half = 1 << (wd - 1)
                val = f"((({val}) + {half}) & {(1 << wd) - 1}) - {half}"
            self.w(f"f[{h.first + i}] = {val}", ind)

    def gen_checksums(self, verify: bool, ind: int) -> None:
        for c in self.j.get("checksums", []):
            if c.get("type", "generic") != "generic":
                raise UnsupportedConstruct(f"checksum type {c.get('type')!r} ({c['name']})")
            if verify and not c.get("verify", True):
                continue
            if not verify and not c.get("update", True):
                continue
            calc = self.calcs.get(c["calculation"])
            if calc is None:
                raise ProgramError(f"checksum {c['name']}: unknown calculation {c['calculation']!r}")
            target = self.layout.field(c["target"])
            em = Emitter(self.ec)
            cond = em.expr(self.ec.node(c["if_cond"])) if c.get("if_cond") else "True"
            wd = self.layout.widths[target]
            self.w(f"if {cond}:", ind)
            if verify:
                ce = self.slots.get("checksum_error")
                self.w(f"if K_{self.calc_index[c['calculation']]}(f) & {(1 << wd) - 1} != f[{target}]:", ind + 1)
                self.w(f"f[{ce}] = 1" if ce is not None else "pass", ind + 2)
            else:
                self.w(f"f[{target}] = K_{self.calc_index[c['calculation']]}(f) & {(1 << wd) - 1}", ind + 1)

    # --- pipelines -----------------------------------------------------------
    def gen_pipeline(self, p: dict) -> None:
        nodes: dict[str, tuple[str, dict]] = {}
        for t in p.get("tables", []):
            nodes[t["name"]] = ("table", t)
        for c in p.get("conditionals", []):
            nodes[c["name"]] = ("cond", c)
        for a in p.get("action_calls", []):
            nodes[a["name"]] = ("call", a)
        self.nodes = nodes
        self.pd: dict = {None: frozenset()}
        old = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old, 10000))
        try:
            self.w("def pipe_ingress(f):" if p["name"] == "ingress" else "def pipe_egress(f):")
            self.w("try:", 1)
            n0 = len(self.lines)
            self.emit_nodes(p.get("init_table"), None, 2)
            if len(self.lines) == n0:
                self.w("pass", 2)
            self.w("except _Exit:", 1)
            self.w("pass", 2)
            self.w("")
        finally:
            sys.setrecursionlimit(old)

    def succs(self, name) -> list:
        kind, n = self.nodes[name]
        if kind == "cond":
            return [n["true_next"], n["false_next"]]
        if kind == "call":
            return [n["next_node"]]
        return list(self.table_next(n).values()) or [n.get("base_default_next")]

    def table_next(self, t: dict) -> dict:
        """action id (or '__HIT__'/'__MISS__') -> next node."""
        nt = t.get("next_tables", {})
        if "__HIT__" in nt or "__MISS__" in nt:
            return {"__HIT__": nt.get("__HIT__", t.get("base_default_next")),
                    "__MISS__": nt.get("__MISS__", t.get("base_default_next"))}
        out = {}
        for aid, aname in zip(t["action_ids"], t["actions"]):
            out[aid] = nt.get(aname, t.get("base_default_next"))
        return out

    def postdoms(self, name) -> frozenset:
        if name in self.pd:
            return self.pd[name]
        if name not in self.nodes:
            raise ProgramError(f"unknown control-flow node {name!r}")
        self.pd[name] = frozenset([name])  # guards against cycles; bmv2 pipelines are DAGs
        sets = [self.postdoms(s) for s in self.succs(name)]
        common = frozenset.intersection(*sets) if sets else frozenset()
        self.pd[name] = common | {name}
        return self.pd[name]

    def ipdom(self, name):
        cands = self.postdoms(name) - {name}
        if not cands:
            return None
        return max(cands, key=lambda c: len(self.pd[c]))

    def emit_nodes(self, name, stop, ind: int) -> None:
        while name is not None and name != stop:
            kind, n = self.nodes[name]
            if kind == "cond":
                join = self.ipdom(name)
                em = Emitter(self.ec)
                cond = em.expr(self.ec.node(n["expression"]))
                for pre in em.take_pre():
                    self.w(pre, ind)
                self.w(f"if {cond}:", ind)
                self.emit_branch(n["true_next"], join, ind + 1)
                self.w("else:", ind)
                self.emit_branch(n["false_next"], join, ind + 1)
                name = join
            elif kind == "call":
                self.w(f"{self.action(n['action_id'])}(f, ())", ind)
                name = n["next_node"]
            else:
                self.emit_table(n, ind)
                nxt = self.table_next(n)
                targets = set(nxt.values()) or {n.get("base_default_next")}
                if len(targets) == 1:
                    name = targets.pop()
                    continue
                join = self.ipdom(name)
                if "__HIT__" in nxt:
                    self.w("if _r[0]:", ind)
                    self.emit_branch(nxt["__HIT__"], join, ind + 1)
                    self.w("else:", ind)
                    self.emit_branch(nxt["__MISS__"], join, ind + 1)
                else:
                    groups: dict = {}
                    for aid, target in nxt.items():
                        groups.setdefault(target, []).append(aid)
                    self.w("_aid = _r[1]", ind)
                    first = True
                    for target, aids in groups.items():
                        test = f"_aid == {_int(aids[0])}" if len(aids) == 1 else \
                            f"_aid in ({', '.join(_int(x) for x in aids)},)"
                        self.w(f"{'if' if first else 'elif'} {test}:", ind)
                        self.emit_branch(target, join, ind + 1)
                        first = False
                name = join

    def emit_branch(self, name, stop, ind: int) -> None:
        n0 = len(self.lines)
        self.emit_nodes(name, stop, ind)
        if len(self.lines) == n0:
            self.w("pass", ind)

    def emit_table(self, t: dict, ind: int) -> None:
        L = self.layout
        if t.get("type", "simple") != "simple":
            raise UnsupportedConstruct(f"table {t['name']} of type {t['type']!r} (action profiles)")
        if t.get("direct_meters"):
            raise UnsupportedConstruct(f"direct meters on table {t['name']}")
        keys = []
        for k in t.get("key", []):
            mt = k["match_type"]
            if mt not in ("exact", "lpm", "ternary", "range", "optional", "valid"):
                raise UnsupportedConstruct(f"match kind {mt!r} in table {t['name']}")
            if mt == "valid":
                code = f"f[{L.headers[k['target']].valid}]"
            else:
                slot = L.field(k["target"])
                code = f"f[{slot}]"
                if L.signed[slot]:
                    code = f"({code} & {(1 << L.widths[slot]) - 1})"
                if k.get("mask") is not None:
                    code = f"({code} & {_hex(k['mask'])})"
            keys.append(code)
        exact = all(k["match_type"] in ("exact", "valid") for k in t.get("key", []))
        tv = self.table_var[t["name"]]
        if not keys:
            self.w(f"_r = {tv}.miss", ind)
        elif exact:
            kc = keys[0] if len(keys) == 1 else "(" + ", ".join(keys) + ")"
            self.w(f"_r = {tv}.d.get({kc}) or {tv}.miss", ind)
        else:
            self.w(f"_r = {tv}.lookup(({', '.join(keys)},))", ind)
        if self.traced:
            self.w(f"_trace.table({list(self.table_var).index(t['name'])}, _r)", ind)
            self.w("_actions[_r[1]](f, _r[3])", ind)
        else:
            self.w("_r[2](f, _r[3])", ind)
        if t.get("with_counters"):
            self.w("if _r[4] is not None:", ind)
            self.w("_r[4][0] += 1", ind + 1)
            self.w(f"_r[4][1] += f[{L.ilen}]", ind + 1)

    def make_table(self, t: dict, ns: dict) -> Table:
        L = self.layout
        keys = []
        for k in t.get("key", []):
            mt = k["match_type"]
            width = 1 if mt == "valid" else L.widths[L.field(k["target"])]
            keys.append(KeySpec(k.get("name") or ".".join(k["target"]) if mt != "valid" else k["target"], mt, width))
        actions = {}
        for aid, aname in zip(t["action_ids"], t["actions"]):
            a = self.actions.get(aid)
            if a is None:
                raise ProgramError(f"table {t['name']}: unknown action id {aid}")
            actions[aid] = ActionSpec(aid, aname, ns[self.action(aid)], [rd["bitwidth"] for rd in a.get("runtime_data", [])])
        table = Table(t["name"], t["id"], keys, t.get("max_size", 1024), actions, bool(t.get("with_counters")))
        de = t.get("default_entry")
        if de:
            args = tuple(_hex(x) for x in de.get("action_data", []))
            table.set_default(de["action_id"], args)
            table.default_const = bool(de.get("action_const"))
        if t.get("entries"):
            raise UnsupportedConstruct(f"const entries in table {t['name']}")
        return table

    # --- deparser ------------------------------------------------------------
    def gen_deparser(self, d: dict) -> None:
        L = self.layout
        self.w("def deparse(f, data, off):")
        self.gen_checksums(verify=False, ind=1)
        self.w("out = []", 1)
        for hname in d["order"]:
            h = L.headers.get(hname)
            if h is None:
                raise ProgramError(f"deparser: unknown header {hname!r}")
            self.w(f"if f[{h.valid}]:", 1)
            if self.header_struct(h) is not None:
                self.w(f"out.append(S_{self.header_index[h.name]}.pack(*f[{h.first}:{h.end}]))", 2)
            else:
                parts = []
                shift = h.nbits
                for i, (_, wd, signed) in enumerate(h.fields):
                    shift -= wd
                    v = f"f[{h.first + i}]" if not signed else f"(f[{h.first + i}] & {(1 << wd) - 1})"
                    parts.append(f"({v} << {shift})" if shift else v)
                self.w(f"out.append(({' | '.join(parts)}).to_bytes({h.nbits // 8}, 'big'))", 2)
        self.w("out.append(data[off:])", 1)
        self.w("return b''.join(out)", 1)
        self.w("")
