"""BMv2 JSON expressions: normalised to hashable nodes, then emitted as Python text.

Values are unbounded integers as in bmv2; p4c inserts the masks that give bit<W> its
wrap-around, fields are truncated (unsigned) or wrapped to two's complement (signed) on
assignment. Masks that cannot change a value (its width is already known to fit) are
elided. Only integers and compiler-made names reach the text.

Nodes:
  ("c", value)  ("b", bool)  ("f", slot)  ("a", index, width)  ("valid", slot)
  ("lk", bit_offset, width)  ("reg", name, index_node)  ("hdr", name)
  (op, left, right) / ("?", cond, left, right) / (unop, None, right)
"""
from __future__ import annotations

from ..compiler_errors import ProgramError, UnsupportedConstruct
from . import registers as reg_store
from . import shape
from .layout import FieldLayout, hex_value
from .runtime import SHIFT_CAP


def int_literal(v) -> str:
    """An integer of the JSON as source text; anything else never reaches generated code."""
    if type(v) is not int:
        raise ProgramError(f"expected an integer, got {v!r:.40}")
    return str(v)


BOOL_OPS = {"==", "!=", "<", ">", "<=", ">=", "and", "or", "not", "valid", "d2b", "b"}
#: Generated source of the operators that are not Python's own, by BMv2 JSON op name.
UNARY = {"not": "(not {0})", "~": "(~{0})", "d2b": "({0} != 0)", "b2d": "(1 if {0} else 0)"}
BINARY = {"and": "({0} and {1})", "or": "({0} or {1})", "/": "_div({0}, {1})", "%": "_mod({0}, {1})"}


class ExpressionCompiler:
    def __init__(self, layout: FieldLayout, registers: dict[str, int], reg_widths: dict[str, int], too_short: int):
        self.layout = layout
        self.too_short = too_short  # the PacketTooShort error code, for lookahead past the end
        self.registers = registers
        self.reg_widths = reg_widths
        self.register_index = {name: i for i, name in enumerate(registers)}
        self.placement = reg_store.place(registers, reg_widths)

    def register_cell(self, name: str, index: str) -> str:
        """Python text of register `name`'s cell `index` in its group's buffer (registers.py)."""
        p = self.placement[name]
        return f"G_{p.group}[({index}) * {p.stride} + {p.offset}]"

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
            return ("c", hex_value(v))
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
            if not 1 <= w[1] <= shape.MAX_WIDTH:
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


def slots_read(n, out: set):
    if not isinstance(n, tuple):
        return
    if n[0] in ("f", "valid"):
        out.add(n[1])
    for c in n[1:]:
        if isinstance(c, tuple):
            slots_read(c, out)


def reads_state(n) -> bool:
    if not isinstance(n, tuple):
        return False
    if n[0] in ("reg", "lk"):
        return True
    return any(reads_state(c) for c in n[1:] if isinstance(c, tuple))


def count_nodes(n, counts: dict):
    if not isinstance(n, tuple) or n[0] in ("c", "b", "a", "hdr"):
        return
    counts[n] = counts.get(n, 0) + 1
    if counts[n] > 1:
        return  # children were counted with the first occurrence
    for c in n[1:]:
        if isinstance(c, tuple):
            count_nodes(c, counts)


class ExpressionEmitter:
    """Python text for nodes, with subexpressions used more than once in straight-line code bound to
    temporaries `_t<n>` and forgotten when a slot they read is written."""

    def __init__(self, compiler: ExpressionCompiler, counts: dict | None = None):
        self.compiler = compiler
        self.counts = counts or {}
        self.avail: dict = {}  # node -> temp name
        self.readers: dict = {}  # slot -> the nodes in avail that read it (an action of K elements has
        # K times the temporaries: a scan of all of them per write made its compile quadratic in K)
        self.n = 0
        self.pre: list[str] = []

    def invalidate(self, slots) -> None:
        for slot in slots:
            for node in self.readers.pop(slot, ()):
                self.avail.pop(node, None)

    def take_pre(self) -> list[str]:
        pre, self.pre = self.pre, []
        return pre

    def expr(self, n) -> str:
        if n in self.avail:
            return self.avail[n]
        code = self._expr(n)
        if self.counts.get(n, 0) > 1 and n[0] not in ("c", "b", "a") and not reads_state(n):
            name = f"_t{self.n}"
            self.n += 1
            self.pre.append(f"{name} = {code}")
            self.avail[n] = name
            deps = set()
            slots_read(n, deps)
            for slot in deps:
                self.readers.setdefault(slot, set()).add(n)
            return name
        return code

    def _expr(self, n) -> str:
        k = n[0]
        sub = self.expr
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
            return f"_lookahead(data, off, {n[1]}, {n[2]}, {self.compiler.too_short})"
        if k == "reg":
            name = n[1]
            size = self.compiler.registers[name]
            idx = sub(n[2])
            return f"({self.compiler.register_cell(name, idx)} if {idx} < {size} else 0)"
        if k == "?":
            return f"({sub(n[2])} if {sub(n[1])} else {sub(n[3])})"
        if k in UNARY:
            return UNARY[k].format(sub(n[2]))
        if k == "two_comp_mod":
            w = n[2][1]
            h = 1 << (w - 1)
            return f"((({sub(n[1])} + {h}) & {(1 << w) - 1}) - {h})"
        if k == "usat_cast":
            w = n[2][1]
            return f"min(max({sub(n[1])}, 0), {(1 << w) - 1})"
        if k == "sat_cast":
            w = n[2][1]
            return f"min(max({sub(n[1])}, {-(1 << (w - 1))}), {(1 << (w - 1)) - 1})"
        op, l, r = n
        if op in BINARY:
            return BINARY[op].format(sub(l), sub(r))
        if op == "<<" and (r[0] != "c" or not 0 <= r[1] < SHIFT_CAP):
            return f"_shl({sub(l)}, {sub(r)})"
        if op == ">>" and (r[0] != "c" or not 0 <= r[1] < SHIFT_CAP):
            return f"_shr({sub(l)}, {sub(r)})"
        return f"({sub(l)} {op} {sub(r)})"

    def store(self, slot: int, n) -> str:
        """`f[slot] = value`, truncated/wrapped to the field's width when needed."""
        w = self.compiler.layout.widths[slot]
        code = self.expr(n)
        if self.compiler.layout.signed[slot]:
            h = 1 << (w - 1)
            code = f"((({code}) + {h}) & {(1 << w) - 1}) - {h}"
        else:
            nw = self.compiler.width(n)
            if nw is None or nw > w:
                code = f"{code} & {(1 << w) - 1}"
        return f"f[{slot}] = {code}"
