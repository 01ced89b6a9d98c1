"""softswitch.native.croll: runs of per-element statements rolled into loops compute what the
statements one after another compute (both compiled and run on the same fields), and what must not
be rolled, held in a local or moved is left as it was."""
from __future__ import annotations

import random

import pytest

from softswitch.native import build
from softswitch.native.croll import roll

from .cstatements import run

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C compiler")

SLOTS = 96
K = 12

CASES = {
    # to_fixed's shape: a field per element from another, temporaries at stride 2, a flag ORed
    "elements, temporaries and a flag": [
        line for i in range(K) for line in (
            f"f[{20 + i}] = u64_sel((f[{40 + i}] & 1) != 0, f[{40 + i}] * 3 + f[2], 0ULL - f[{40 + i}]);",
            f"f[{60 + 2 * i}] = f[{20 + i}] ^ f[{61 + 2 * i}];",
            f"f[1] = (f[1] | (f[{40 + i}] >> 63)) & 1ULL;")],
    # the fixed slot f[15] is one the run writes (i = 5): it must not be held in a local
    "a fixed slot the run reaches": [f"f[{10 + i}] = f[15] + {i}ULL;" for i in range(K)],
    # a value carried from one element to the next through a fixed slot
    "a running sum": [line for i in range(K) for line in (f"f[3] = f[3] + f[{40 + i}];", f"f[{20 + i}] = f[3];")],
    # not an arithmetic progression: left as it is
    "no progression": [f"f[{20 + i * i % 7}] = f[{40 + i}];" for i in range(K)],
    # a fold that is no OR: a loop of its own after the elements'
    "a flag XORed": [line for i in range(K) for line in (f"f[{20 + i}] = f[{40 + i}] + 1;",
                                                         f"f[1] = f[1] ^ f[{40 + i}];")],
    # the flag's value is read by the run: the fold must stay in the loop
    "a flag read back": [line for i in range(K) for line in (
        f"f[1] = (f[1] | (f[{40 + i}] & 1)) & 1ULL;", f"f[{20 + i}] = f[1];")],
}


@pytest.mark.parametrize("name", list(CASES))
def test_rolled_statements_compute_the_same_fields(name):
    lines = CASES[name]
    rolled = roll(lines)
    rng = random.Random(name)
    for _ in range(5):
        cells = [rng.getrandbits(64) for _ in range(SLOTS)]
        assert run(rolled, cells) == run(lines, cells)
    text = "\n".join(rolled)
    if name == "no progression":
        assert rolled == lines
    else:
        assert "for (int64_t _e = 0; _e < 12; _e++)" in text
    if name == "a fixed slot the run reaches":
        assert "_f15" not in text  # held in a local, the later elements would read a stale f[15]
    if name == "elements, temporaries and a flag":
        assert "_o1 |= " in text and text.count("for (") == 1  # the flag an OR reduction of the one loop
    if name == "a flag XORed":
        assert "_o1" not in text and text.count("for (") == 2
    if name == "a flag read back":
        assert "_o1" not in text and text.count("for (") == 1


def test_short_runs_and_loop_breaking_statements_stay_as_they_are():
    short = [f"f[{20 + i}] = f[{40 + i}];" for i in range(4)]
    assert roll(short) == short
    barred = [f"if (f[{i}]) return 1;" for i in range(K)] + [f"L_{i}: f[{i}] = 0;" for i in range(K)]
    assert roll(barred) == barred
