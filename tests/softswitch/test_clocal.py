"""softswitch.native.clocal: a per-element temporary becomes a local of its loop's rounds only where
what it holds when a round begins can reach nothing, and the code then computes the same fields."""
from __future__ import annotations

import random

import pytest

from softswitch.native import build
from softswitch.native.clocal import localize

from .cstatements import run

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C compiler")

SLOTS = 64
N = 8
LOOP = f"for (int64_t _e = 0; _e < {N}; _e++) {{"
C1 = "((f[(40 + 1 * _e)] & 1) != 0)"
C2 = "((f[(40 + 1 * _e)] & 2) != 0)"


def loop(*body: str) -> list[str]:
    return [LOOP, *(f"    {line}" for line in body), "}"]


# to_fixed's shape: t keeps its old value where c1 holds, u is t or a value, the field takes u
TO_FIXED = loop(f"f[(8 + 1 * _e)] = u64_sel({C1}, 0ULL, f[(8 + 1 * _e)]);",
                f"f[(16 + 1 * _e)] = u64_sel({C1}, f[(16 + 1 * _e)], u64_sel({C2}, 5ULL, f[(40 + 1 * _e)] * 3));",
                f"f[(8 + 1 * _e)] = u64_sel({C1}, f[(8 + 1 * _e)], f[(16 + 1 * _e)]);",
                "f[(24 + 1 * _e)] = f[(8 + 1 * _e)];") + ["f[0] = f[24] ^ f[31];"]  # the field is read
CASES = {
    "to_fixed's temporaries": (TO_FIXED, {8, 16}),
    # the same temporaries in a second loop (the action called from two places)
    "two loops": (TO_FIXED + TO_FIXED, {8, 16}),
    # where c1 does not hold t keeps its old value, and the field takes it
    "an old value that reaches a field": (loop(f"f[(8 + 1 * _e)] = u64_sel({C1}, 1ULL, f[(8 + 1 * _e)]);",
                                               "f[(24 + 1 * _e)] = f[(8 + 1 * _e)];") + TO_FIXED[-1:], set()),
    # read somewhere by a constant index
    "a slot named elsewhere": (TO_FIXED + ["f[2] = f[9];"], {16}),
    # an old value read by a statement the analysis does not follow
    "another statement": (loop("{ if (f[1]) f[(24 + 1 * _e)] = f[(8 + 1 * _e)]; }",
                               "f[(8 + 1 * _e)] = 7ULL;") + TO_FIXED[-1:], set()),
    # the condition changes between the two selects: t's old value reaches the field
    "a condition the round changes": (loop("f[(8 + 1 * _e)] = u64_sel((f[3] & 1) != 0, 0ULL, f[(8 + 1 * _e)]);",
                                           "f[3] = f[3] + 1;",
                                           "f[(24 + 1 * _e)] = u64_sel((f[3] & 1) != 0, f[(8 + 1 * _e)], 1ULL);")
                                      + TO_FIXED[-1:], set()),
    # p4c's own shape: the condition a temporary set once, before its selects
    "a condition set earlier in the round": (loop("f[(32 + 1 * _e)] = (f[(40 + 1 * _e)] & 1) != 0;",
                                                  *(line.strip().replace(C1, "f[(32 + 1 * _e)] != 0") for line in TO_FIXED[1:-2]))
                                             + TO_FIXED[-1:], {8, 16, 32}),
    # the condition set again between the selects: t's old value reaches the field
    "a condition set again": (loop("f[(32 + 1 * _e)] = (f[(40 + 1 * _e)] & 1) != 0;",
                                   "f[(8 + 1 * _e)] = u64_sel(f[(32 + 1 * _e)] != 0, 0ULL, f[(8 + 1 * _e)]);",
                                   "f[(32 + 1 * _e)] = (f[(40 + 1 * _e)] & 2) != 0;",
                                   "f[(24 + 1 * _e)] = u64_sel(f[(32 + 1 * _e)] != 0, f[(8 + 1 * _e)], 1ULL);")
                              + TO_FIXED[-1:], {32}),
    # the condition changed by a compound assignment between the selects
    "a condition added to": (loop("f[(32 + 1 * _e)] = (f[(40 + 1 * _e)] & 1) != 0;",
                                  "f[(8 + 1 * _e)] = u64_sel(f[(32 + 1 * _e)] != 0, 0ULL, f[(8 + 1 * _e)]);",
                                  "f[(32 + 1 * _e)] += 1;",
                                  "f[(24 + 1 * _e)] = u64_sel(f[(32 + 1 * _e)] != 0, f[(8 + 1 * _e)], 1ULL);")
                             + TO_FIXED[-1:], {32}),
    # an old value ORed into a held local
    "a fold": (["{ uint64_t _f2 = f[2];", *loop("_f2 = (_f2 | f[(8 + 1 * _e)]) & 1ULL;", "f[(8 + 1 * _e)] = 1ULL;"),
                "f[2] = _f2;", "}"], set()),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_temporary_is_a_local_only_where_its_old_value_is_dead(name):
    lines, bases = CASES[name]
    out, dead = localize(lines, reserved=set())
    assert dead == {b + e for b in bases for e in range(N)}
    if not bases:
        assert out == lines
        return
    assert not any(f"f[({b} + 1 * _e)]" in line for line in out for b in bases)
    rng = random.Random(name)
    for _ in range(5):
        cells = [rng.getrandbits(64) for _ in range(SLOTS)]
        scrambled = [rng.getrandbits(64) if i in dead else v for i, v in enumerate(cells)]
        want = run(lines, cells)
        assert [v for i, v in enumerate(run(lines, scrambled)) if i not in dead] == \
            [v for i, v in enumerate(want) if i not in dead]  # the original never looked either
        assert [v for i, v in enumerate(run(out, cells)) if i not in dead] == \
            [v for i, v in enumerate(want) if i not in dead]


def test_reserved_slots_and_computed_indexes_stay_in_the_packet_state():
    assert localize(TO_FIXED, reserved={17})[1] == {8 + e for e in range(N)}
    assert localize(TO_FIXED + ["f[f[1] & 7] = 0;"], reserved=set()) == (TO_FIXED + ["f[f[1] & 7] = 0;"], set())
