"""Progress from workers' JSON lines: steps done by all, curves, rates, partial lines."""
import json

import pytest

from mininet_topos import progress
from mininet_topos.progress import LogTail, Progress


def line(**kw):
    return json.dumps({"ev": "step", **kw})


def test_step_is_the_slowest_worker_and_curves_come_from_evaluating_workers():
    p = Progress({1: 2, 2: 1}, steps=10)
    assert p.step == 0
    p.feed(line(job=1, worker=0, step=-1, sent=0, retx=0, loss=2.5, acc=0.1))
    p.feed(line(job=1, worker=0, step=0, sent=10, retx=1, loss=2.0, acc=0.3))
    p.feed(line(job=1, worker=1, step=0, sent=10, retx=0))
    p.feed(line(job=1, worker=0, step=1, sent=20, retx=2, loss=1.5, acc=0.5))
    assert p.step == 0  # job 2's worker has done nothing yet
    p.feed(line(job=2, worker=0, step=1, sent=20, retx=0, loss=1.0, acc=0.7))
    assert p.step == 1
    assert p.curves[1].steps == [-1, 0, 1] and p.curves[1].loss == [2.5, 2.0, 1.5]
    assert p.latest() == (1.25, 0.6)
    assert p.packets == 20 + 2 + 10 + 20 and p.retransmissions == 2
    assert not p.all_done()
    for j, w in ((1, 0), (1, 1), (2, 0)):
        p.feed(json.dumps({"ev": "done", "job": j, "worker": w, "stats": {"sent": 30, "retransmitted": 3}}))
    assert p.all_done() and p.retransmissions == 9


def test_rates_use_the_workers_clock_and_bar():
    p = Progress({1: 1}, steps=4)
    assert p.rates() is None  # before any record: no sample at clock 0
    p.feed(line(job=1, worker=0, step=-1, sent=0, retx=0, t=100.0))
    assert p.rates() is None and "- steps/s  - grad pkt/s" in p.bar()
    p.feed(line(job=1, worker=0, step=1, sent=500, retx=0, loss=1.0, acc=0.5, t=102.0))
    steps_s, pkts_s = p.rates()
    assert steps_s == 1.0 and pkts_s == 250.0
    bar = p.bar(width=8)
    assert "[####....]" in bar and "step 2/4" in bar and "acc  50.0%" in bar and "grad retx 0" in bar
    assert "1 steps/s  250 grad pkt/s" in bar


def test_a_slow_rate_keeps_its_digits():
    """BMv2 trains a gpt at a few hundredths of a step a second: not '0.0 steps/s'."""
    p = Progress({1: 1}, steps=4)
    p.feed(line(job=1, worker=0, step=-1, sent=0, retx=0, t=100.0))
    p.bar()  # (refreshed as the records come)
    p.feed(line(job=1, worker=0, step=0, sent=500, retx=0, t=129.0))
    assert "0.0345 steps/s" in p.bar()
    assert [progress.three_digits(r) for r in (0.0345, 3.4567, 34.567, 345.67)] == ["0.0345", "3.46", "34.6", "345.7"]


def test_noise_and_unknown_workers_are_counted_not_fatal():
    p = Progress({1: 1}, steps=1)
    p.feed("mindp-worker: a message")
    p.feed("{not json")
    p.feed(line(job=9, worker=0, step=0))
    assert p.bad_lines == 2 and p.step == 0


def test_log_tail_returns_whole_lines_only(tmp_path):
    f = tmp_path / "w.log"
    tail = LogTail(f)
    assert tail.lines() == []
    f.write_text("one\ntw")
    assert tail.lines() == ["one"]
    with open(f, "a") as h:
        h.write("o\nthree\n")
    assert tail.lines() == ["two", "three"]


def test_training_time_runs_from_the_last_worker_ready_to_the_last_done():
    p = Progress({1: 2}, steps=1)
    p.feed(line(job=1, worker=0, step=-1, t=10.0))
    p.feed(line(job=1, worker=1, step=-1, t=12.0))
    p.feed(json.dumps({"ev": "done", "job": 1, "worker": 0, "t": 15.0, "stats": {}}))
    assert p.training_seconds() is None
    p.feed(json.dumps({"ev": "done", "job": 1, "worker": 1, "t": 14.5, "stats": {}}))
    assert p.training_seconds() == 3.0


def test_span_runs_from_the_last_worker_ready_to_the_latest_record():
    p = Progress({1: 2}, steps=0)
    p.feed(line(job=1, worker=0, step=-1, sent=0, retx=0, t=10.0))
    assert p.span() is None  # worker 1 not ready yet
    p.feed(line(job=1, worker=1, step=-1, sent=0, retx=0, t=12.0))
    p.feed(line(job=1, worker=0, step=0, sent=5, retx=0, t=15.5))
    assert p.span() == 3.5


def test_a_resumed_run_counts_from_the_steps_its_earlier_run_did():
    p = Progress({1: 2}, steps=8, first=5)
    assert p.step == 5 and "step 5/8" in p.bar(width=8)  # was 0/8 until the first step ended
    p.feed(line(job=1, worker=0, step=5, sent=10, retx=0))
    assert p.step == 5
    p.feed(line(job=1, worker=1, step=5, sent=10, retx=0))
    assert p.step == 6 and "step 6/8" in p.bar(width=8)


def test_the_rate_after_training_counts_the_steps_this_run_did():
    """A script's step count is not known ahead (steps=0), and a resumed run began at `first`: the
    final rate is the steps done here over the training time, not 0 steps/s. A resumed script's
    Progress is told no first step: its ranks' ready records say it."""
    for first, steps, told in ((0, 0, 0), (6, 10, 6), (6, 0, 0)):  # the last: a resumed script's (first 0)
        p = Progress({1: 1}, steps=steps, first=told)
        p.feed(line(job=1, worker=0, step=first - 1, sent=0, retx=0, t=100.0))
        for s in range(first, first + 4):
            p.feed(line(job=1, worker=0, step=s, sent=s, retx=0, t=100.0 + 0.02 * (s - first + 1)))
        p.feed(json.dumps({"ev": "done", "job": 1, "worker": 0, "t": 100.08, "stats": {"sent": 4, "retransmitted": 0}}))
        assert p.training_seconds() == pytest.approx(0.08) and "  50 steps/s" in p.bar(), p.bar()


class Said:
    def __init__(self):
        self.lines = []

    def say(self, msg=""):
        self.lines.append(msg)


@pytest.mark.parametrize("indent", ["", "  "])
def test_the_progress_line_off_a_terminal_prints_when_the_step_moves_and_ends_once(indent):
    """One rule for make run's built-in loop and SCRIPT= loop (they had two): a line when the step
    moved on (at most every `every` s), the last text at the end unless it was the last shown."""
    from mininet_topos.console import ProgressLine

    said = Said()
    line = ProgressLine(said, indent=indent, every=0.0, tty=False)
    line.show(0, "steps done 0")
    line.show(0, "steps done 0  1.0 steps/s")  # the same step: not again
    line.show(1, "steps done 1  loss 2.3")
    line.end("steps done 1  loss 2.3")  # shown already
    assert said.lines == [indent + "steps done 0", indent + "steps done 1  loss 2.3"]
    line.end("steps done 1  loss 2.2")  # the log's last lines brought a later loss
    assert said.lines[-1] == indent + "steps done 1  loss 2.2"
    slow = ProgressLine(said, every=1e9, tty=False)
    slow.show(0, "a")
    slow.show(1, "b")  # within `every` of the last
    slow.end("b")
    assert said.lines[-2:] == ["a", "b"]


def test_a_loss_evaluated_steps_ago_says_at_which_step():
    """EVAL=0 evaluates only the first and the last model: the bar's loss is the initial one until
    the end, and says so instead of looking like training that does not learn."""
    p = Progress({1: 1}, steps=10)
    p.feed(line(job=1, worker=0, step=-1, sent=0, retx=0, loss=2.5, acc=0.1))
    assert "loss 2.5000  acc" in p.bar()
    p.feed(line(job=1, worker=0, step=3, sent=40, retx=0))
    assert "loss 2.5000 at step 0  acc" in p.bar()
    p.feed(line(job=1, worker=0, step=4, sent=50, retx=0, loss=1.5, acc=0.5))
    assert "loss 1.5000  acc" in p.bar()
    p.feed(line(job=1, worker=0, step=9, sent=100, retx=0))
    assert "step 10/10  loss 1.5000 at step 5  acc" in p.bar()
