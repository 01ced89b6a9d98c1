"""Random expression trees over fields of every kind (unsigned and signed, 1 to 64 bits) and edge
constants, stored into unsigned and signed fields: the C of softswitch.native computes what the
Python pipeline computes, bit for bit, or refuses the expression (then the program would run on
the Python pipeline)."""
from __future__ import annotations

import ctypes
import random

import pytest

from softswitch.compiler import runtime
from softswitch.compiler.expressions import ExpressionCompiler, ExpressionEmitter
from softswitch.compiler.layout import FieldLayout
from softswitch.compiler_errors import UnsupportedConstruct
from softswitch.native import build, cexpr, cprogram

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C compiler")

SOURCES = [(1, False), (8, False), (16, False), (32, False), (48, False), (64, False), (16, True), (32, True),
           (64, True), (9, False)]
DESTS = [(64, False), (13, False), (32, True), (64, True), (1, False)]
WIDTHS = [w for w, _ in SOURCES + DESTS] + [32, 32]
SIGNED = [s for _, s in SOURCES + DESTS] + [False, False]
LAYOUT = FieldLayout({}, WIDTHS, SIGNED, len(WIDTHS), len(WIDTHS) - 2, len(WIDTHS) - 1)
CONSTS = [0, 1, 2, 3, 7, 8, 15, 16, 31, 32, 63, 64, 65, 127, 128, 255, 0xFFFF, 2**32 - 1, 2**63, 2**64 - 1, -1, -5]
BINARY = ["+", "-", "*", "&", "|", "^", "<<", ">>", "/", "%", "==", "!=", "<", ">=", "and", "or"]
UNARY = ["not", "~", "d2b", "b2d"]
CASTS = ["two_comp_mod", "usat_cast", "sat_cast"]


def tree(rng: random.Random, depth: int):
    if depth == 0 or rng.random() < 0.2:
        if rng.random() < 0.65:
            return ("f", rng.randrange(len(SOURCES)))
        return ("c", rng.choice(CONSTS))
    kind = rng.random()
    if kind < 0.6:
        op = rng.choice(BINARY)
        if op in ("and", "or"):
            return (op, (rng.choice(["==", "<"]), tree(rng, depth - 1), tree(rng, depth - 1)),
                    ("!=", tree(rng, depth - 1), ("c", 0)))
        if op in ("<<", ">>") and rng.random() < 0.5:
            return (op, tree(rng, depth - 1), ("c", rng.choice([0, 1, 3, 15, 63, 64, 100, 200])))
        return (op, tree(rng, depth - 1), tree(rng, depth - 1))
    if kind < 0.75:
        return (rng.choice(UNARY), None, tree(rng, depth - 1))
    if kind < 0.9:
        return (rng.choice(CASTS), tree(rng, depth - 1), ("c", rng.choice([1, 8, 16, 32, 63, 64])))
    return ("?", ("<", tree(rng, depth - 1), tree(rng, depth - 1)), tree(rng, depth - 1), tree(rng, depth - 1))


def values(rng: random.Random) -> list[int]:
    out = []
    for width, signed in SOURCES:
        v = rng.choice([0, 1, (1 << width) - 1, 1 << (width - 1), rng.getrandbits(width)])
        out.append(v - (1 << width) if signed and v >> (width - 1) else v)
    return out + [0] * (len(WIDTHS) - len(SOURCES))


def as_u64(v: int) -> int:
    return v & ((1 << 64) - 1)


def test_random_expressions_equal_the_python_pipeline():
    rng = random.Random(2027)
    compiler = ExpressionCompiler(LAYOUT, {}, {}, 1)
    cases, functions = [], []
    refused = narrowed = 0
    while len(cases) < 400:
        node = tree(rng, rng.randrange(1, 5))
        dest = len(SOURCES) + rng.randrange(len(DESTS))
        try:
            c_line = cexpr.CExpr(compiler).store(dest, node)
        except UnsupportedConstruct:
            refused += 1
            continue
        py_line = ExpressionEmitter(compiler).store(dest, node)
        narrowed += "N64(" in c_line
        functions.append(f"void e_{len(cases)}(uint64_t *f) {{ {c_line} }}")
        cases.append((node, dest, py_line))
    source = cprogram.PRELUDE.read_text() + "\n".join(functions) + "\n"
    lib = ctypes.CDLL(str(build.build(source)))
    ns = runtime.base_namespace()
    checked = 0
    for i, (node, dest, py_line) in enumerate(cases):
        fn = getattr(lib, f"e_{i}")
        for _ in range(20):
            f = values(rng)
            before = list(f)
            try:
                exec(py_line, ns, {"f": f})
            except (ValueError, OverflowError):
                continue  # the Python pipeline drops such a packet; the C generator refuses what can raise
            cells = (ctypes.c_uint64 * len(f))(*[as_u64(v) for v in before])
            fn(cells)
            assert cells[dest] == as_u64(f[dest]), f"{node} with {f[:len(SOURCES)]}: {py_line}"
            checked += 1
    assert checked > 5000 and refused < len(cases), (checked, refused)
    # Both ways of computing are checked: many trees have int64_t subtrees, some have none.
    assert len(cases) // 4 < narrowed < len(cases), narrowed
    print(f"{checked} evaluations of {len(cases)} expressions ({narrowed} with int64_t parts); {refused} refused")

