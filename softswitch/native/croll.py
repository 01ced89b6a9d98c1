"""Runs of generated statements that differ only by integers in arithmetic progression, rolled
into loops. A program's per-element code (K elements of a chunk: the same statements over the next
field, temporary and register each time) becomes one loop of a few statements instead of K copies:
the same statements in the same order, so the same semantics, in a function the instruction cache
holds and the C compiler builds in a fraction of the time and may vectorise.

A statement qualifies when it is complete on its line (balanced brackets, ending in `;` or `}`) and
cannot mean something else inside a loop (no `break`, `continue`, `case`, label or `return`).
Integer literals are the only parts that vary: identifiers never do (a register's cell is
`G_<group>[i * <stride> + <offset>]`).

A field the loop reads or writes at the same slot every time (a flag it ORs into, the cell index of
every register access) is held in a local for the loop's duration when no other access of the loop can
reach its slot: otherwise the C compiler, which cannot tell, would load and store it each time round.
"""
from __future__ import annotations

import re

NUMBER = re.compile(r"(?<![\w.])(\d+)([A-Za-z]*)")
BARRED = re.compile(r"\b(break|continue|case|default|return|goto)\b|^\s*\w+:")
MIN_REPEATS = 8  # fewer copies are left as they are (a short header's fields)
MAX_PERIOD = 16  # statements a repeated group may hold
LOOP_VAR = "_e"
REDUCED = "_o"  # an OR reduction's accumulator: _o<slot>
FIXED = re.compile(r"\bf\[(\d+)\]")
STEPPED = re.compile(r"\bf\[\((\d+) ([+-]) (\d+) \* _e\)\]")
LOCAL = re.compile(r"\b_f\d+\b")
HELD_STORE = re.compile(r"_f\d+ = ")
ASSIGNED = re.compile(r"(_f\d+|\bf\[[^\]]*\]) = ")
OR_FOLD = re.compile(r"^(_f\d+) = \(\(uint64_t\)\(\(\(int64_t\)\1\) \| (.*)\)\) & (\d+ULL);$")
OR_FOLD_U64 = re.compile(r"^(_f\d+) = \(\1 \| (.*)\) & (\d+ULL);$")
REGISTER = re.compile(r"\bG_\d+\[")
OTHER = re.compile(r"\bf\b(?!\[(\d+\]|\(\d+ [+-] \d+ \* _e\)\]))")


def _shape(line: str) -> tuple[str, tuple[int, ...]] | None:
    """(the line with its integers blanked, the integers), or None when it may not be rolled."""
    if BARRED.search(line) or not line.rstrip().endswith((";", "}")) or LOOP_VAR in line:
        return None
    if any(line.count(a) != line.count(b) for a, b in ("()", "[]", "{}")):
        return None
    return NUMBER.sub(lambda m: "#" + m.group(2), line), tuple(int(m.group(1)) for m in NUMBER.finditer(line))


def _run(shapes, start: int, period: int) -> int:
    """How many times the group of `period` statements at `start` repeats with every integer in
    arithmetic progression (1 when it does not)."""
    first = shapes[start:start + period]
    if len(first) < period or any(s is None for s in first):
        return 1
    nxt = shapes[start + period:start + 2 * period]
    if len(nxt) < period or any(s is None or s[0] != f[0] for s, f in zip(nxt, first)):
        return 1
    steps = [tuple(b - a for a, b in zip(f[1], s[1])) for f, s in zip(first, nxt)]
    n = 2
    while True:
        group = shapes[start + n * period:start + (n + 1) * period]
        if len(group) < period or any(
                s is None or s[0] != f[0] or any(v != a + n * d for v, a, d in zip(s[1], f[1], st))
                for s, f, st in zip(group, first, steps)):
            return n
        n += 1


def _body(line: str, values: tuple[int, ...], steps: tuple[int, ...]) -> str:
    it = iter(zip(values, steps))

    def term(m: re.Match) -> str:
        value, step = next(it)
        suffix = m.group(2)
        if step == 0:
            return m.group(0)
        sign = "+" if step > 0 else "-"
        return f"({value}{suffix} {sign} {abs(step)}{suffix} * {LOOP_VAR})"
    return NUMBER.sub(term, line)


def roll(lines: list[str], indent: str = "") -> list[str]:
    """`lines` with each run of at least MIN_REPEATS repeated groups as one loop."""
    shapes = [_shape(line) for line in lines]
    out: list[str] = []
    i = 0
    while i < len(lines):
        best = (1, 1)  # (repeats, period)
        if shapes[i] is not None:
            for period in range(1, MAX_PERIOD + 1):
                n = _run(shapes, i, period)
                if n >= MIN_REPEATS and n * period > best[0] * best[1]:
                    best = (n, period)
        n, period = best
        if n < MIN_REPEATS:
            out.append(lines[i])
            i += 1
            continue
        body = []
        for j in range(period):
            values = shapes[i + j][1]
            steps = tuple(b - a for a, b in zip(values, shapes[i + period + j][1]))
            body.append(_body(lines[i + j].strip(), values, steps))
        out.extend(_loop(body, n, indent))
        i += n * period
    return out


def _loop(body: list[str], n: int, indent: str) -> list[str]:
    """The loop of `body` n times, its fixed slots held in locals where that is safe."""
    text = "\n".join(body)
    held: list[int] = []
    if not OTHER.search(text):
        held = sorted({int(c) for c in FIXED.findall(text)} - _slots(STEPPED.findall(text), n))
    if not held:
        return _for(body, n, indent)
    body = [FIXED.sub(lambda m: f"_f{m.group(1)}" if int(m.group(1)) in held else m.group(0), line) for line in body]
    written = [c for c in held if f"_f{c}" in _writes("\n".join(body), n)]
    return [f"{indent}{{ uint64_t {', '.join(f'_f{c} = f[{c}]' for c in held)};", *_split(body, n, indent),
            *([f"{indent}{' '.join(f'f[{c}] = _f{c};' for c in written)}"] if written else []), f"{indent}}}"]


def _split(body: list[str], n: int, indent: str) -> list[str]:
    """The loop, with the statements that only fold into a held local (a flag ORed over every
    element) moved after the others when that cannot change what either computes: each such fold
    becomes an OR reduction (`_or_folds`) kept in the loop, or, when some fold is not one, a loop of
    their own after it. A chain through the held local keeps a loop from vectorising; a reduction
    does not, and in the same loop its operands are read once."""
    fold = [line for line in body if HELD_STORE.match(line) and "{" not in line and not REGISTER.search(line)]
    rest = [line for line in body if line not in fold]
    if fold and rest:
        rest_writes = _writes("\n".join(rest), n)
        fold_writes = _writes("\n".join(fold), n)
        if not _refs("\n".join(fold), n) & rest_writes and not _refs("\n".join(rest), n) & fold_writes:
            before, folded, after = _or_folds(fold)
            loops = _for(rest + folded, n, indent) if all(line.startswith(REDUCED) for line in folded) else \
                _for(rest, n, indent) + _for(folded, n, indent)
            return [f"{indent}{line}" for line in before] + loops + [f"{indent}{line}" for line in after]
    return _for(body, n, indent)


def _or_folds(fold: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(before, the fold statements, after): each `_f = (_f | x) & m` of `fold` (p4c's flag |=
    condition) as an OR of the x's applied once after the loop: the same value, since & m
    distributes over |, and an OR reduction the compiler vectorises where the chain through _f it
    could not."""
    before, after, body = [], [], []
    for line in fold:
        m = OR_FOLD.match(line) or OR_FOLD_U64.match(line)
        local, x, mask = m.groups() if m else (None, None, None)
        if m is None or not _balanced(x) or sum(f.count(local) for f in fold) != 2:
            body.append(line)
            continue
        acc = REDUCED + local[2:]
        before.append(f"uint64_t {acc} = 0;")
        body.append(f"{acc} |= (uint64_t)({x});")
        after.append(f"{local} = ({local} | {acc}) & {mask};")
    return before, body, after


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


def _for(body: list[str], n: int, indent: str) -> list[str]:
    head = f"for (int64_t {LOOP_VAR} = 0; {LOOP_VAR} < {n}; {LOOP_VAR}++) {{"
    return [f"{indent}{head}", *(f"{indent}    {line}" for line in body), f"{indent}}}"]


def _slots(stepped, n: int) -> set[int]:
    return {int(a) + (1 if sign == "+" else -1) * int(d) * e for a, sign, d in stepped for e in range(n)}


def _refs(text: str, n: int) -> set:
    """Every slot (int) and held local (name) `text` names."""
    return {int(c) for c in FIXED.findall(text)} | _slots(STEPPED.findall(text), n) | set(LOCAL.findall(text))


def _writes(text: str, n: int) -> set:
    """Every slot and held local `text` assigns."""
    return set().union(*(_refs(target, n) for target in ASSIGNED.findall(text)))
