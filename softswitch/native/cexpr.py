"""Expression nodes (softswitch.compiler.expressions) as C text over `__int128`.

Packet fields live in `uint64_t f[]` (signed fields sign-extended to 64 bits), so every field,
action parameter and register loads exactly. Arithmetic is modulo 2^128: for +, -, *, <<, &, |, ^
and ~ that is the Python path's arbitrary precision once p4c's masks apply. An operation that needs
the true value (comparisons, >>, /, %, casts, truthiness, indexes) refuses, as an unsupported
construct, an operand that might need more than MAX_BITS; the program then runs on the Python path.
A subtree whose every value is bounded by NARROW_BITS (`bits`) is computed in `int64_t` instead,
where no operation can overflow, so it is exact too, at a fraction of the cost. A value stored into a
field or register (at most 64 bits) is computed modulo 2^64 in `uint64_t` (`modular`): +, -, *, &, |,
^, ~, << and the arms of ?: need only their operands' low 64 bits for that, whatever the width of the
intermediate (p4c's bit<64> masks and sums would otherwise take __int128). ?: there and in int64_t
subtrees is a branch-free select: a gradient's signs are random, and a branch on each mispredicted
half the time (most of a large K's per-element time).
"""
from __future__ import annotations

from ..compiler.expressions import BOOL_OPS, ExpressionCompiler
from ..compiler_errors import UnsupportedConstruct

MAX_BITS = 126  # a value of at most this many bits (and a sign) is exact in an __int128
NARROW_BITS = 62  # a subtree of values this small computes exactly in int64_t
FIELD_BITS = 64  # fields, parameters, registers and lookaheads wider than this are not compiled
HUGE = 1 << 20
U64 = (1 << 64) - 1


def c_const(v: int, narrow: bool = False) -> str:
    """An integer as an __int128 expression (`narrow`: an int64_t one)."""
    if narrow:
        return f"((int64_t){v}LL)"
    if v.bit_length() > MAX_BITS:
        raise UnsupportedConstruct(f"a constant of {v.bit_length()} bits")
    if -(1 << 63) <= v < 1 << 63:
        return f"((i128){v}LL)"
    u = v & ((1 << 128) - 1)
    return f"((i128)(((u128){u >> 64}ULL << 64) | (u128){u & ((1 << 64) - 1)}ULL))"


def mask_u64(width: int) -> str:
    return f"{(1 << width) - 1}ULL"


class CExpr:
    """C text for one statement's expressions. Lookaheads met are collected in `lookaheads` as
    (bit offset, width), so the statement can check the packet is long enough before it runs."""

    def __init__(self, compiler: ExpressionCompiler, in_parser: bool = False):
        self.x = compiler
        self.layout = compiler.layout
        self.in_parser = in_parser
        self.lookaheads: list[tuple[int, int]] = []
        self._conditional = 0  # > 0 inside a branch that might not be evaluated
        self._narrow = False  # emitting an int64_t subtree (`fits`)

    @property
    def t(self) -> str:
        return "int64_t" if self._narrow else "i128"

    @property
    def xp(self) -> str:
        """The prelude's helper prefix for the current type: x_ (i128) or x64_."""
        return "x64_" if self._narrow else "x_"

    def fits(self, n) -> bool:
        """Whether every value of n and of its subexpressions is below 2^NARROW_BITS in magnitude."""
        if self.bits(n) > NARROW_BITS:
            return False
        k = n[0]
        if k in ("c", "b", "f", "valid", "a", "lk"):
            return True
        if k == "reg":
            return self.fits(n[2])
        if k in ("two_comp_mod", "usat_cast", "sat_cast"):  # x + 2^(w-1) stays below 2^63
            return self.fits(n[1])
        return all(self.fits(c) for c in n[1:] if isinstance(c, tuple))

    # --- bounds ------------------------------------------------------------------
    def bits(self, n) -> int:
        """An upper bound of the bit length of |value|."""
        k = n[0]
        if k == "c":
            return abs(n[1]).bit_length()
        if k in ("b", "valid") or k in BOOL_OPS or k == "b2d":
            return 1
        if k == "f":
            return self.layout.widths[n[1]]
        if k in ("a", "lk"):
            return n[2]
        if k == "reg":
            return self.x.reg_widths[n[1]]
        if k == "?":
            return max(self.bits(n[2]), self.bits(n[3]))
        if k in ("two_comp_mod", "usat_cast", "sat_cast"):
            return n[2][1]
        if k == "~":
            return self.bits(n[2]) + 1
        op, l, r = n
        bl, br = self.bits(l), self.bits(r)
        if op in ("+", "-"):
            return max(bl, br) + 1
        if op == "*":
            return bl + br
        if op == "&":  # a non-negative operand bounds the result, whatever the other one is
            known = [b for b, side in ((bl, l), (br, r)) if self.x.width(side) is not None]
            return min(known) if known else max(bl, br)
        if op in ("|", "^"):
            return max(bl, br)
        if op == "<<":
            return min(HUGE, bl + (r[1] if r[0] == "c" else (1 << min(br, 20))))
        return bl  # >>, /, %

    def exact(self, n) -> str:
        if self.bits(n) > MAX_BITS:
            raise UnsupportedConstruct(f"an expression wider than {MAX_BITS} bits where its full value matters "
                                       f"({str(n)[:120]})")
        return self.code(n)

    def nonneg(self, n, what: str) -> str:
        """An operand that must be a non-negative exact value (an index, a shift amount)."""
        if self.x.width(n) is None:
            raise UnsupportedConstruct(f"{what} that may be negative")
        return self.exact(n)

    def boolean(self, n) -> str:
        if n[0] not in BOOL_OPS and n[0] != "b":
            raise UnsupportedConstruct(f"'and'/'or' over a non-boolean operand ({n[0]!r})")
        return self.exact(n)

    # --- text ----------------------------------------------------------------------
    def load(self, slot: int) -> str:
        if self.layout.widths[slot] > FIELD_BITS:
            raise UnsupportedConstruct(f"a field of {self.layout.widths[slot]} bits")
        if self.layout.signed[slot]:
            return f"((i128)(int64_t)f[{slot}])"
        return f"((i128)f[{slot}])"

    def code(self, n) -> str:
        if self._narrow or n[0] in ("c", "b") or not self.fits(n):
            return self._code(n)
        self._narrow = True
        try:
            return f"N64({self._code(n)})"
        finally:
            self._narrow = False

    def _code(self, n) -> str:
        k, t, x = n[0], self.t, self.xp
        if k == "c":
            return c_const(n[1], self._narrow)
        if k == "b":
            return f"(({t})1)" if n[1] else f"(({t})0)"
        if k == "f":
            if self._narrow:
                return f"((int64_t)f[{n[1]}])"  # fits: a signed field is stored sign-extended
            return self.load(n[1])
        if k == "valid":
            return f"(({t})(f[{n[1]}] == 1))"
        if k == "a":
            if n[2] > FIELD_BITS:
                raise UnsupportedConstruct(f"an action parameter of {n[2]} bits")
            return f"(({t})a[{n[1]}])"
        if k == "lk":
            if not self.in_parser or self._conditional:
                raise UnsupportedConstruct("lookahead outside the parser or under a condition")
            if not 0 < n[2] <= FIELD_BITS or n[1] < 0:
                raise UnsupportedConstruct(f"lookahead of {n[2]} bits")
            self.lookaheads.append((n[1], n[2]))
            return f"(({t})get_bits(data + off, {n[1]}, {n[2]}))"
        if k == "reg":
            idx = self.nonneg(n[2], "a register index")
            p = self.x.placement[n[1]]
            return (f"({{ {t} _i = {idx}; _i < {self.x.registers[n[1]]} ? "
                    f"({t})G_{p.group}[(int64_t)_i * {p.stride} + {p.offset}] : ({t})0; }})")
        if k == "?":
            cond = self.exact(n[1])
            self._conditional += 1
            try:
                if self._narrow:
                    return f"x64_sel(({cond}) != 0, {self.code(n[2])}, {self.code(n[3])})"
                return f"({cond} ? {self.code(n[2])} : {self.code(n[3])})"
            finally:
                self._conditional -= 1
        if k == "not":
            return f"(({t})!{self.exact(n[2])})"
        if k == "~":
            return f"(~{self.code(n[2])})"
        if k in ("d2b", "b2d"):
            return f"(({t})({self.exact(n[2])} != 0))"
        narrow = self._narrow
        if k == "two_comp_mod":
            w = n[2][1]
            return f"{x}sub({x}add({self.code(n[1])}, {c_const(1 << (w - 1), narrow)}) & " \
                   f"{c_const((1 << w) - 1, narrow)}, {c_const(1 << (w - 1), narrow)})"
        if k == "usat_cast":
            return f"{x}min({x}max({self.exact(n[1])}, 0), {c_const((1 << n[2][1]) - 1, narrow)})"
        if k == "sat_cast":
            w = n[2][1]
            return f"{x}min({x}max({self.exact(n[1])}, {c_const(-(1 << (w - 1)), narrow)}), " \
                   f"{c_const((1 << (w - 1)) - 1, narrow)})"
        op, l, r = n
        if op in ("+", "-", "*"):
            return f"{x}{ {'+': 'add', '-': 'sub', '*': 'mul'}[op]}({self.code(l)}, {self.code(r)})"
        if op in ("&", "|", "^"):
            return f"({self.code(l)} {op} {self.code(r)})"
        if op in ("/", "%"):
            return f"{x}{'div' if op == '/' else 'mod'}({self.exact(l)}, {self.exact(r)})"
        if op == "<<":
            return f"{x}shl({self.code(l)}, {self.nonneg(r, 'a shift amount')})"
        if op == ">>":
            return f"{x}shr({self.exact(l)}, {self.nonneg(r, 'a shift amount')})"
        if op in ("==", "!=", "<", ">", "<=", ">="):
            return f"(({t})({self.exact(l)} {op} {self.exact(r)}))"
        if op in ("and", "or"):
            left = self.boolean(l)
            self._conditional += 1
            try:
                right = self.boolean(r)
            finally:
                self._conditional -= 1
            return f"(({t})({left} {'&&' if op == 'and' else '||'} {right}))"
        raise UnsupportedConstruct(f"expression operator {op!r}")

    def narrow64(self, n) -> str | None:
        """n's exact value as int64_t C text, or None where it might not fit (`fits`)."""
        if not self.fits(n):
            return None
        self._narrow = True
        try:
            return self._code(n)
        finally:
            self._narrow = False

    def modular(self, n) -> str:
        """n's value modulo 2^64 as uint64_t C text, for a consumer of at most its low 64 bits."""
        k = n[0]
        if k == "c":
            return f"{n[1] & U64}ULL"
        if k == "f":
            if self.layout.widths[n[1]] > FIELD_BITS:
                raise UnsupportedConstruct(f"a field of {self.layout.widths[n[1]]} bits")
            return f"f[{n[1]}]"  # a signed field is stored sign-extended: its value modulo 2^64
        if k == "a" and n[2] <= FIELD_BITS:
            return f"a[{n[1]}]"
        narrow = self.narrow64(n)
        if narrow is not None:
            return f"((uint64_t){narrow})"
        if k == "?":
            cond = self.narrow64(n[1]) or self.exact(n[1])
            self._conditional += 1
            try:
                return f"u64_sel(({cond}) != 0, {self.modular(n[2])}, {self.modular(n[3])})"
            finally:
                self._conditional -= 1
        if k == "~":
            return f"(~{self.modular(n[2])})"
        if k == "two_comp_mod":
            w = n[2][1]
            h, m = (1 << (w - 1)) & U64, ((1 << w) - 1) & U64
            return f"((({self.modular(n[1])} + {h}ULL) & {m}ULL) - {h}ULL)"
        if k in ("+", "-", "*", "&", "|", "^"):
            return f"({self.modular(n[1])} {k} {self.modular(n[2])})"
        if k == "<<":
            if self.x.width(n[2]) is None:
                raise UnsupportedConstruct("a shift amount that may be negative")
            amount = self.narrow64(n[2])
            if amount is not None:
                return f"u64_shl({self.modular(n[1])}, {amount})"
            return f"u64_shl({self.modular(n[1])}, (int64_t)x_min({self.exact(n[2])}, 64))"
        return f"((uint64_t){self.exact(n)})"

    def store(self, slot: int, n) -> str:
        """`f[slot] = value`, truncated (unsigned) or wrapped (signed) to the field's width."""
        w = self.layout.widths[slot]
        if w > FIELD_BITS:
            raise UnsupportedConstruct(f"a field of {w} bits")
        code = self.modular(n)
        if w == 64:
            return f"f[{slot}] = {code};"
        if self.layout.signed[slot]:  # wrapped, then stored sign-extended
            h = 1 << (w - 1)
            return f"f[{slot}] = (({code} + {h}ULL) & {mask_u64(w)}) - {h}ULL;"
        return f"f[{slot}] = {code} & {mask_u64(w)};"

    def stored(self, slot: int, code: str) -> str:
        w = self.layout.widths[slot]
        if w > FIELD_BITS:
            raise UnsupportedConstruct(f"a field of {w} bits")
        if self.layout.signed[slot]:
            h = c_const(1 << (w - 1))
            return f"(uint64_t)(int64_t)x_sub(x_add({code}, {h}) & {c_const((1 << w) - 1)}, {h})"
        return f"(uint64_t)({code}) & {mask_u64(w)}" if w < 64 else f"(uint64_t)({code})"

    def precheck(self, too_short: int) -> list[str]:
        """The packet-length check the collected lookaheads need (bmv2 raises PacketTooShort)."""
        if not self.lookaheads:
            return []
        need = max((bit + width + 7) // 8 for bit, width in self.lookaheads)
        self.lookaheads = []
        return [f"if (off + {need} > len) {{ err = {too_short}; goto perr; }}"]
