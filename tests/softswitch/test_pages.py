"""The register pool on transparent huge pages: a hint that never changes what the cells hold (the
kernel may or may not grant the pages, so only the contents and the buffer are asserted)."""
from array import array

import numpy as np

from softswitch.native.state import HUGE_PAGE, huge_pages


def test_huge_pages_keep_the_register_cells():
    values = np.random.default_rng(1).integers(0, 1 << 63, 3 * HUGE_PAGE // 8 + 5, dtype=np.uint64)
    cells = array("Q", values.tobytes())
    address = cells.buffer_info()[0]
    huge_pages(cells)
    assert cells.buffer_info()[0] == address
    assert np.array_equal(np.frombuffer(cells, np.uint64), values)
    cells[-1] = 3  # still the array's own memory, writable
    assert cells[-1] == 3


def test_a_pool_smaller_than_a_huge_page_is_left_alone():
    cells = array("Q", range(1000))
    huge_pages(cells)
    assert list(cells) == list(range(1000))
