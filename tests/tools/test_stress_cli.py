"""make stress's command line (tools/stress.py main): bad arguments and scenario configs refused in one
line before anything starts, and a replay under --load. No scenario runs: every way into one is a stub
that fails the test if reached."""
from __future__ import annotations

import json

import pytest

from mindp.harness import testbed
from tools import stress
from tools.stress_config import Config, Event


@pytest.fixture
def no_run(monkeypatch):
    """main() as root, with its tag and SIGTERM handler left alone, and no scenario, loop or busy loop."""
    def reached(*args, **kwargs):
        raise AssertionError(f"a scenario or the loop started: {args}")

    monkeypatch.setattr(stress.os, "geteuid", lambda: 0)
    monkeypatch.setenv(testbed.TAG_ENV, "z")
    monkeypatch.setattr(stress.testbed, "claim_tag", lambda: "z")
    monkeypatch.setattr(stress.signal, "signal", lambda *a: None)
    monkeypatch.setattr(stress, "run_scenario", reached)
    monkeypatch.setattr(stress, "stress", reached)
    monkeypatch.setattr(stress.subprocess, "Popen", reached)


@pytest.fixture
def config(tmp_path):
    """A scenario's config.json as an older mindp or a hand wrote it: no later keys, an int for a float."""
    path = tmp_path / "0001-loopback-7" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"family": "loopback", "seed": 7, "agent_loss": 0,
                                "events": [{"at": 1, "action": "kill", "target": "node", "hold": 0.2}]}))
    return path


@pytest.mark.parametrize("extra, given", [
    (["--minutes", "5"], "--minutes"), (["--seed", "3", "--families", "loopback"], "--seed/--families"),
    (["--out", "x"], "--out"), (["--minutes", "10"], "--minutes"),  # given, though equal to the default
])
def test_a_replay_refuses_the_loops_options(no_run, capsys, config, extra, given):
    assert stress.main(["--replay", str(config), *extra]) == 2
    assert capsys.readouterr().err == f"stress: --replay runs one scenario: {given} do not apply (only --load does)\n"


@pytest.mark.parametrize("text, why", [
    (None, "No such file or directory"),
    ("{", "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    ("[1]", "want a JSON object, got list"),
    ('{"family": "loopback", "seed": 1, "bogus": 2}', "unknown key 'bogus'"),
    ('{"seed": 1}', "no 'family'"),
    ('{"family": "loopback", "seed": 1, "workers": "3"}', "workers: want int, got '3'"),
    ('{"family": "loopback", "seed": 1, "streamed": 1}', "streamed: want bool, got 1"),
    ('{"family": "loopback", "seed": 1, "agent_loss": true}', "agent_loss: want float, got True"),
    ('{"family": "nosuch", "seed": 1}', "unknown family 'nosuch' (families: loopback, threads, embedded, bmv2, makerun)"),
    ('{"family": "loopback", "seed": 1, "events": {}}', "events: want a list"),
    ('{"family": "loopback", "seed": 1, "events": [{"at": 1, "action": "kill", "target": "node"}]}',
     "event 0: no 'hold'"),
])
def test_a_scenario_config_that_cannot_be_read_is_refused_in_one_line(no_run, capsys, tmp_path, text, why):
    path = tmp_path / "config.json"
    if text is not None:
        path.write_text(text)
    assert stress.main(["--replay", str(path)]) == 2
    assert capsys.readouterr().err == f"stress: cannot read scenario config {path}: {why}\n"


@pytest.mark.parametrize("argv, says", [
    (["--families", "loopback,nosuch"],
     "stress: --families: want some of loopback, threads, embedded, bmv2, makerun, got 'loopback,nosuch'"),
    (["--minutes", "0"], "stress: --minutes must be > 0"),
    (["--in-place"], "stress: --in-place is the loop's own, with --replay"),
])
def test_the_loops_bad_arguments_are_refused_in_one_line(no_run, capsys, argv, says):
    assert stress.main(argv) == 2
    assert capsys.readouterr().err == says + "\n"


def test_out_must_be_a_directory_that_can_be_made(no_run, capsys, tmp_path):
    (tmp_path / "file").write_text("x")
    assert stress.main(["--out", str(tmp_path / "file")]) == 2
    assert stress.main(["--out", str(tmp_path / "file" / "sub")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"stress: --out {tmp_path / 'file'} is not a directory",
        f"stress: cannot create --out {tmp_path / 'file' / 'sub'}: Not a directory"]


class Busy:
    """A busy loop's process (BUSY_LOOP), counted while alive."""
    alive = 0

    def __init__(self, argv, **kwargs):
        assert argv == stress.BUSY_LOOP
        Busy.alive += 1

    def terminate(self):
        Busy.alive -= 1

    def wait(self, timeout=None):
        return -15


def test_a_replay_runs_beside_load_busy_loops(no_run, monkeypatch, capsys, config):
    """A failure the loop found under --load replays under the same (it ran without it)."""
    seen = []

    def scenario(cfg, work, in_loop=False):
        assert cfg == Config("loopback", 7, agent_loss=0, events=[Event(1, "kill", "node", 0.2)])
        seen.append((Busy.alive, work.parent == config.parent))
        return {"result": "exact"}

    Busy.alive = 0
    monkeypatch.setattr(stress.subprocess, "Popen", Busy)
    monkeypatch.setattr(stress, "run_scenario", scenario)
    assert stress.main(["--replay", str(config), "--load", "2"]) == stress.EXACT
    assert seen == [(2, True)] and Busy.alive == 0
    assert capsys.readouterr().out == "loopback seed 7: exact\n"


def test_the_loop_prints_a_replay_under_its_load(monkeypatch, capsys, tmp_path):
    from types import SimpleNamespace

    clock = iter([0.0, 0.0, 1e9])  # the loop's end, one scenario's check, then past the end

    class Process(Busy):  # a scenario's process that diverged, or a busy loop
        def __init__(self, argv, **kwargs):
            self.scenario = argv != stress.BUSY_LOOP
            Busy.alive += not self.scenario

        def wait(self, timeout=None):
            return stress.DIVERGED if self.scenario else -15

        def poll(self):
            return self.wait()

    monkeypatch.setattr(stress, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    monkeypatch.setattr(stress.subprocess, "Popen", Process)
    assert stress.stress(1, 0, ["loopback"], tmp_path / "out", 2) == 1
    replay = [line for line in capsys.readouterr().out.splitlines() if "replay:" in line]
    assert len(replay) == 1 and replay[0].endswith("/config.json --load 2")
