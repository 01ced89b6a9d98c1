"""make run RESUME=<run> (the earlier run found, its settings kept, its committed state copied and
read back) and UP=1 (one torchrun command per worker host), without a network."""
import json
import pathlib
import shlex
from dataclasses import replace

import numpy as np
import pytest

from host_agent import optim, state
from mininet_topos import config, resume
from mininet_topos.own_torchrun import commands


def old_run(runs, name="20261128-010101", **cfg):
    d = runs / name
    (d / "job1").mkdir(parents=True)
    settings = {**config.parse(target="embedded", steps="3", workers="2").on("embedded").to_dict(),
                "target": "embedded", **cfg}
    (d / "config.json").write_text(json.dumps(settings))
    params = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(2, np.float32)}
    layout = optim.layout_of(params)
    state.create(d / "job1" / resume.STATE, layout, state.init_pieces(layout, params), optim.OptimizerConfig())
    np.savez(d / "job1" / "init.npz", **params)
    if not (runs / "latest").is_symlink():
        (runs / "latest").symlink_to(name)
    return d, params


def test_resume_finds_the_run_keeps_its_settings_and_copies_its_state(tmp_path):
    runs = tmp_path / "runs"
    d, params = old_run(runs)
    old = resume.find("latest", runs)
    assert old.run == d.resolve()
    cfg = resume.settings(old, config.parse(steps="6", loss="0.02", cli="0"), ["RESUME", "STEPS", "LOSS", "CLI"])
    assert (cfg.workers, cfg.steps, cfg.loss, cfg.target, cfg.cli) == (2, 6, 0.02, "embedded", "0")
    assert resume.settings(old, config.parse(node_ram="1G"), ["RESUME", "NODE_RAM"]).node_ram == 1 << 30
    assert resume.settings(old, config.parse(sync="exit"), ["RESUME", "SYNC"]).sync == "exit"
    assert resume.settings(old, config.parse(sync="exit"), ["RESUME"]).sync == "step"  # the run's own
    assert not resume.settings(old, config.parse(check="0"), ["RESUME", "CHECK"]).check  # this run's own
    new_job = tmp_path / "new" / "job1"
    new_job.mkdir(parents=True)
    first, got = resume.take_state(old, 1, new_job)
    assert first == state.read_committed(d / "job1" / resume.STATE)[0]["step"] + 1
    assert all(np.array_equal(got[n], params[n]) for n in params)
    assert state.exists(new_job / resume.STATE) and (new_job / "init.npz").exists()
    assert state.exists(d / "job1" / resume.STATE)  # the earlier run is left as it was


def test_resume_refusals_are_one_line(tmp_path):
    runs = tmp_path / "runs"
    old_run(runs)
    old = resume.find("20261128-010101", runs)
    with pytest.raises(config.RunConfigError, match="^RESUME=nosuch: no such run"):
        resume.find("nosuch", runs)
    with pytest.raises(config.RunConfigError, match="WORKERS, SEED cannot change"):
        resume.settings(old, config.parse(), ["RESUME", "WORKERS", "SEED"])
    with pytest.raises(config.RunConfigError, match="STEPS=2 is fewer than the run's own 3"):
        resume.settings(old, config.parse(steps="2"), ["RESUME", "STEPS"])
    script = runs.parent / "train.py"
    script.write_text("")
    old_run(runs, "20261128-020202", script=str(script), script_args="--steps 4")
    with pytest.raises(config.RunConfigError, match="is a SCRIPT= run, whose steps are its script's own"):
        resume.settings(resume.find("20261128-020202", runs), config.parse(steps="80"), ["RESUME", "STEPS"])
    with pytest.raises(config.RunConfigError, match=r"ARGS cannot change \(only TARGET, LOSS, PCAP, LOG, CLI, STEPS, "
                       r"NODE_RAM, SYNC, CHECK, PIN\)$"):
        resume.check_given(old, ["RESUME", "ARGS"])  # a built-in run has no script to take them
    with pytest.raises(config.RunConfigError, match=r"WORKERS cannot change \(only TARGET, LOSS, PCAP, LOG, CLI, "
                       r"NODE_RAM, SYNC, CHECK, PIN, ARGS, UP\)$"):
        resume.check_given(resume.find("20261128-020202", runs), ["RESUME", "WORKERS"])
    with pytest.raises(config.RunConfigError, match=r"UP cannot change"):
        resume.check_given(old, ["RESUME", "UP"])  # a built-in run's workers are make run's
    resume.check_given(resume.find("20261128-020202", runs), ["RESUME", "ARGS", "UP"])
    old_run(tmp_path / "r2", topo="leafspine", optimizers=2)  # one shard's state only
    with pytest.raises(config.RunConfigError, match="holds the committed state of 1 of its 2 optimizer node"):
        resume.find("latest", tmp_path / "r2")
    (runs / "empty").mkdir()
    (runs / "empty" / "config.json").write_text("{}")
    with pytest.raises(config.RunConfigError, match="holds the committed state of 0 of its 1 optimizer node"):
        resume.find("empty", runs)


def test_a_script_run_resumes_with_its_own_args_or_those_given(tmp_path):
    """ARGS may change on RESUME (to train on): the run takes them, its other settings the earlier
    run's; without ARGS it keeps its own."""
    runs = tmp_path / "runs"
    script = tmp_path / "train.py"
    script.write_text("")
    old_run(runs, script=str(script), script_args="--steps 4")
    old = resume.find("latest", runs)
    now = replace(config.parse(cli="0"), script_args="--steps 8 --lr 0.01")
    cfg = resume.settings(old, now, ["RESUME", "ARGS", "CLI"])
    assert (cfg.script, cfg.script_args, cfg.workers, cfg.cli) == (str(script), "--steps 8 --lr 0.01", 2, "0")
    assert resume.settings(old, now, ["RESUME"]).script_args == "--steps 4"


def test_args_from_are_the_runs_own_or_those_recorded_with_the_runs_resumed(tmp_path):
    """The script's arguments from each step on, for the reference to replay each step with its own:
    a run's config.json, or job1/args-from.json where it resumed another with ARGS given."""
    from mininet_topos.script_run import ARGS_FROM, args_from

    run = tmp_path / "20261201-010101"
    (run / "job1").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"script": "/t.py", "script_args": "--steps 4 --note 'a b'"}))
    assert args_from(run) == {0: ["--steps", "4", "--note", "a b"]}
    (run / "job1" / ARGS_FROM).write_text(json.dumps({"0": ["--steps", "4"], "3": ["--steps", "9"]}))
    assert args_from(run) == {0: ["--steps", "4"], 3: ["--steps", "9"]}


def test_a_script_edited_since_its_run_is_refused_before_the_network_comes_up(tmp_path):
    """SCRIPT= RESUME=: the file or its ARGS can change, but another model or optimizer is told in
    make run's terms (the node would refuse the state naming its --state-dir)."""
    d, params = old_run(tmp_path / "runs")
    old = resume.find("latest", tmp_path / "runs")
    layout = optim.layout_of(params)
    resume.check_script(old, 1, optim.OptimizerConfig(), layout)  # as it was: resumes
    with pytest.raises(config.RunConfigError, match=r"^RESUME: the script's optimizer is not the one 20261128-010101 "
                       r"trained with: lr 0.001 -> 0.01 \(resume with the same optimizer and schedule, or start a run "
                       r"without RESUME=\)$"):
        resume.check_script(old, 1, optim.OptimizerConfig(lr=0.01), layout)
    wider = {**params, "w": np.zeros((2, 4), np.float32)}
    with pytest.raises(config.RunConfigError, match="the script's model is not the one 20261128-010101 trained"):
        resume.check_script(old, 1, optim.OptimizerConfig(), optim.layout_of(wider))


def test_up_prints_one_torchrun_per_worker_host_in_its_namespace():
    lines = commands("/w/train.py", ["--steps", "5", "--gpt", '{"d": 16}'], {0: "w1_0", 1: "w1_1"},
                     {"w1_0": 101, "w1_1": 102}, "10.0.1.1", {"MINDP_JOB": "1", "MINDP_IFACE": "eth0",
                                                             "MINDP_TOPOLOGY": "/r/topology.json"}, "/v/bin/python",
                     pathlib.Path("/r/logs/torchrun"))
    assert len(lines) == 2
    words = shlex.split(lines[1])
    assert words[:3] == ["mnexec", "-a", "102"] and "MINDP_TOPOLOGY=/r/topology.json" in words
    assert not any(w.startswith("MINDP_IFACE") for w in words)  # init finds the host's interface itself
    assert "GLOO_SOCKET_IFNAME=eth0" in words  # a script's own gloo group binds it, not the hostname's address
    i = words.index("/v/bin/torchrun")
    assert words[i:i + 13] == ["/v/bin/torchrun", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1",
                               "--rdzv-backend", "static", "--master-addr", "10.0.1.1", "--master-port", "29400"]
    assert words[-4:] == ["--steps", "5", "--gpt", '{"d": 16}']
    i = words.index("--log-dir")  # rank 1's output kept apart from rank 0's (whose JSON loss lines are read)
    assert words[i:i + 4] == ["--log-dir", "/r/logs/torchrun/node1", "--tee", "3"]


def test_the_ranks_env_carries_the_runs_k_so_up_commands_match_the_switch(monkeypatch):
    from types import SimpleNamespace

    from mindp import protocol
    from mininet_topos.agents import NodeFiles
    from mininet_topos.script_run import ScriptRun

    monkeypatch.setattr(protocol, "K", 32)  # BMv2's K; a rank without MINDP_K would take the default K
    for nodes, states in ((["opt1"], "/r/job1/optimizer-state"),
                          (["opt1_0", "opt1_1"], "/r/job1/optimizer-state-shard0:/r/job1/optimizer-state-shard1")):
        job = SimpleNamespace(optimizers=nodes, sharded=len(nodes) > 1)
        run = SimpleNamespace(topo_path=pathlib.Path("/r/topology.json"), logs=pathlib.Path("/r/logs"), job=job,
                              files=NodeFiles(job, pathlib.Path("/r/job1")), cfg=SimpleNamespace(loss=0.0, seed=4))
        env = ScriptRun.rank_env.fget(run)
        assert env["MINDP_K"] == "32" and env["MINDP_STATE"] == states  # a sharded job's: every shard's
        assert "MINDP_LOSS" not in env and "MINDP_SEED" not in env
        run.cfg.loss = 0.02  # LOSS reaches the ranks (mindp.torch.init injects it), seeded by SEED
        env = ScriptRun.rank_env.fget(run)
        assert (env["MINDP_LOSS"], env["MINDP_SEED"]) == ("0.02", "4")


def test_a_resumed_run_keeps_its_k_and_bmv2_cannot_take_a_large_one(tmp_path, monkeypatch):
    from mindp import protocol
    from mininet_topos import run as orchestrator

    runs = tmp_path / "runs"
    old_run(runs, k=protocol.DEFAULT_K)
    old = resume.find("latest", runs)
    monkeypatch.setenv(protocol.K_ENV, str(protocol.HARDWARE_K))  # neither the environment's K
    assert orchestrator.run_k("", "auto", old, ("RESUME",)) == protocol.DEFAULT_K  # nor auto's (BMv2: 32)
    assert orchestrator.run_k("", "embedded", old, ("RESUME", "TARGET")) == protocol.DEFAULT_K
    with pytest.raises(config.RunConfigError, match=f"trained at K = {protocol.DEFAULT_K}, which BMv2 cannot run"):
        orchestrator.run_k("", "bmv2", old, ("RESUME", "TARGET"))
    old_run(tmp_path / "r2")  # a run from before config.json named K: the environment's, as before
    assert orchestrator.run_k("", "auto", resume.find("latest", tmp_path / "r2"), ("RESUME",)) == protocol.HARDWARE_K


def test_rank_starts_are_the_ranks_ready_lines_and_those_of_the_runs_resumed(tmp_path):
    """The steps at which each rank's process began, for the script's reference to replay its random
    draws: the runs before (job1/rank-starts.json) and this one's ready lines; a torn line is skipped."""
    from mininet_topos.script_run import RANK_STARTS, rank_starts

    run = tmp_path / "20261130-010101"
    (run / "job1").mkdir(parents=True)
    (run / "job1" / RANK_STARTS).write_text(json.dumps({"0": [0], "1": [0, 3]}))
    ranks = run / "logs" / "ranks"
    ranks.mkdir(parents=True)
    ready = {"job": 1, "ev": "step", "sent": 0}
    (ranks / "rank0.jsonl").write_text(
        json.dumps({**ready, "worker": 0, "step": 6, "start": 7}) + "\n"
        + json.dumps({"job": 1, "worker": 0, "ev": "step", "step": 7, "sent": 4}) + "\n"
        + json.dumps({**ready, "worker": 0, "step": 8, "start": 9}) + "\n" + '{"job": 1, "wor')
    (ranks / "rank1.jsonl").write_text(json.dumps({**ready, "worker": 1, "step": 6, "start": 7}) + "\n")
    assert rank_starts(run) == {0: [0, 7, 9], 1: [0, 3, 7]}
    assert rank_starts(tmp_path / "none") == {}


def test_told_lrs_are_rank_0s_step_records_and_those_of_the_runs_resumed(tmp_path):
    """A script following its own lr (follow_lr): the lrs each step told the node, for the reference:
    the runs before (job1/told-lrs.json) and this one's rank 0 step records, `lrs` where the script
    has several groups (another rank's and a torn line are not read)."""
    from mininet_topos.script_run import TOLD_LRS, told_lrs

    run = tmp_path / "20261130-020202"
    (run / "job1").mkdir(parents=True)
    (run / "job1" / TOLD_LRS).write_text(json.dumps({"0": [0.001], "1": 0.002}))
    ranks = run / "logs" / "ranks"
    ranks.mkdir(parents=True)
    step = {"job": 1, "ev": "step", "sent": 0}
    (ranks / "rank0.jsonl").write_text(json.dumps({**step, "worker": 0, "step": 2, "lr": 0.0025}) + "\n"
                                       + json.dumps({**step, "worker": 0, "step": 3}) + "\n"
                                       + json.dumps({**step, "worker": 0, "step": 4, "lr": 0.5, "lrs": [0.5, 0.25]}) + "\n"
                                       + '{"job": 1, "wo')
    (ranks / "rank1.jsonl").write_text(json.dumps({**step, "worker": 1, "step": 3, "lr": 9.0}) + "\n")
    assert told_lrs(run) == {0: (0.001,), 1: (0.002,), 2: (0.0025,), 4: (0.5, 0.25)}
    assert told_lrs(tmp_path / "none") == {}
