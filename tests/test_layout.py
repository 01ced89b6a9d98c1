"""Named tensors <-> one chunk space, and reassembly in any order."""
import numpy as np
import pytest

from mindp.layout import Layout, MissingChunks, Reassembler, TensorSpec
from mindp.protocol import K
from mindp import schedule


def arrays():
    rng = np.random.default_rng(1)
    return {
        "w1": rng.standard_normal((5, 13)).astype(np.float16),
        "b1": rng.standard_normal(13).astype(np.float16),
        "w2": rng.standard_normal((13, 3)).astype(np.float16),
    }


def test_flatten_unflatten_round_trip():
    a = arrays()
    layout = Layout.of(a)
    assert layout.total == 65 + 13 + 39 and layout.n_chunks == -(-layout.total // K)
    back = layout.unflatten(layout.flatten(a))
    assert all(np.array_equal(back[n], a[n]) and back[n].shape == a[n].shape for n in a)


def test_reassembly_in_any_order_with_duplicates():
    a = arrays()
    layout = Layout.of(a)
    flat = layout.flatten(a)
    padded = np.zeros(layout.n_chunks * K, np.float16)
    padded[: flat.size] = flat
    r = Reassembler(layout)
    order = np.random.default_rng(3).permutation(layout.n_chunks)
    for c in order:
        assert r.add(int(c), padded[c * K : (c + 1) * K])
    assert not r.add(int(order[0]), padded[:K])
    assert r.complete
    out = r.arrays()
    assert all(np.array_equal(out[n], a[n]) for n in a)


def test_missing_chunks_are_named():
    layout = Layout([TensorSpec("x", (4 * K,))])
    r = Reassembler(layout)
    r.add(0, np.zeros(K, np.float16))
    r.add(2, np.zeros(K, np.float16))
    assert r.missing() == [1, 3]
    with pytest.raises(MissingChunks, match="2 chunk"):
        r.arrays()
    assert not r.add(4, np.zeros(K, np.float16)) and not r.add(-1, np.zeros(K, np.float16))


def test_shape_mismatch_and_duplicate_names_are_rejected():
    with pytest.raises(ValueError):
        Layout([TensorSpec("a", (2,)), TensorSpec("a", (3,))])
    with pytest.raises(ValueError, match="shape"):
        Layout([TensorSpec("a", (2,))]).flatten({"a": np.zeros(3)})


@pytest.mark.parametrize("n_chunks,slots", [(10, 4), (3, 8), (16, 16), (17, 16)])
def test_slot_versions_alternate_per_use_across_steps(n_chunks, slots):
    last = {}
    for step in range(4):
        for c in range(n_chunks):
            s = schedule.slot_of(c, slots)
            v = schedule.version_of(step, c, n_chunks, slots)
            if s in last:
                assert v != last[s], (step, c)
            last[s] = v


def test_vectorised_schedule_is_the_scalar_one():
    for n_chunks, slots in ((10, 4), (7, 7), (3, 8), (100, 16)):
        chunks = np.arange(n_chunks)
        for step in (0, 1, 5):
            slot, ver = schedule.slots_and_versions(step, chunks, n_chunks, slots)
            assert list(slot) == [schedule.slot_of(c, slots) for c in chunks]
            assert list(ver) == [schedule.version_of(step, c, n_chunks, slots) for c in chunks]
        steps = np.arange(n_chunks) % 3  # one step per chunk, as the node checks received sums
        _, ver = schedule.slots_and_versions(steps, chunks, n_chunks, slots)
        assert list(ver) == [schedule.version_of(s, c, n_chunks, slots) for s, c in zip(steps, chunks)]
