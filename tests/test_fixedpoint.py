"""Exact fp16 <-> fixed point at scale 2**24, against float64 arithmetic."""
import numpy as np

from mindp.fixedpoint import exact_sum, fixed_to_float64, fixed_to_fp16, fp16_to_fixed, to_fp16

EDGES = np.array(
    [0.0, -0.0, 2.0**-24, -(2.0**-24), 1023 * 2.0**-24, 2.0**-14, 1.0, -1.0, 65504.0, -65504.0, np.inf, -np.inf, np.nan],
    dtype=np.float16,
)


def test_edges_convert_exactly():
    fixed, nonfinite = fp16_to_fixed(EDGES)
    finite = ~nonfinite
    assert list(nonfinite) == [False] * 10 + [True] * 3
    assert np.array_equal(fixed_to_float64(fixed[finite]), EDGES[finite].astype(np.float64))
    assert fixed[0] == 0 and fixed[1] == 0
    assert fixed[2] == 1 and fixed[4] == 1023 and fixed[5] == 1024
    assert fixed[8] == 65504 * 2**24 and fixed[9] == -65504 * 2**24
    assert (fixed[nonfinite] == 0).all()


def test_all_finite_fp16_values_round_trip():
    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    values = bits.view(np.float16)
    fixed, nonfinite = fp16_to_fixed(values)
    assert nonfinite.sum() == 2 * 1024  # exponent 31, both signs
    ok = ~nonfinite
    assert np.array_equal(fixed_to_float64(fixed[ok]), values[ok].astype(np.float64))
    back = fixed_to_fp16(fixed[ok])
    assert np.array_equal(back.astype(np.float64), values[ok].astype(np.float64))
    assert int(np.abs(fixed).max()) < 2**41


def test_exact_sum_matches_float64_and_is_order_independent():
    rng = np.random.default_rng(7)
    scales = rng.choice([1e-7, 1.0, 2e4], size=(16, 4096))
    workers = np.clip(rng.standard_normal((16, 4096)) * scales, -65504, 65504).astype(np.float16)
    workers[0, :5] = [65504, -65504, 2.0**-24, -0.0, 6e-5]
    total, nonfinite = exact_sum(workers)
    assert not nonfinite.any()
    assert np.array_equal(fixed_to_float64(total), workers.astype(np.float64).sum(axis=0))
    shuffled, _ = exact_sum(workers[rng.permutation(16)])
    assert np.array_equal(total, shuffled)


def test_nonfinite_is_flagged_per_element_and_does_not_spill():
    a = np.ones(8, np.float16)
    b = np.ones(8, np.float16)
    b[3] = np.nan
    total, nonfinite = exact_sum([a, b])
    assert list(np.flatnonzero(nonfinite)) == [3]
    assert total[3] == 2**24 and (total[np.arange(8) != 3] == 2 * 2**24).all()


def same_bits(values: np.ndarray, dtype=np.float32) -> bool:
    with np.errstate(over="ignore", invalid="ignore"):  # fp16 overflow; a signalling NaN widened
        values = values.astype(dtype)
        return np.array_equal(to_fp16(values).view(np.uint16), values.astype(np.float16).view(np.uint16))


def test_to_fp16_is_numpys_rounding_bit_for_bit():
    """Below fp16's normal range (where the fast path differs from numpy's code): a spread of
    float32 bit patterns, every tie between two fp16 subnormals (even and odd) and its float32
    neighbours, both signs; as float64 too; NaN payloads, infinities, overflow, normal values; a
    mostly normal array (numpy's own path) and a mostly subnormal one (the fast path)."""
    top = int(np.float32(2.0**-14).view(np.uint32))
    spread = np.arange(0, top + 2, 997, dtype=np.uint32).view(np.float32)
    ties = (np.arange(2049, dtype=np.float64) * 2 + 1) * 2.0**-25
    t32 = ties.astype(np.float32)
    near = np.concatenate([t32, np.nextafter(t32, 0), np.nextafter(t32, 1)])
    nans = np.array([0x7FC12345, 0xFFA00001, 0x7F800001, 0x7FFFFFFF], np.uint32).view(np.float32)
    special = np.array([np.inf, -np.inf, 65504, 65519.9, 65520, 1e30, 0.0, -0.0, 1.0, 2.0**-14], np.float32)
    for part in (spread, near, ties, nans, special):
        for values in (part, -part):
            assert same_bits(values) and same_bits(values, np.float64)
    rng = np.random.default_rng(5)
    for scale in (1.0, 1e-6):
        values = (rng.standard_normal(20000) * scale).astype(np.float32)
        values[::97] = nans[0]
        assert same_bits(values) and same_bits(values.reshape(100, 200))
        assert same_bits(values, np.float16)  # fp16 in (mostly subnormal at 1e-6): taken as it is
