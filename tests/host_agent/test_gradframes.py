"""Gradients rounded straight into GRAD frames (host_agent.gradframes): numpy's fp16 bits, big-endian,
in place, every kernel; the rows given an Inf or NaN marked, nothing else of the frames touched."""
import subprocess
import sys

import numpy as np
import pytest

from host_agent import fused, gradframes
from mindp import codec
from mindp.protocol import K, Kind

KERNELS = ["numpy"] + ([] if fused.NUMPY_ONLY else ["portable"]) + (["avx2"] if fused.host_has_avx2() else [])
BODY = codec.PREFIX_LEN + codec.HEADER_LEN
ROWS = 5


def hard_values(rng, n, dtype=np.float32):
    """Ordinary, fp16-subnormal, float32-subnormal, overflowing, infinite and NaN values (a
    signalling NaN among them: numpy keeps its payload)."""
    x = (rng.standard_normal(n) * 1e-2).astype(dtype)
    x[::5] *= dtype(1e-4)  # fp16 subnormals
    x[::11] = dtype(65519.0)  # rounds to the largest fp16
    x[::13] = dtype(65520.0)  # rounds to Inf
    x[::17] = dtype(1e-40) if dtype == np.float32 else dtype(1e-310)
    if dtype == np.float32:
        x.view(np.uint32)[::19] = 0x7F800001
    return x


def frames_of(rng):
    """Random bytes everywhere: whatever put must not touch stays as it was."""
    return rng.integers(0, 256, (ROWS, codec.frame_len(Kind.GRAD)), dtype=np.uint8)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("off,size", [(0, ROWS * K), (3, 1), (5, 7), (K - 3, K + 9), (K + 8, 2 * K - 8),
                                      (1, ROWS * K - 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_put_writes_numpys_fp16_bits_big_endian_in_place(kernel, off, size, dtype):
    rng = np.random.default_rng(off * 7 + size)
    x = hard_values(rng, size, np.float64 if dtype == np.float16 else dtype)
    if dtype == np.float16:
        with np.errstate(over="ignore"):
            x = x.astype(np.float16)
    frames = frames_of(rng)
    want = frames.copy()
    elements = want[:, BODY:].copy().view(">u2").reshape(-1)  # the frames' flat element space
    with np.errstate(over="ignore"):
        elements[off : off + size] = x.astype(np.float16).view(np.uint16)
    want[:, BODY:] = elements.view(np.uint8).reshape(ROWS, -1)
    bad = np.zeros(ROWS, np.uint8)
    bad[0] = 1  # marks are never cleared
    gradframes.put(frames, off, x.reshape(1, -1), bad, kernel)
    assert np.array_equal(frames, want)
    with np.errstate(over="ignore"):
        at = off + np.flatnonzero(~np.isfinite(x.astype(np.float16)))
    want_bad = np.zeros(ROWS, bool)
    want_bad[at // K] = True
    want_bad[0] = True
    assert np.array_equal(bad.astype(bool), want_bad)


@pytest.mark.parametrize("kernel", KERNELS)
def test_finite_gradients_mark_nothing(kernel):
    frames, bad = frames_of(np.random.default_rng(1)), np.zeros(ROWS, np.uint8)
    gradframes.put(frames, 0, np.full(ROWS * K, 65504.0, np.float32), bad, kernel)
    assert not bad.any()


@pytest.mark.parametrize("block", [gradframes.HOLDS_ROWS, 1, 2])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("off,size", [(0, ROWS * K), (3, 1), (K - 3, K + 9), (K + 5, 3 * K)])
def test_holds_tells_whether_the_frames_still_hold_a_gradient_as_put_wrote_it(kernel, off, size, block, monkeypatch):
    """Any element whose fp16 bits differ is a change; a float32 change fp16 cannot see, a header
    flagged by the pump thread, or another tensor's elements in the same rows are not. Compared
    `block` rows at a time."""
    monkeypatch.setattr(gradframes, "HOLDS_ROWS", block)
    rng = np.random.default_rng(off + size)
    frames, g = frames_of(rng), hard_values(rng, size)
    i = size // 2
    g[i] = np.float32(0.3)  # an ordinary value to edit
    gradframes.put(frames, off, g, np.zeros(ROWS, np.uint8), kernel)
    assert gradframes.holds(frames, off, g, kernel)
    frames[:, codec.PREFIX_LEN + 2] ^= 0x02  # RETRANSMIT flags
    first, col = divmod(off, K)
    frames[first, BODY : BODY + 2 * col] ^= 0xFF  # the tensor before's elements
    last, col = divmod(off + size, K)
    frames[last:last + 1, BODY + 2 * col:] ^= 0xFF  # the next tensor's (or rows of no element of g)
    frames[last + 1:, BODY:] ^= 0xFF
    assert gradframes.holds(frames, off, g, kernel)
    finer = g.copy()
    finer[i] = np.float32(0.3 + 1e-6)
    assert finer[i] != g[i] and np.float16(finer[i]) == np.float16(g[i])
    assert gradframes.holds(frames, off, finer, kernel)  # the same fp16
    for j in (0, i, size - 1):  # in the first, a middle and the last block
        edited = g.copy()
        edited[j] = np.float32(0.6 if np.float16(g[j]) != np.float16(0.6) else 0.7)
        assert not gradframes.holds(frames, off, edited, kernel)
    for at in (0, K, off):  # an empty tensor (a layout admits one) holds what put() wrote of it: nothing
        assert gradframes.holds(frames, at, np.zeros(0, np.float32), kernel)


@pytest.mark.parametrize("block", [gradframes.HOLDS_ROWS, 1])
@pytest.mark.parametrize("scale", [2.0**16, 1000.0, 0.3])
def test_put_and_holds_unscale_a_gradient_a_block_at_a_time_as_torch_divides_it(scale, block, monkeypatch):
    """With a loss scale, put() writes torch's `g / scale` dividing g a block at a time (the same
    frames and non-finite rows) and holds() compares g so, in float32 (values down to float32's
    subnormals, whose quotients round): an edit of g anywhere is seen. Another dtype with a scale
    is refused (torch divides it in its own arithmetic)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(gradframes, "HOLDS_ROWS", block)
    rng = np.random.default_rng(int(scale))
    off, size = K - 3, 3 * K + 5
    with np.errstate(over="ignore", invalid="ignore"):
        g = torch.from_numpy(hard_values(rng, size) * np.float32(scale))
    g[: size // 4] = torch.from_numpy(rng.standard_normal(size // 4).astype(np.float32) * np.float32(1e-40))
    frames, bad = frames_of(rng), np.zeros(ROWS, np.uint8)
    by_blocks, bad_blocks = frames.copy(), np.zeros(ROWS, np.uint8)
    gradframes.put(frames, off, gradframes.as_array(g / scale), bad)
    gradframes.put(by_blocks, off, g.numpy(), bad_blocks, scale=scale)  # put() dividing a block at a time
    assert np.array_equal(by_blocks, frames) and np.array_equal(bad_blocks, bad) and bad.any()
    assert gradframes.holds(frames, off, g.numpy(), scale=scale)
    assert not gradframes.holds(frames, off, g.numpy())  # (the quotients are what was sent)
    for j in (0, size // 2, size - 1):  # in the first, a middle and the last block
        edited = g.clone()
        edited[j] = (0.6 if np.float16(float(g[j]) / scale) != np.float16(0.6) else 0.7) * scale
        assert not gradframes.holds(frames, off, edited.numpy(), scale=scale)
    for check in (gradframes.holds, lambda *a, **kw: gradframes.put(*a[:3], bad, **kw)):
        with pytest.raises(ValueError, match="float32 gradients by a scale, not float64"):
            check(frames, off, g.double().numpy(), scale=scale)


def test_put_refuses_what_does_not_fit():
    frames, bad = frames_of(np.random.default_rng(2)), np.zeros(ROWS, np.uint8)
    with pytest.raises(ValueError):
        gradframes.put(frames, ROWS * K - 3, np.ones(4, np.float32), bad)
    with pytest.raises(ValueError):
        gradframes.put(frames[:, 1:], 0, np.ones(4, np.float32), bad)


def test_warm_compiles_the_float32_kernel_before_any_gradient():
    """A worker warms put()'s kernel when it is made (a first put compiling it held a worker's first
    gradients for 8 minutes under load, past its peers' step deadline)."""
    code = ("from host_agent import fused, gradframes as g\n"
            "k = fused.selected()\n"
            "fn = g._put_avx2 if k == 'avx2' else g._put_bits if k == 'portable' else None\n"
            "before = len(fn.signatures) if fn else 0\n"
            "g.warm(k)\n"
            "print(k, before, len(fn.signatures) if fn else 0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    if out[0] == "numpy":
        pytest.skip("no compiled kernel on this CPU")
    assert out[1:] == ["0", "1"]
