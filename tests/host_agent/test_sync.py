"""mindp-optimizer --sync exit: commits without msync or fsync that a killed node still resumes from
bit-exactly, made durable when the store closes, and refused after a reboot that could have torn them."""
import json
import os
import random

import pytest

from host_agent import node_core, optim, reference, state
from host_agent.optim import ConfigError, OptimizerConfig

from .helpers import BUDGET, initial_fp16, same_bits, small_model
from .node_steps import JOB, N, S, assemble, run_step


@pytest.fixture
def fsyncs(monkeypatch):
    """Counts os.fsync calls (a mapped copy's msync is always followed by one)."""
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    return calls


def open_core(d, sync, create=False, map_whole=True):
    init = small_model()
    if create:
        state.create(d, optim.layout_of(init), state.init_pieces(optim.layout_of(init), init), OptimizerConfig(),
                     page_chunks=32)
    return node_core.NodeCore(state.Store(d, BUDGET, sync=sync, map_whole=map_whole), JOB, N, S)


def commit_record(d) -> dict:
    return state.read_commit(d)


@pytest.mark.parametrize("map_whole", [True, False])  # mapped whole; streamed through the pager
def test_exit_sync_commits_without_fsync_resumes_after_a_kill_and_is_durable_at_close(tmp_path, fsyncs, map_whole):
    init, cfg, gf, rng = small_model(), OptimizerConfig(), reference.synthetic_grads(5), random.Random(4)
    lay = optim.layout_of(init)
    core = open_core(tmp_path, "exit", create=True, map_whole=map_whole)
    params = initial_fp16(init)
    fsyncs.clear()
    for step in range(2):
        params = assemble(lay, run_step(core, lay, gf, step, params, rng), params)
    assert fsyncs == []
    assert commit_record(tmp_path)["step"] == 1 and commit_record(tmp_path)["boot"] == state.boot_id().decode().strip()
    del core  # killed: no close
    core = open_core(tmp_path, "exit", map_whole=map_whole)
    assert core.committed == 1
    params = assemble(lay, run_step(core, lay, gf, 2, params, rng), params)
    assert same_bits(params, reference.train(init, gf, N, 3, cfg).params)
    core.store.close()
    assert fsyncs and "boot" not in commit_record(tmp_path) and commit_record(tmp_path)["step"] == 2


def test_a_state_committed_without_fsync_is_refused_after_a_reboot_until_closed_durably(tmp_path, monkeypatch):
    init, gf, rng = small_model(), reference.synthetic_grads(5), random.Random(5)
    lay = optim.layout_of(init)
    core = open_core(tmp_path, "exit", create=True)
    run_step(core, lay, gf, 0, initial_fp16(init), rng)
    del core
    booted = state.boot_id()
    monkeypatch.setattr(state, "boot_id", lambda: b"0" * 36)
    with pytest.raises(ConfigError, match="committed without fsync .* restarted since"):
        state.Store(tmp_path, BUDGET)
    with pytest.raises(ConfigError, match="restarted since"):
        state.read_state(tmp_path)
    monkeypatch.setattr(state, "boot_id", lambda: booted)
    state.Store(tmp_path, BUDGET).close()  # the same boot: resumed, and closed durably
    monkeypatch.setattr(state, "boot_id", lambda: b"0" * 36)
    store = state.Store(tmp_path, BUDGET)
    assert store.committed == 0
    store.close()
    (tmp_path / "commit.json").write_text('{"step": 0, "updates": 1, "skipped": false, "boot": 7}')
    with pytest.raises(ConfigError, match="restarted since"):  # a boot that is no text: another boot
        state.Store(tmp_path, BUDGET)


def test_the_first_step_synced_after_unsynced_ones_makes_both_copies_durable(tmp_path, monkeypatch):
    init, cfg, gf, rng = small_model(), OptimizerConfig(), reference.synthetic_grads(5), random.Random(6)
    lay = optim.layout_of(init)
    core = open_core(tmp_path, "exit", create=True)
    params = assemble(lay, run_step(core, lay, gf, 0, initial_fp16(init), rng), initial_fp16(init))
    del core
    core = open_core(tmp_path, "step")
    flushed = []
    real = core.store.pages.flush
    monkeypatch.setattr(core.store.pages, "flush", lambda copy=None, durable=True: (flushed.append((copy, durable)),
                                                                                    real(copy, durable))[1])
    params = assemble(lay, run_step(core, lay, gf, 1, params, rng), params)
    assert (None, True) in flushed and "boot" not in commit_record(tmp_path)
    flushed.clear()
    params = assemble(lay, run_step(core, lay, gf, 2, params, rng), params)
    assert flushed == [(core.store.copy_after(2), True)]  # from now on only the copy a step writes
    assert same_bits(params, reference.train(init, gf, N, 3, cfg).params)
    core.store.close()


def test_an_unknown_sync_mode_is_refused(tmp_path):
    open_core(tmp_path, "step", create=True).store.close()
    with pytest.raises(ConfigError, match="sync must be one of step|exit"):
        state.Store(tmp_path, BUDGET, sync="never")


def test_exit_sync_rewrites_the_commit_record_in_place_and_close_replaces_it(tmp_path):
    init, gf, rng = small_model(), reference.synthetic_grads(5), random.Random(7)
    lay = optim.layout_of(init)
    core = open_core(tmp_path, "exit", create=True)
    path = tmp_path / "commit.json"
    path.write_text('{"step": -1, "updates": 0, "skipped": false}\n')  # a record before records were padded
    params = initial_fp16(init)
    inodes = []
    for step in range(3):
        params = assemble(lay, run_step(core, lay, gf, step, params, rng), params)
        inodes.append(path.stat().st_ino)
        assert path.stat().st_size == state.COMMIT_BYTES and state.read_commit(tmp_path)["step"] == step
    assert inodes[1] == inodes[2] and not list(tmp_path.glob("*.tmp"))  # the old record replaced once, then rewritten
    assert state.read_commit(tmp_path)["boot"] == state.boot_id().decode().strip()
    core.store.close()
    assert path.stat().st_ino != inodes[-1] and "boot" not in state.read_commit(tmp_path)


def test_a_torn_commit_record_is_read_again_and_a_damaged_one_refused(tmp_path, monkeypatch):
    open_core(tmp_path, "step", create=True).store.close()
    old = state.commit_bytes({"step": 199, "updates": 200, "skipped": False, "boot": "b"})
    new = state.commit_bytes({"step": 200, "updates": 201, "skipped": False, "boot": "b"})
    torn = new[:10] + old[10:]  # a reader's copy of the bytes while the writer's copy is under way
    assert json.loads(torn)["step"] == 299  # whole JSON, a step never committed: only the crc tells
    path = tmp_path / "commit.json"
    reads = iter([torn, b'{"step": 2', new])
    real = type(path).read_bytes
    monkeypatch.setattr(type(path), "read_bytes", lambda p: next(reads) if p == path else real(p))
    assert state.read_commit(tmp_path)["step"] == 200  # read until whole
    monkeypatch.setattr(type(path), "read_bytes", lambda p: torn if p == path else real(p))
    with pytest.raises(ValueError, match="crc does not match its fields .*damaged"):
        state.read_commit(tmp_path)
    with pytest.raises(ConfigError, match="not usable: commit.json's crc does not match"):
        state.Store(tmp_path, BUDGET)
