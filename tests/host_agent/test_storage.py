"""The state on a disk that fills up: preallocated files, a clean error at the failed write, the
last commit intact, and a resume elsewhere that ends on the reference's bits (issue 11.11-12)."""
import errno
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from host_agent import node_core, optim, reference, state
from host_agent.optim import OptimizerConfig
from host_agent.pager import StorageError
from mindp.layout import Layout, TensorSpec
from mindp.protocol import K

from .helpers import BUDGET, initial_fp16, same_bits, small_model, step_sums, sum_headers

N, S, JOB = 3, 8, 1
PAGE_CHUNKS = 32

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs (root)")


@pytest.fixture
def small_disk(tmp_path):
    """Mount a tmpfs of a given size under tmp_path; unmounted at the end."""
    mounts = []

    def mount(size: int):
        d = tmp_path / f"disk{len(mounts)}"
        d.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], check=True)
        mounts.append(d)
        return d

    yield mount
    for d in mounts:
        subprocess.run(["umount", "-l", str(d)], check=False)


def fill(d) -> None:
    """Write into d until the file system says it is full."""
    with open(d / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\xff" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def feed_step(core, lay, gf, step, params):
    sums, nf = step_sums(lay, gf, N, step, params)
    chunks = np.arange(lay.n_chunks)
    hdr, vals = core.handle(sum_headers(JOB, step, chunks, lay, S, N, nf), sums)
    flat = np.zeros(lay.n_chunks * K, np.float16)
    flat[hdr["chunk"].astype(np.int64)[:, None] * K + np.arange(K)] = vals
    return lay.unflatten(flat[: lay.total])


def state_bytes(lay) -> int:
    return -(-lay.n_chunks // PAGE_CHUNKS) * PAGE_CHUNKS * state.RECORD.itemsize


def test_disk_full_mid_run_is_a_clean_error_and_resume_elsewhere_is_exact(small_disk, tmp_path):
    init = small_model()
    lay = optim.layout_of(init)
    cfg = OptimizerConfig(lr=1e-2)
    gf = reference.synthetic_grads(7)
    disk = small_disk(4 * state_bytes(lay) + (1 << 20))
    d = disk / "job"
    state.create(d, lay, state.init_pieces(lay, init), cfg, page_chunks=PAGE_CHUNKS)
    for name in ("state0.bin", "state1.bin"):  # every block reserved at creation: no hole to fill later
        st = os.stat(d / name)
        assert st.st_blocks * 512 >= st.st_size == state_bytes(lay)
    core = node_core.NodeCore(state.Store(d, BUDGET), JOB, N, S)
    params = feed_step(core, lay, gf, 0, initial_fp16(init))
    assert core.committed == 0
    fill(disk)
    with pytest.raises(StorageError) as err:
        feed_step(core, lay, gf, 1, params)  # every chunk applies; the commit cannot be written
    msg = str(err.value)
    assert "\n" not in msg and "No space left" in msg and "commit" in msg
    assert json.loads((d / "commit.json").read_text())["step"] == 0
    assert not (d / "commit.json.tmp").exists()
    # The operator moves the state to a larger disk and restarts: same bits as never interrupted.
    core.store.close()
    big = tmp_path / "big"
    shutil.copytree(d, big)
    store = state.Store(big, BUDGET)
    assert store.committed == 0
    core = node_core.NodeCore(store, JOB, N, S)  # step 1's chunks were all applied: it commits now
    assert core.committed == 1
    for step in (1, 2, 3):  # workers never got step 1's parameters: they resend, the node answers
        params = feed_step(core, lay, gf, step, params)
    ref = reference.train(init, gf, N, 4, cfg)
    assert same_bits(params, ref.params)
    store.export(tmp_path / "out.npz")
    with np.load(tmp_path / "out.npz") as z:
        assert same_bits({k: z[k] for k in z.files}, ref.master)
    store.close()


def test_a_disk_too_small_for_both_copies_is_refused_at_creation(small_disk):
    lay = Layout([TensorSpec("w", (1 << 20,))])  # 12 MiB a copy
    disk = small_disk(state_bytes(lay) + (1 << 20))  # room for one copy, not two
    with pytest.raises(StorageError, match="cannot reserve") as err:
        state.create(disk / "job", lay, state.init_pieces(lay, seed=1), OptimizerConfig(), page_chunks=PAGE_CHUNKS)
    assert "\n" not in str(err.value)
