"""make stress's pieces without a network: the scenarios it draws (families, BMv2's K, controller
kills, small socket buffers, make run's models and scripts), what it skips and why, make run's
command line and verdict, and the small-buffer wrapper; as root, one switch scenario end to end
with its controller and switch killed."""
from __future__ import annotations

import json
import os
import random
import shlex
import socket
import subprocess
import sys
import threading

import pytest

from mindp import INSTALL_TORCH, protocol, targets
from tools import stress, stress_config, stress_makerun, stress_sockbuf
from tools.stress_config import BMV2_KS, FAMILIES, SCRIPTS, SMALL_GPT, SWITCH_FAMILIES, Config, Event, random_config


def drawn(family: str, n: int = 200) -> list[Config]:
    rng = random.Random(family)
    return [random_config(rng, family) for _ in range(n)]


def test_bmv2_scenarios_run_a_k_bmv2_runs_and_inject_no_switch_faults():
    cfgs = drawn("bmv2")
    assert {c.k for c in cfgs} == set(BMV2_KS) and all(protocol.bmv2_fits(c.k) for c in cfgs)
    assert all(c.fabric_drop == c.fabric_dup == c.fabric_reorder == 0.0 for c in cfgs)


def test_controller_kills_only_on_a_switch():
    for family in FAMILIES:
        events = [e for c in drawn(family) for e in c.events]
        on_ctl = [e for e in events if e.target == "controller"]
        if family in SWITCH_FAMILIES:
            assert on_ctl and all(e.action == "kill" for e in on_ctl)
        else:
            assert not on_ctl


def test_small_socket_buffers_are_drawn_but_not_for_make_run():
    assert any(c.sockbuf for c in drawn("loopback")) and any(not c.sockbuf for c in drawn("loopback"))
    assert not any(c.sockbuf or c.events for c in drawn("makerun"))


def test_makerun_draws_gpt_scripts_and_bmv2():
    cfgs = drawn("makerun", 400)
    scripts = [c for c in cfgs if c.script]
    assert {c.script for c in scripts} == set(SCRIPTS) and all(c.jobs == 1 for c in scripts)
    # two ranks: on a star, or one on each of two leaves (the job's node in one or two shards)
    assert {(c.topo, c.workers, c.optimizers) for c in scripts} == {("star", 2, 1), ("leafspine", 1, 1),
                                                                    ("leafspine", 1, 2)}
    assert all(c.gpt == SMALL_GPT for c in cfgs if c.model == "gpt" or c.script.endswith("gpt.py"))
    bmv2 = [c for c in cfgs if c.target == "bmv2"]
    assert bmv2 and all(c.model == "mlp" and protocol.bmv2_fits(c.k) for c in bmv2)
    assert all(c.jobs == 1 for c in cfgs if c.topo == "leafspine")


def test_config_round_trips_and_old_configs_still_load(tmp_path):
    cfg = Config("bmv2", 5, k=32, sockbuf=65536, events=[Event(1.0, "kill", "controller", 0.2)])
    cfg.dump(tmp_path / "config.json")
    assert Config.load(tmp_path / "config.json") == cfg
    (tmp_path / "old.json").write_text(json.dumps({"family": "embedded", "seed": 3, "workers": 2}))
    old = Config.load(tmp_path / "old.json")
    assert (old.k, old.sockbuf, old.target, old.script) == (0, 0, "embedded", "")


def test_bmv2_scenarios_are_skipped_with_a_reason(monkeypatch):
    monkeypatch.setattr(targets, "find_bmv2", lambda: "/usr/bin/simple_switch_grpc")
    assert Config("bmv2", 1, k=32).skip_reason() is None
    assert "BMv2 runs K up to 80, not 512" in Config("bmv2", 1, k=512).skip_reason()
    assert Config("makerun", 1, target="bmv2", k=512).skip_reason().startswith("BMv2 runs K up to")
    assert Config("makerun", 1, k=512).skip_reason() is None
    assert Config("embedded", 1, k=64).skip_reason().startswith("no compiled program for K = 64")
    assert Config("loopback", 1, k=64).skip_reason() is None  # no switch, no program
    monkeypatch.setattr(targets, "find_bmv2", lambda: None)
    assert Config("bmv2", 1, k=32).skip_reason() == "BMv2 (simple_switch_grpc) is not installed"
    verdict = stress.run_scenario(Config("bmv2", 1, k=32), None)
    assert verdict == {"result": "skipped", "reason": "BMv2 (simple_switch_grpc) is not installed"}


def test_makerun_scenarios_that_need_pytorch_are_skipped_where_it_is_not_installed(monkeypatch):
    """make setup goes on without torch where PyTorch's index is unreachable: make stress then failed
    every cnn, gpt and script scenario (make run refuses them) instead of skipping them."""
    cnn, script, mlp = Config("makerun", 1, model="cnn"), Config("makerun", 1, model="script", script=SCRIPTS[0]), \
        Config("makerun", 1, model="mlp")
    monkeypatch.setattr(stress_config, "torch_installed", lambda: True)
    assert cnn.skip_reason() is None and script.skip_reason() is None
    monkeypatch.setattr(stress_config, "torch_installed", lambda: False)
    assert cnn.skip_reason() == f"PyTorch is not installed (MODEL=cnn needs it: {INSTALL_TORCH})"
    assert script.skip_reason() == f"PyTorch is not installed (SCRIPT= needs it: {INSTALL_TORCH})"
    assert mlp.skip_reason() is None
    assert stress.run_scenario(cnn, None) == {"result": "skipped", "reason": cnn.skip_reason()}


def test_makerun_command_for_a_script_gives_its_steps_and_gpt_as_its_arguments(tmp_path):
    cmd = stress_makerun.command(Config("makerun", 7, workers=2, steps=3, model="script",
                                        script="examples/train_gpt.py", gpt=SMALL_GPT), tmp_path)
    assert "--model" not in cmd and "--steps" not in cmd and "--gpt" not in cmd
    assert cmd[cmd.index("--script") + 1].endswith("examples/train_gpt.py")
    assert shlex.split(cmd[cmd.index("--args") + 1]) == ["--steps", "3", "--gpt", SMALL_GPT]
    cmd = stress_makerun.command(Config("makerun", 7, model="gpt", gpt=SMALL_GPT, target="bmv2", k=32), tmp_path)
    assert cmd[cmd.index("--gpt") + 1] == SMALL_GPT and cmd[cmd.index("--target") + 1] == "bmv2"
    assert cmd[cmd.index("--k") + 1] == "32" and cmd[:2] == ["flock", "-w"]


@pytest.mark.parametrize("code, summary, result", [
    (0, {"max_abs_param_diff_vs_reference": 0.0, "digest_mismatches": 0}, "exact"),
    (1, {"max_abs_param_diff_vs_reference": 0.5}, "diverged"),
    (0, {"max_abs_param_diff_vs_reference": 0.0, "digest_mismatches": 2}, "diverged"),
    (1, {"steps_done": 3}, "failed"),  # stopped before comparing
    (0, {"steps_done": 3}, "failed"),  # nothing says it is exact
    (1, None, "failed"),
    (stress_makerun.LOCK_BUSY, None, "skipped"),
])
def test_makerun_verdict(code, summary, result):
    v = stress_makerun.verdict(code, summary)
    assert v["result"] == result
    assert ("reason" in v) == (result == "skipped")


def test_sockbuf_wrapper_shrinks_the_buffers_of_every_prepared_socket(monkeypatch):
    from host_agent import rawsock

    monkeypatch.setattr(rawsock, "prepare", rawsock.prepare)  # restored after the test
    monkeypatch.setattr(rawsock, "RING", True)
    stress_sockbuf.shrink(8192)
    assert rawsock.RING is False
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        rawsock.prepare(s)
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) <= 2 * 8192
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) <= 2 * 8192
        assert not s.getblocking()  # what prepare does besides is kept


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)")
def test_switch_scenario_with_its_controller_and_switch_killed_is_exact(tmp_path):
    """The embedded switch with small socket buffers: its controller process killed (a new one
    learns the job from the switch), then the switch (the new controller restores it)."""
    cfg = Config("embedded", 4242, workers=2, steps=4, sockbuf=65536, events=[
        Event(0.3, "kill", "controller", 0.1), Event(1.0, "kill", "switch", 0.1)])
    cfg.dump(tmp_path / "config.json")
    # its own process, as the stress loop runs each scenario (it sets signal handlers and may re-exec)
    run = subprocess.run([sys.executable, "-m", "tools.stress", "--replay", str(tmp_path / "config.json"), "--in-place"],
                         cwd=stress.REPO, capture_output=True, text=True)
    assert run.returncode == stress.EXACT, run.stdout + run.stderr + "".join(
        f"\n--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(tmp_path.glob("*.log"))
        + [tmp_path / "verdict.json"] if p.exists())
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    assert verdict["faults"] == ["kill controller at 0.3 s for 0.1 s", "kill switch at 1.0 s for 0.1 s"]
    lives = (tmp_path / "controller.log").read_text()
    assert lives.count("--reconcile") == 1 and "restored: pushed the pipeline" in lives


def agent(proc, up=lambda: True):
    """A scenario's agent over a fake process; `up`: whether the life's log says it is up."""
    return type("A", (), {"proc": proc, "said": lambda self, text: up()})()


class FakeProc:
    """A process that ends by itself after `polls` polls (None: never), or when terminated."""

    def __init__(self, polls: int | None, code: int = 0):
        self.polls, self.code, self.terminated = polls, code, False

    def poll(self):
        if self.terminated:
            return -15
        if self.polls is None:
            return None
        self.polls -= 1
        return self.code if self.polls < 0 else None

    def terminate(self):
        self.terminated = True


def test_a_node_whose_workers_have_ended_is_told_to_end(monkeypatch, tmp_path):
    """Workers that failed leave the node serving (its steps never done): the scenario ends it
    LINGER s after the last worker, not at the scenario's cap."""
    from tools import stress_scenario

    clock = [0.0]
    monkeypatch.setattr(stress_scenario.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(stress_scenario.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    sc = stress_scenario.Scenario(Config("loopback", 1, workers=2), tmp_path)
    node = FakeProc(None)
    sc.procs = {"node": agent(node), "worker0": agent(FakeProc(3, 1)), "worker1": agent(FakeProc(5, 1))}
    codes = sc._wait()
    assert node.terminated and codes == {"node": -15, "worker0": 1, "worker1": 1}
    assert stress_scenario.LINGER < clock[0] < stress_scenario.LINGER + 5  # not SCENARIO_CAP


class ExportingNode:
    """A node that, told to end, exports for `polls` polls and exits 0; told again meanwhile, it dies
    by the signal (as a second SIGTERM in its interpreter's shutdown kills it)."""

    def __init__(self, polls: int):
        self.polls, self.told = polls, 0

    def poll(self):
        if self.told > 1:
            return -15
        if not self.told:
            return None
        self.polls -= 1
        return 0 if self.polls < 0 else None

    def terminate(self):
        self.told += 1


def test_a_node_told_to_end_is_told_once_and_exits_as_it_does(monkeypatch, tmp_path):
    from tools import stress_scenario

    clock = [0.0]
    monkeypatch.setattr(stress_scenario.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(stress_scenario.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    sc = stress_scenario.Scenario(Config("loopback", 1, workers=1), tmp_path)
    node = ExportingNode(polls=20)  # 2 s of the loop's 0.1 s polls: a slow export on a busy machine
    sc.procs = {"node": agent(node), "worker0": agent(FakeProc(3))}
    assert sc._wait() == {"node": 0, "worker0": 0}
    assert node.told == 1


class StartingNode(ExportingNode):
    """A node life that is up (its SIGTERM handler set) after `start` polls; told to end before,
    it dies by the signal."""

    def __init__(self, start: int, polls: int):
        super().__init__(polls)
        self.start, self.early = start, False

    def up(self) -> bool:
        return self.start <= 0

    def poll(self):
        if self.early:
            return -15
        self.start -= 1
        return super().poll()

    def terminate(self):
        self.early |= not self.up()
        super().terminate()


def test_a_node_life_still_starting_is_told_to_end_only_once_up(monkeypatch, tmp_path):
    """An event's new life of the node, slow to start on a busy machine past LINGER after the
    workers ended, is told once it is up, and exits 0 (a threads scenario with exact training
    failed by the node's -15)."""
    from tools import stress_scenario

    clock = [0.0]
    monkeypatch.setattr(stress_scenario.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(stress_scenario.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    sc = stress_scenario.Scenario(Config("threads", 1, workers=1), tmp_path)
    node = StartingNode(start=int(stress_scenario.LINGER / 0.1) + 30, polls=5)
    sc.procs = {"node": agent(node, node.up)}
    assert sc._wait() == {"node": 0}
    assert node.told == 1 and not node.early


class KilledLife:
    """A process an event killed (SIGKILL, -9); `seen` is set once the scenario has polled it."""

    def __init__(self):
        self.seen = threading.Event()

    def poll(self):
        self.seen.set()
        return -9


def test_a_node_killed_and_being_restarted_by_an_event_is_waited_for_in_its_new_life(monkeypatch, tmp_path):
    """The workers ended while an event had the node killed and held it down: its -9 is not the
    scenario's result (a replayed threads scenario failed so, its training exact); the new life is
    waited for and ends as told."""
    from tools import stress_scenario

    clock = [0.0]
    monkeypatch.setattr(stress_scenario.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(stress_scenario.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    sc = stress_scenario.Scenario(Config("threads", 1, workers=1), tmp_path)
    node = agent(killed := KilledLife())
    sc.procs = {"node": node}
    out = {}
    with sc.injecting:  # the event: the node killed, its restart after the hold
        waiter = threading.Thread(target=lambda: out.update(sc._wait()), daemon=True)
        waiter.start()
        assert killed.seen.wait(60)
        node.proc = restarted = ExportingNode(polls=3)
    waiter.join(60)
    assert out == {"node": 0} and restarted.told == 1


def test_a_stress_run_that_kept_no_scenario_leaves_no_directory(monkeypatch, tmp_path):
    """Exact scenarios are removed as they end; the directory meant for failing ones goes too."""
    from types import SimpleNamespace

    from tools import stress

    clock = iter([0.0, 0.0, 0.0, 1e9])  # the loop's end, then two scenarios' checks, then past the end
    monkeypatch.setattr(stress, "time", SimpleNamespace(monotonic=lambda: next(clock)))

    class Exact:  # a scenario's process that came out exact
        def __init__(self, *args, **kwargs):
            pass

        def wait(self, timeout=None):
            return stress.EXACT

        def poll(self):
            return stress.EXACT

    monkeypatch.setattr(stress.subprocess, "Popen", Exact)
    out = tmp_path / "runs" / "stress-x"
    assert stress.stress(1, 0, ["loopback"], out, 0) == 0
    assert not out.exists() and (tmp_path / "runs").is_dir()
    (out / "0000-loopback-1").mkdir(parents=True)  # a failing scenario's: kept, and its directory with it
    clock = iter([0.0, 1e9])  # the lambda reads it: no scenario this time
    stress.stress(1, 0, ["loopback"], out, 0)
    assert (out / "0000-loopback-1").is_dir()


def test_every_makerun_command_passes_make_runs_own_checks(tmp_path):
    """The makerun family's command lines as mininet_topos.run checks them: a script's run without loss
    passed --seed, which such a run refuses (it seeds only the loss)."""
    from mininet_topos import run

    rng = random.Random(5)
    configs = [random_config(rng, "makerun") for _ in range(200)]
    assert any(c.script and not c.agent_loss for c in configs) and any(c.script and c.agent_loss for c in configs)
    parser = run.build_parser()
    for c in configs:
        if c.skip_reason():  # (where PyTorch is not installed, its models' and scripts': make stress skips them too)
            continue
        cmd = stress_makerun.command(c, tmp_path)
        args = parser.parse_args(cmd[cmd.index("mininet_topos.run") + 1:])
        run.settings(args, run.given_names(args, parser), None)  # raises config.RunConfigError if refused
