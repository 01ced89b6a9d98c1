"""Per-element temporaries of the compiled program's packet state held in a loop's locals.

p4c lowers a conditional inside an action (`x = c ? a : b` over a header field) into temporaries
that keep their old value on the branch not taken: `t = sel(c, t, v)`. In a per-element loop
(croll, after cspread) such a temporary is a run `f[(b + 1 * _e)]` that each round stores and reads
back: two thirds of to_fixed's stores, and slots the packet path zeroes for every frame. Where the
value a run holds when a round begins can never reach anything the program observes, a local of
the round does the same: the run leaves the packet state (`dead` slots, which the packet path then
neither zeroes nor copies). That is decided on the text, conservatively:

- every reference to the run's slots anywhere is that one form, inside loops of its length (no
  constant index, range copy, other stride or computed index; not a slot the packet path names);
- in every such loop, a taint of the run's value at the start of a round, followed through the
  round's assignments, reaches neither another field, a held local, nor any other statement.
  Through `sel(c, a, b)` with a condition that holds one value for the rest of the round (nothing
  it names is assigned later in the round: p4c's conditions are temporaries set once, before
  their selects), the taint is kept per truth value of each such condition (t = sel(c, 0, t);
  u = sel(c, t, v) leaves u clean); any other expression taints its result when an operand is
  tainted.
"""
from __future__ import annotations

import re
from collections import Counter

from .croll import FIXED, STEPPED

FOR = re.compile(r"^(\s*)for \(int64_t _e = 0; _e < (\d+); _e\+\+\) \{$")
RANGES = re.compile(r"mem(?:set|move)\(f \+ (\d+), (?:0|f \+ (\d+)), (\d+)\);")
INDIRECT = re.compile(r"\bf \+|\bf\[[^\d(]|&f\b")
THING = re.compile(r"\bf\[\(\d+ [+-] \d+ \* _e\)\]|\bf\[\d+\]|\b_[fo]\d+\b")
TARGET = r"(f\[\(\d+ [+-] \d+ \* _e\)\]|f\[\d+\]|_[fo]\d+)"
ASSIGN = re.compile(rf"^{TARGET} (\|?)= ([^;{{}}]*);$")
ASSIGNED = re.compile(rf"{TARGET} (?:[-+*/%&|^]|<<|>>)?= ")  # every target, simple or compound, statement or not
BARE = re.compile(r"(?<![=!<>])=(?!=)")  # an assignment inside an expression
SEL = re.compile(r"\b[ux]64_sel\(")
CONDITIONS = 8  # distinct conditions a round's taint is kept apart for; more are taken as unknown
WORLDS = 1 << CONDITIONS  # truth assignments of those conditions: a taint is a set of them, as bits
ALL = (1 << WORLDS) - 1
TRUE = [sum(1 << w for w in range(WORLDS) if w >> c & 1) for c in range(CONDITIONS)]


def localize(lines: list[str], reserved: set[int]) -> tuple[list[str], set[int]]:
    """(`lines` with each qualifying run a local of its loops' rounds, the slots no longer used)."""
    text = "\n".join(lines)
    if INDIRECT.search(RANGES.sub("", text)):
        return lines, set()
    touched = set(reserved) | {int(c) for c in FIXED.findall(text)}
    for dst, src, nbytes in RANGES.findall(text):
        for start in (dst, src):
            if start:
                touched.update(range(int(start), int(start) + int(nbytes) // 8))
    loops = _loops(lines)
    if loops is None:
        return lines, set()
    runs: dict[tuple[int, int, int], list[int]] = {}  # (base, step, rounds) -> the loops naming it
    seen = 0
    for number, (start, end, rounds) in enumerate(loops):
        for base, sign, step in STEPPED.findall("\n".join(lines[start + 1:end])):
            runs.setdefault((int(base), int(step) if sign == "+" else -int(step), rounds), []).append(number)
            seen += 1
    if seen != len(STEPPED.findall(text)):  # a run outside the loops read here
        return lines, set()
    chosen = []
    for (base, step, rounds), where in runs.items():
        slots = set(range(base, base + rounds))
        if step != 1 or touched & slots or any(
                (b, s, n) != (base, step, rounds) and slots & _span(b, s, n) for b, s, n in runs):
            continue
        ref = f"f[({base} + 1 * _e)]"
        if all(_dead_at_start(lines[loops[i][0] + 1:loops[i][1]], ref) for i in set(where)):
            chosen.append((base, rounds, sorted(set(where))))
    if not chosen:
        return lines, set()
    out = list(lines)
    for number, (start, end, _) in enumerate(loops):
        mine = [base for base, _, where in chosen if number in where]
        if not mine:
            continue
        for j in range(start + 1, end):
            for base in mine:
                out[j] = out[j].replace(f"f[({base} + 1 * _e)]", f"_t{base}")
        indent = FOR.match(lines[start]).group(1) + "    "
        out[start] = lines[start] + "\n" + indent + "uint64_t " + ", ".join(f"_t{b} = 0" for b in mine) + ";"
    dead = {slot for base, rounds, _ in chosen for slot in range(base, base + rounds)}
    return "\n".join(out).split("\n"), dead


def _loops(lines: list[str]) -> list[tuple[int, int, int]] | None:
    """(first line, closing line, rounds) of every loop; None when one does not close."""
    found = []
    for i, line in enumerate(lines):
        m = FOR.match(line)
        if m:
            end = next((j for j in range(i + 1, len(lines)) if lines[j] == f"{m.group(1)}}}"), None)
            if end is None:
                return None
            found.append((i, end, int(m.group(2))))
    return found


def _span(base: int, step: int, rounds: int) -> set[int]:
    return {base + step * e for e in range(rounds)}


def _dead_at_start(body: list[str], ref: str) -> bool:
    """Whether what `ref` holds when a round of `body` begins reaches nothing but `ref` itself."""
    taint = _Taint(Counter(ASSIGNED.findall("\n".join(body))))
    taint.of[ref] = ALL
    for line in body:
        line = line.strip()
        m = ASSIGN.match(line)
        if m is None or BARE.search(m.group(3)):
            if any(taint.of.get(t, 0) for t in THING.findall(line)):
                return False
        else:
            target, accumulate, expr = m.groups()
            value = taint.expr(expr)
            taint.of[target] = (taint.of.get(target, 0) if accumulate else 0) | value
        taint.passed.update(ASSIGNED.findall(line))
    return not any(v for t, v in taint.of.items() if t != ref)


class _Taint:
    """Taints (sets of condition worlds, as bits) of a round's fields and locals."""

    def __init__(self, assigned: Counter):
        self.assigned = assigned  # how often the round writes each thing
        self.passed: Counter = Counter()  # how many of those writes the walk has passed
        self.of: dict[str, int] = {}
        self.conditions: dict[str, int] = {}

    def expr(self, text: str) -> int:
        m = SEL.search(text)
        if m is None:
            return self._plain(text)
        close = _close(text, m.end() - 1)
        args = _split(text[m.end():close])
        rest = text[:m.start()] + " 0 " + text[close + 1:]
        if len(args) != 3:
            return self._plain(text)
        cond, a, b = args
        c, tc = self._condition(cond), self.expr(cond)
        if c is None or tc:
            sel = tc | self.expr(a) | self.expr(b)
        else:
            sel = (self.expr(a) & TRUE[c]) | (self.expr(b) & ~TRUE[c] & ALL)
        return sel | self.expr(rest)

    def _plain(self, text: str) -> int:
        taint = 0
        for t in THING.findall(text):
            taint |= self.of.get(t, 0)
        return taint

    def _condition(self, cond: str) -> int | None:
        """The condition's index, or None when the rest of the round may change it or too many are kept."""
        key = cond.strip()
        if any(self.passed[t] < self.assigned[t] for t in THING.findall(key)):
            return None
        if key not in self.conditions:
            if len(self.conditions) == CONDITIONS:
                return None
            self.conditions[key] = len(self.conditions)
        return self.conditions[key]


def _close(text: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    return len(text) - 1


def _split(args: str) -> list[str]:
    """Top-level comma-separated arguments."""
    out, depth, last = [], 0, 0
    for i, ch in enumerate(args):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            out.append(args[last:i])
            last = i + 1
    return out + [args[last:]]
