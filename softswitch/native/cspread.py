"""Per-element temporaries laid out side by side in the compiled program's packet state.

p4c numbers the temporaries of per-element code as it meets them, so a loop of croll that uses two
per element reads and writes `f[(b + 2 * _e)]` and `f[(b + 1 + 2 * _e)]`: interleaved slots, which
the C compiler can only store one lane at a time (the fp16 conversion's loop spent most of its time
so). Where a block of slots is reached only by such loops (the same stride and count) and by
constant slots, its slots are renumbered so that each loop's run is contiguous:
b + r + s * e -> b + r * n + e. The packet state `f` of the C code is its own (the Python pipeline
keeps the layout's numbering), and every reference to the block is renumbered alike, so the program
computes the same; anything that could reach the block otherwise (a header moved or zeroed whole, a
stack's computed index) leaves the program as it is."""
from __future__ import annotations

import re

FOR = re.compile(r"^(\s*)for \(int64_t _e = 0; _e < (\d+); _e\+\+\) \{$")
STEPPED = re.compile(r"\bf\[\((\d+) ([+-]) (\d+) \* _e\)\]")
FIXED = re.compile(r"\bf\[(\d+)\]")
RANGES = re.compile(r"mem(?:set|move)\(f \+ (\d+), (?:0|f \+ (\d+)), (\d+)\);")
INDIRECT = re.compile(r"\bf \+|\bf\[[^\d(]|&f\b")


def spread(lines: list[str], reserved: set[int]) -> list[str]:
    """`lines` (the program's code) with each block of interleaved per-element slots renumbered;
    slots in `reserved` (what the packet path names, nonzero initial values) never move."""
    text = "\n".join(lines)
    ranges = RANGES.findall(text)
    if INDIRECT.search(RANGES.sub("", text)):
        return lines
    touched = set()
    for dst, src, nbytes in ranges:
        for start in (dst, src):
            if start:
                touched.update(range(int(start), int(start) + int(nbytes) // 8))
    uses: dict[tuple[int, int, int], None] = {}  # (base, step, rounds) of every run, "-" runs as step < 0
    seen = 0
    for i, line in enumerate(lines):
        m = FOR.match(line)
        if not m:
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j] == f"{m.group(1)}}}"), None)
        if end is None:
            return lines
        for base, sign, step in STEPPED.findall("\n".join(lines[i + 1:end])):
            uses[(int(base), int(step) if sign == "+" else -int(step), int(m.group(2)))] = None
            seen += 1
    if seen != len(STEPPED.findall(text)):  # a run outside the loops read here: leave it all
        return lines
    moves: dict[int, int] = {}
    for block, step, rounds in _blocks(list(uses)):
        slots = range(block, block + step * rounds)
        if touched.intersection(slots) or reserved.intersection(slots):
            continue
        for r in range(step):
            for e in range(rounds):
                moves[block + r + step * e] = block + r * rounds + e
    if not moves:
        return lines

    def stepped(m: re.Match) -> str:
        base = int(m.group(1))
        return f"f[({moves[base]} + 1 * _e)]" if base in moves else m.group(0)

    def fixed(m: re.Match) -> str:
        return f"f[{moves.get(int(m.group(1)), int(m.group(1)))}]"
    return [FIXED.sub(fixed, STEPPED.sub(stepped, line)) for line in lines]


def _blocks(uses: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """(first slot, stride, rounds) of each block whose runs all share stride and rounds, start
    within its first stride and no run of another shape overlaps."""
    found = []
    for base, step, rounds in uses:
        if step <= 1:
            continue
        block = min(b for b, s, n in uses if (s, n) == (step, rounds) and 0 <= base - b < step)
        if any((s, n) == (step, rounds) and block - step < b < block for b, s, n in uses):
            continue  # base's run belongs to a block further down
        end = block + step * rounds
        mine = [(b, s, n) for b, s, n in uses if (s, n) == (step, rounds) and block <= b < block + step]
        others = [(b, s, n) for b, s, n in uses if (b, s, n) not in mine]
        if all(_span(b, s, n)[1] <= block or _span(b, s, n)[0] >= end for b, s, n in others) and \
                (block, step, rounds) not in found:
            found.append((block, step, rounds))
    return found


def _span(base: int, step: int, rounds: int) -> tuple[int, int]:
    """The slots a run reaches, as [lo, hi)."""
    last = base + step * (rounds - 1)
    return (min(base, last), max(base, last) + 1)
