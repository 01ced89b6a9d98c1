"""State geometry counted in elements: a page's records fill whole OS pages at every K, and hold
about the same elements (so the same bytes) whatever K is."""
import mmap

from host_agent import node_socket, state
from mindp import codec
from mindp.protocol import MAX_K, K, Kind


def test_pages_hold_whole_os_pages_and_about_the_same_elements_at_every_k():
    for k in range(8, MAX_K + 1, 8):
        chunks = state.page_chunks_for(state.PAGE_ELEMENTS, k)
        for lanes in (2, 3):
            assert chunks * 4 * k * lanes % mmap.PAGESIZE == 0, (k, lanes)
        # Within a factor of two of the asked size, unless one OS-page unit is already larger.
        unit = min(c for c in range(1, chunks + 1) if c * 4 * k % mmap.PAGESIZE == 0)
        assert chunks == unit or state.PAGE_ELEMENTS / 2 <= chunks * k <= 2 * state.PAGE_ELEMENTS, k
    assert state.page_chunks_for(state.PAGE_ELEMENTS, 32) == 512  # the size before pages were counted in elements
    assert state.page_chunks_for(state.PAGE_ELEMENTS, 512) == 32


def test_default_page_and_receive_batch_follow_this_processs_k():
    assert state.DEFAULT_PAGE_CHUNKS * K == state.PAGE_ELEMENTS  # K a power of two: exactly
    # The node's receive buffer: RECV_ELEMENTS sums a batch at any K, a few MB (16,384 rows at
    # K = 512 were 67 MB).
    assert node_socket.RECV_ROWS * K == node_socket.RECV_ELEMENTS
    assert node_socket.RECV_ROWS * codec.frame_len(Kind.SUM) < 6 << 20
