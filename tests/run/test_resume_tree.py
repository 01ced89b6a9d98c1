"""make run RESUME= of a leaf-spine run's sharded nodes, without a network: every shard's state is
copied, and the workers start after the earliest commit, taking a shard that committed one step more
from the copy its last step read."""
import json

import numpy as np
import pytest

from host_agent import optim, state
from mindp.protocol import K
from mininet_topos import config, resume


def sharded_run(runs, ahead: int = 0):
    """A leaf-spine run of 2 shards committed at step -1 (the initial state); `ahead`: that many
    steps more committed by shard 1 (its next copy filled with 7.0: what the step wrote)."""
    d = runs / "20261128-010101"
    (d / "job1").mkdir(parents=True)
    settings = {**config.parse(target="embedded", steps="3", workers="2", topo="leafspine", leaves="2",
                               optimizers="2").on("embedded").to_dict(), "target": "embedded"}
    (d / "config.json").write_text(json.dumps(settings))
    params = {"w": np.arange(3 * K, dtype=np.float32).reshape(3, K), "b": np.ones(5, np.float32)}
    lay = optim.layout_of(params)
    cfg = optim.OptimizerConfig()
    for i, chunks in enumerate([(0, 1), (2, lay.n_chunks - 1)]):
        sd = d / "job1" / f"{resume.STATE}-shard{i}"
        state.create(sd, lay, state.init_pieces(lay, params), cfg, chunks=chunks)
        if i == 1 and ahead:
            n = chunks[1] - chunks[0] + 1
            nxt = np.memmap(sd / "state1.bin", dtype=np.float32, mode="r+", shape=(n, cfg.lanes, K))
            nxt[:] = 7.0
            nxt.flush()
            (sd / "commit.json").write_text(json.dumps({"step": -1 + ahead, "updates": ahead, "skipped": False}))
    np.savez(d / "job1" / "init.npz", **params)
    (runs / "latest").symlink_to(d.name)
    return d, params


@pytest.mark.parametrize("ahead", [0, 1])
def test_a_sharded_run_resumes_after_its_earliest_commit_from_every_shards_parameters(tmp_path, ahead):
    runs = tmp_path / "runs"
    d, params = sharded_run(runs, ahead)
    old = resume.find("latest", runs)
    new_job = tmp_path / "new" / "job1"
    new_job.mkdir(parents=True)
    first, got = resume.take_state(old, 1, new_job)
    assert first == 0  # after the initial state, the earliest commit
    assert all(np.array_equal(got[n], params[n]) for n in params)  # shard 1's ahead copy (7.0) not taken
    assert [p.name for p in resume.state_dirs(new_job)] == [f"{resume.STATE}-shard0", f"{resume.STATE}-shard1"]
    assert state.read_state(new_job / f"{resume.STATE}-shard1")[0]["step"] == -1 + ahead  # copied as it was


def test_shards_two_steps_apart_are_refused_in_one_line(tmp_path):
    runs = tmp_path / "runs"
    sharded_run(runs, ahead=2)
    new_job = tmp_path / "new" / "job1"
    new_job.mkdir(parents=True)
    with pytest.raises(config.RunConfigError, match=r"^RESUME: \S*optimizer-state-shard1 committed step 1, more than one"):
        resume.take_state(resume.find("latest", runs), 1, new_job)
