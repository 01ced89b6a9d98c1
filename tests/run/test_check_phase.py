"""The check after training (the reference trained in make run's process, about as long as the
training): its progress is shown, and a stop during it keeps the run's figures, saying that its bits
were not compared."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from mininet_topos import run as make_run
from mininet_topos.console import Console, Pace, Stopped, duration, pace
from mininet_topos.progress import Progress
from mininet_topos.star import NOT_COMPARED, Run


class Said:
    def __init__(self):
        self.lines = []

    def say(self, msg=""):
        self.lines.append(msg)


def test_pace_says_the_rate_and_the_time_left():
    assert pace(0, 1500, 0.0) == "step 0/1500"  # no rate before a step is done
    assert pace(300, 1500, 100.0) == "step 300/1500, 3 steps/s, 6 min 40 s left"
    assert pace(1500, 1500, 500.0).endswith("0 s left")
    assert [duration(s) for s in (0.4, 59.6, 61, 3725)] == ["0 s", "1 min 0 s", "1 min 1 s", "1 h 2 min"]


def test_the_check_says_its_header_once_its_steps_and_how_long_it_took(monkeypatch):
    monkeypatch.setattr("sys.stdout.isatty", lambda: False)
    said = Said()
    check = Pace(said, "reference", 3, header="  job 1: training the reference")
    check(1)
    check.bar.every = 0.0  # (the line repeats at most every 5 s off a terminal)
    check(2)
    check(3)
    check.end()
    assert said.lines[0] == "  job 1: training the reference" and said.lines.count(said.lines[0]) == 1
    assert said.lines[1].startswith("    reference step 1/3, ") and said.lines[3].startswith("    reference step 3/3, ")
    assert said.lines[-1].startswith("    reference: 3 step(s) in ")


def test_a_check_that_never_starts_says_nothing():
    said = Said()
    Pace(said, "reference", 3, header="  the script's reference")  # (a script that defines none)
    assert said.lines == []


class StubRun:
    """The two phases as seams: each returns or raises what the test gives it."""

    def __init__(self, train=None, report=None):
        self._train, self._report, self.kept = train, report, []

    def train(self):
        if self._train:
            raise self._train
        return "progress", 1.0

    def report(self, progress, wall, setup, model):
        if self._report:
            raise self._report
        return 0

    def keep_partial(self, model, why, checking=False):
        self.kept.append((why, checking))


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), Stopped("stopped by make stop")])
def test_a_stop_during_the_check_keeps_the_run_saying_its_bits_were_not_compared(stop):
    run = StubRun(report=stop)
    with pytest.raises(type(stop)):
        make_run.train_and_report(run, Console(), "mlp", 0.0)
    assert run.kept == [(str(stop) or "interrupted", True)]
    early = StubRun(train=stop)
    with pytest.raises(type(stop)):
        make_run.train_and_report(early, Console(), "mlp", 0.0)
    assert early.kept == [(str(stop) or "interrupted", False)]
    assert make_run.train_and_report(StubRun(), Console(), "mlp", 0.0) == 0


def test_a_run_kept_during_its_check_has_its_figures_and_says_so(tmp_path, capsys):
    run = Run.__new__(Run)  # keep_partial's seams only: no network, switch or agents
    run.console, run.dir, run.agents, run.target = Console(), tmp_path, None, "embedded"
    run.cfg = SimpleNamespace(total_workers=1, jobs=1, loss=0.0, model="mlp")
    run.progress = p = Progress({1: 1}, steps=2)
    for s in (-1, 0, 1):
        p.feed(json.dumps({"ev": "step", "job": 1, "worker": 0, "step": s, "sent": 4 * (s + 1), "retx": 0,
                           "loss": 2.0 - s, "acc": 0.5, "t": 10.0 + s, "cpu": 1.0 + 0.25 * (s + 1) + (s == 1)}))
    run.keep_partial("mlp (1.2k parameters)", "interrupted", checking=True)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["stopped"] == "interrupted" and s["not_compared"] == NOT_COMPARED and s["steps_done"] == 2
    assert s["worker_cpu_seconds_a_step"] == 1.25  # its CPU a step so far, the first step left out
    assert (tmp_path / "curve.svg").exists() and len((tmp_path / "metrics.csv").read_text().splitlines()) == 1 + 2
    assert NOT_COMPARED in capsys.readouterr().out
    run.keep_partial("mlp (1.2k parameters)", "interrupted")  # stopped while training: nothing of the sort
    assert "not_compared" not in json.loads((tmp_path / "summary.json").read_text())
