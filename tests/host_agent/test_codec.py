"""codec.decode over received rows, read in place: the same headers and elements whether every row
passes or some are rejected, nothing aliasing the receive buffer, any row layout of the input."""
import numpy as np
import pytest

from mindp import codec
from mindp.protocol import K, Kind

ADDRS = codec.Addresses("02:00:00:00:00:01", "02:00:00:00:00:02", "10.0.0.1", "10.0.0.2")


@pytest.mark.parametrize("kind", [Kind.PARAM, Kind.SUM])
def test_rows_decode_in_place_and_the_result_owns_its_memory(kind):
    rng = np.random.default_rng(int(kind))
    n = 9
    values = (rng.standard_normal((n, K)).astype(np.float16) if kind == Kind.PARAM
              else rng.integers(-(1 << 60), 1 << 60, (n, K)))
    rows = codec.encode(kind, codec.header_array(n, chunk=np.arange(n), step=7), values, ADDRS)
    for bad in ([], [2, 5]):
        buf = rows.copy()
        buf[bad, codec.PREFIX_LEN] = 99  # another protocol version
        dec = codec.decode(buf, kind)
        keep = np.setdiff1d(np.arange(n), bad)
        assert dec.rejects == ({"version": len(bad)} if bad else {})
        assert dec.elements.dtype.isnative and np.array_equal(dec.elements.view(np.uint8), values[keep].view(np.uint8))
        assert list(dec.headers["chunk"]) == list(keep) and set(dec.headers["step"]) == {7}
        buf[:] = 0  # the receive buffer is reused by the next read
        assert np.array_equal(dec.elements.view(np.uint8), values[keep].view(np.uint8))
        assert list(dec.headers["chunk"]) == list(keep)


def test_rows_of_a_wider_buffer_decode_too():
    values = np.ones((3, K), np.float16)
    rows = codec.encode(Kind.PARAM, codec.header_array(3), values, ADDRS)
    wide = np.zeros((3, rows.shape[1] + 8), np.uint8)
    wide[:, : rows.shape[1]] = rows
    dec = codec.decode(wide[:, : rows.shape[1]], Kind.PARAM)  # rows not contiguous with each other
    assert np.array_equal(dec.elements, values) and not dec.rejects


@pytest.mark.parametrize("kind,dtype", [(Kind.PARAM, np.float16), (Kind.PARAM, np.float32), (Kind.SUM, np.int64)])
def test_encode_casts_elements_into_the_rows_as_astype_does(kind, dtype):
    rng = np.random.default_rng(3)
    values = (rng.standard_normal((4, K)) * 1e-3).astype(dtype) if dtype != np.int64 else \
        rng.integers(-(1 << 62), 1 << 62, (4, K))
    rows = codec.encode(kind, codec.header_array(4), values, ADDRS)
    body = rows[:, codec.PREFIX_LEN + codec.HEADER_LEN :]
    assert np.array_equal(body, values.astype(codec.ELEMENT_DTYPE[kind]).view(np.uint8).reshape(4, -1))
