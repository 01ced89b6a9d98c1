"""The embedded switch's large buffers on transparent huge pages: a hint that never changes what
they hold (the kernel may or may not grant the pages, so only the contents and the layout are
asserted)."""
from array import array

import numpy as np

from softswitch.batch import HUGE_PAGE, Batch, zeroed
from softswitch.native.state import huge_pages


def test_a_large_batch_is_zeroed_aligned_and_writable():
    batch = Batch.empty(64)
    assert batch.buf.shape == (64, 65544) and batch.buf.dtype == np.uint8
    assert batch.buf.ctypes.data % HUGE_PAGE == 0
    assert not batch.buf.any()
    batch.buf[63, -1] = 7
    batch.buf[0, 0] = 9
    assert batch.buf.sum() == 16


def test_a_small_buffer_is_plain_zeros():
    small = zeroed((4, 100), np.uint32)
    assert small.shape == (4, 100) and small.dtype == np.uint32 and not small.any()


def test_huge_pages_keep_the_register_cells():
    values = np.random.default_rng(1).integers(0, 1 << 63, 3 * HUGE_PAGE // 8 + 5, dtype=np.uint64)
    cells = array("Q", values.tobytes())
    address = cells.buffer_info()[0]
    huge_pages(cells)
    assert cells.buffer_info()[0] == address
    assert np.array_equal(np.frombuffer(cells, np.uint64), values)
    cells[-1] = 3  # still the array's own memory, writable
    assert cells[-1] == 3
