"""Where the compiled pipeline keeps state: registers of one size interleaved cell by cell
(softswitch/compiler/registers.py) and per-element temporaries renumbered contiguous
(softswitch/native/cspread.py). The differential tests (test_native) check that the programs
compute the same; these check the layouts themselves."""
from __future__ import annotations

import pytest

from softswitch.compiler import registers
from softswitch.native.cspread import spread


def test_registers_of_one_size_share_a_buffer_cell_by_cell():
    sizes = {"a": 4, "b": 4, "wide": 4, "small": 2}
    widths = {"a": 64, "b": 32, "wide": 128, "small": 8}
    place = registers.place(sizes, widths)
    assert (place["a"].group, place["b"].group) == (0, 0) and (place["a"].offset, place["b"].offset) == (0, 1)
    assert place["wide"].group != place["a"].group, "a register over 64 bits keeps Python ints apart"
    buffers = registers.allocate(sizes, place, widths)
    cells = registers.views(sizes, place, buffers)
    cells["b"][3] = 7
    cells["a"][-1] = 5
    assert buffers[0][3 * 2 + 1] == 7 and buffers[0][3 * 2] == 5
    assert list(cells["b"]) == [0, 0, 0, 7] and len(cells["b"]) == 4 and sum(cells["a"]) == 5
    with pytest.raises(IndexError):
        cells["a"][4]
    assert isinstance(buffers[place["wide"].group], list)


LOOP = ["    for (int64_t _e = 0; _e < 4; _e++) {",
        "        f[(10 + 2 * _e)] = f[(20 + 1 * _e)];",
        "        f[(11 + 2 * _e)] = f[(10 + 2 * _e)] + 1;",
        "    }",
        "    f[2] = f[13];"]


def test_interleaved_runs_become_contiguous_and_every_reference_follows():
    out = spread(LOOP, reserved=set())
    assert out[1] == "        f[(10 + 1 * _e)] = f[(20 + 1 * _e)];"
    assert out[2] == "        f[(14 + 1 * _e)] = f[(10 + 1 * _e)] + 1;"
    assert out[4] == "    f[2] = f[15];", "slot 13 is run 1's element 1: 10 + 1 * 4 + 1"


@pytest.mark.parametrize("extra, reserved", [
    (["    memmove(f + 3, f + 12, 16);"], set()),  # a header copied out of the block
    (["    x = f[_s[_j]];"], set()),  # a computed index
    ([], {12}),  # a slot the packet path names
])
def test_a_block_reached_otherwise_stays_as_it_is(extra, reserved):
    assert spread(LOOP + extra, reserved) == LOOP + extra
