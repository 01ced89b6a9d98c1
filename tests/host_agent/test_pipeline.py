"""The node-core and storage suites again with the state streamed through the page pipeline
(pread/pwrite buffers, reader and writer threads) instead of mapped whole: with every page kept
resident across steps, and with the smallest budget (4 pages: nothing kept, one page read ahead)."""
import json
import pathlib

import numpy as np
import pytest

from host_agent import state
from mindp.protocol import K

from .test_node_core import *  # noqa: F401,F403 - the same tests, collected here under the fixture below
from .test_storage import (test_a_disk_too_small_for_both_copies_is_refused_at_creation,  # noqa: F401
                           test_disk_full_mid_run_is_a_clean_error_and_resume_elsewhere_is_exact)
from .test_storage import small_disk  # noqa: F401 - its fixture

PAGE = 32 * state.RECORD.itemsize


@pytest.fixture(autouse=True, params=["resident", "minimal"])
def streamed(request, monkeypatch):
    """Every Store of the test streams; "minimal" also cuts its budget to 4 pages."""
    orig = state.Store.__init__

    def init(self, state_dir, budget_bytes, **kw):
        meta = json.loads((pathlib.Path(state_dir) / "meta.json").read_text())
        page = meta["page_chunks"] * state.record(state.record_lanes(meta)).itemsize  # SGD's records are smaller
        if request.param == "minimal":
            budget_bytes = 4 * page
        orig(self, state_dir, budget_bytes, **{**kw, "map_whole": False})
        assert not self.pages.mapped
        if request.param == "resident" and budget_bytes >= (self.n_pages + 6) * page:
            assert self.pages.plan.resident == frozenset(range(self.n_pages))
        elif request.param == "minimal":
            assert not self.pages.plan.resident and self.pages.plan.ahead == 1

    monkeypatch.setattr(state.Store, "__init__", init)
    yield request.param


def test_buffers_kept_across_steps_are_not_read_again(tmp_path, streamed):
    """With every page resident, the second step reads nothing from disk; with 4 pages, every page
    of the source is read once per step (give or take an evicted page), and no destination page is
    ever read."""
    init = {"w": np.random.default_rng(0).standard_normal(20 * 32 * K).astype(np.float32)}  # 20 pages
    lay = optim.layout_of(init)
    state.create(tmp_path, lay, state.init_pieces(lay, init), OptimizerConfig(), page_chunks=32)
    store = state.Store(tmp_path, 64 * PAGE)
    core = node_core.NodeCore(store, JOB, N, S)
    gf = reference.synthetic_grads(2)
    params = initial_fp16(init)
    reads = []
    for step in range(3):
        before = store.pager.stats.read_bytes
        params = assemble(lay, run_step(core, lay, gf, step, params, random.Random(step), dup=0, batch=16,
                                        window=16), params)
        reads.append(store.pager.stats.read_bytes - before)
    copy = lay.n_chunks * state.RECORD.itemsize
    if streamed == "resident":
        assert reads == [copy, 0, 0]
    else:
        # Every page once a step (the next step's first page is read ahead while the last commits,
        # so a step's figure may hold a page of the next); out-of-order sums may cost a page again.
        assert all(copy - PAGE <= r <= copy + 2 * PAGE for r in reads), reads
        assert 3 * copy <= sum(reads) <= 3 * copy + 2 * PAGE, reads
    assert store.pager.stats.written_bytes == 3 * copy
    assert same_bits(params, reference.train(init, gf, N, 3, OptimizerConfig()).params)
    store.close()
