"""mindp.torch.widened: DataParallel's compiled check that float32 parameters still hold the fp16
values the network wrote, as torch's copy_ widens them."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mindp.torch import widened  # noqa: E402

pytestmark = pytest.mark.skipif(not widened.COMPILED, reason="no numba: parallel compares through torch")


def every_pattern() -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def is_nan(half: np.ndarray) -> np.ndarray:
    return ((half & 0x7C00) == 0x7C00) & ((half & 0x3FF) != 0)


def torch_widened(half: np.ndarray) -> np.ndarray:
    """What finish() leaves in a float32 parameter: torch's copy_ of the fp16 values (its vector
    loop, and its scalar one for a tail shorter than a vector)."""
    p = torch.empty(len(half), dtype=torch.float32)
    p.copy_(torch.from_numpy(half.view(np.float16)))
    return p.numpy().view(np.uint32)


def test_every_fp16_pattern_as_torch_copies_it_is_the_same():
    half = every_pattern()
    assert widened.same(torch_widened(half), half)  # the vector loop
    for h in half[is_nan(half)][::7].tolist() + [0, 1, 0x3C00, 0x7C00, 0xFC00, 0x8001]:  # one at a time: the scalar one
        one = np.array([h], np.uint16)
        assert widened.same(torch_widened(one), one), hex(h)


def test_a_nan_is_the_same_as_any_nan_and_nothing_else():
    half = np.array([0x7E00, 0xFE00, 0x7C01], np.uint16)
    assert widened.same(np.array([0x7FFFFFFF, 0x7FC00000, 0xFFC00001], np.uint32), half)
    for other in (0x7F800000, 0xFF800000, 0x7F7FFFFF, 0):  # Inf, -Inf, the largest float32, zero
        assert not widened.same(np.array([0x7FC00000, 0x7FC00000, other], np.uint32), half)


@pytest.mark.parametrize("at", [0, 1, 12_345, 0x7C00, 0xFBFF])
@pytest.mark.parametrize("bit", [0, 13, 22, 31])
def test_any_changed_bit_of_a_number_is_a_difference(at, bit):
    """Zero, a subnormal, a normal, Inf, fp16's lowest: an edit below fp16's precision (bits 0-12 of
    a float32), in its mantissa, or of its sign."""
    half = every_pattern()
    bits = torch_widened(half)
    bits[at] ^= np.uint32(1 << bit)
    assert not widened.same(bits, half)


def test_arrays_of_other_lengths_differ():
    half = every_pattern()[:10]
    assert not widened.same(torch_widened(half)[:9], half)
    assert widened.same(np.zeros(0, np.uint32), np.zeros(0, np.uint16))
