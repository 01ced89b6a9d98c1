"""Per-step metrics (metrics.csv) from the workers', nodes' and switches' records, the chart's legend
out of the lines' way, and `make compare` (tools/compare.py) drawing several runs in one chart."""
import json
import math
import re

import pytest

from controller import p4info_names as n
from controller.stats import job_drops
from mininet_topos import metrics, results, svgplot
from mininet_topos.progress import Progress
from tools import compare


def rec(**kw):
    return json.dumps({"ev": "step", "job": 1, **kw})


DROP_READS = {-1: {}, 0: {"DUPLICATE": 1}, 2: {"DUPLICATE": 3, "STALE": 1}}  # none after step 1


def fed(steps: int = 3, retx_at: int = 1, loss0: float = 2.0) -> Progress:
    """Two workers' step records, the node's commits of steps 0 and 1, the switch's drops read after
    steps -1, 0 and 2 (as the orchestrator reads them: whenever it sees a step finished)."""
    p = Progress({1: 2}, steps)
    for s in range(-1, steps):
        for w in (0, 1):
            sent = 10 * (s + 1)
            retx = 1 if (w == 1 and s >= retx_at) else 0
            extra = dict(loss=loss0 - 0.5 * (s + 1), acc=0.1 * (s + 2)) if w == 0 else {}
            if s >= 0 and not (w == 1 and s == 1):  # (worker 1 says nothing of its step 1)
                extra.update(compute=0.5 + w, wait=0.25 * (s + 1) + w, batch_loss=3.0 - s - w)
            p.feed(rec(worker=w, step=s, t=100.0 + 2 * (s + 1) + w * 0.5, sent=sent, retx=retx, rej=w * (s + 1),
                       **extra))
        if s in (0, 1):
            durable = {"commit_seconds": 0.25} if s == 0 else {}  # (step 1's from a node that does not say)
            p.feed(json.dumps({"ev": "commit", "job": 1, "shard": 0, "step": s, "t": 1.0, "elements": 4096,
                               "seconds": 0.5, "rejected": 2 * (s + 1), **durable}))
        if s in DROP_READS:
            assert p.drops_due()
            p.feed_drops({1: DROP_READS[s]})
            assert not p.drops_due()  # until the job finishes another step
    return p


def test_rows_are_per_step_deltas_of_every_worker():
    table = metrics.rows(fed())
    assert [r.step for r in table] == [0, 1, 2]
    r0, r1, _ = table
    assert (r0.loss, r0.accuracy) == (1.5, pytest.approx(0.2))
    assert r0.step_seconds == 2.0  # the last worker to finish step 0 against the last to be ready
    assert (r0.grad_frames, r0.retransmissions, r1.retransmissions, table[2].retransmissions) == (20, 0, 1, 0)


def test_rows_count_rejections_the_nodes_update_rate_and_the_switch_drops_between_reads():
    r0, r1, r2 = metrics.rows(fed())
    assert [r.host_rejected for r in (r0, r1, r2)] == [1 + 2, 1 + 2, 1]  # worker 1's, and the node's per commit
    assert (r0.node_elements_per_s, r1.node_elements_per_s) == (8192.0, 8192.0) and math.isnan(r2.node_elements_per_s)
    assert r0.node_commit_seconds == 0.25 and math.isnan(r1.node_commit_seconds) and math.isnan(r2.node_commit_seconds)
    assert r0.switch_drops == {"DUPLICATE": 1} and r0.dropped == 1
    assert r1.switch_drops is None and r1.dropped is None  # no read after step 1: counted in step 2's row
    assert r2.switch_drops == {"DUPLICATE": 2, "STALE": 1}


def test_rows_give_the_workers_mean_compute_and_wait_of_those_that_said():
    r0, r1, r2 = metrics.rows(fed())
    assert (r0.compute_seconds, r0.wait_seconds) == (1.0, 0.75)  # (0.5 + 1.5) / 2, (0.25 + 1.25) / 2
    assert (r1.compute_seconds, r1.wait_seconds) == (0.5, 0.5)  # worker 0's alone
    assert (r2.compute_seconds, r2.wait_seconds) == (1.0, 1.25)
    p = Progress({1: 1}, 1)
    for s in (-1, 0):
        p.feed(rec(worker=0, step=s, t=float(s + 2), sent=0, retx=0))  # a worker that never says
    (row,) = metrics.rows(p)
    assert math.isnan(row.compute_seconds) and math.isnan(row.wait_seconds) and math.isnan(row.batch_loss)


def test_rows_give_the_workers_mean_batch_loss_and_the_bar_shows_it_where_the_evaluation_is_older():
    p = fed()  # worker 0 evaluated every step; batch losses 3 - s - w (worker 1's step 1 unsaid)
    assert [r.batch_loss for r in metrics.rows(p)] == [2.5, 2.0, 0.5]
    assert "batches" not in p.bar()  # the evaluation is of the latest step
    q = Progress({1: 2}, 4)
    for s in (-1, 0, 1):
        for w in (0, 1):
            q.feed(rec(worker=w, step=s, t=float(s + 2), sent=0, retx=0,
                       **(dict(loss=2.0, acc=0.5) if w == 0 and s < 0 else {}),
                       **(dict(batch_loss=1.0 + s + w) if s >= 0 else {})))
    assert "loss 2.0000 at step 0, batches 2.5000  acc  50.0%" in q.bar()  # step 1's: (2 + 3) / 2


def test_the_summarys_timing_is_over_the_steps_whose_workers_timed_theirs():
    table = metrics.rows(fed())  # step_seconds 2.0 each; compute 1.0, 0.5, 1.0; wait 0.75, 0.5, 1.25
    assert metrics.timing(table) == {"mean_compute_seconds": round(2.5 / 3, 6), "mean_wait_seconds": round(2.5 / 3, 6),
                                     "compute_share": round(2.5 / 6.0, 4)}
    assert metrics.timing(table[1:2]) == {"mean_compute_seconds": 0.5, "mean_wait_seconds": 0.5, "compute_share": 0.25}
    p = Progress({1: 1}, 1)
    for s in (-1, 0):
        p.feed(rec(worker=0, step=s, t=float(s + 2), sent=0, retx=0))
    assert metrics.timing(metrics.rows(p)) == {} and metrics.timing([]) == {}


def cpu_fed(first: int = 0, steps: int = 4, told: int | None = None) -> Progress:
    """Two workers whose processes spend 0.2 and 0.4 s of CPU a step after a first step of 1 s (its
    warm-up), two shards spending 0.05 each, and switch reads that skip steps, as the run's do.
    told: the first step the Progress is told (a resumed script's is 0: its ranks say where they start)."""
    p = Progress({1: 2}, steps, first if told is None else told)
    for s in range(first - 1, steps):
        after = s - first  # steps after the first this run trained
        for w in (0, 1):
            cpu = 3.0 + w + (0 if after < 0 else 1.0 + after * 0.2 * (w + 1))
            p.feed(rec(worker=w, step=s, t=float(s), sent=0, retx=0, cpu=cpu))
        for shard in (0, 1):
            if s >= first:
                p.feed(json.dumps({"ev": "commit", "job": 1, "shard": shard, "step": s, "t": 1.0, "elements": 8,
                                   "seconds": 0.5, "cpu": 2.0 + shard + 0.05 * after}))
        if s in (first, first + 2, steps - 1):
            assert p.switch_cpu_due()
            p.feed_switch_cpu(10.0 + 0.125 * s)
            assert not p.switch_cpu_due()  # until every worker finishes another step
    return p


def test_cpu_a_step_by_role_leaves_out_the_first_step_and_what_was_not_said():
    for first, told in ((0, 0), (5, 5), (5, 0)):  # a fresh run, one resumed at step 5, a resumed script
        p = cpu_fed(first, first + 4, told)
        assert metrics.cpu(p) == {"worker_cpu_seconds_a_step": 0.3, "node_cpu_seconds_a_step": 0.1,
                                  "switch_cpu_seconds_a_step": 0.125}
        rows = metrics.rows(p)
        assert [round(r.worker_cpu_seconds, 6) for r in rows] == [1.0, 0.3, 0.3, 0.3]  # the first: its warm-up
        assert math.isnan(rows[0].node_cpu_seconds) and [round(r.node_cpu_seconds, 6) for r in rows[1:]] == [0.1] * 3
    quiet = Progress({1: 1}, 3)
    for s in range(-1, 3):
        quiet.feed(rec(worker=0, step=s, t=float(s), sent=0, retx=0))  # an older worker: no cpu said
    assert metrics.cpu(quiet) == {} and math.isnan(metrics.rows(quiet)[1].worker_cpu_seconds)
    one = cpu_fed(0, 1)  # a single step: nothing after the first
    assert metrics.cpu(one) == {}
    line = results.cpu_line({**metrics.cpu(cpu_fed()), "steps": 4})
    assert line == "  CPU a step: a worker 300.0 ms, the node(s) 100.0 ms, the switch(es) 125.0 ms"
    assert results.cpu_line({"steps": 4}) == ""
    labels = [panel.ylabel for panel in compare.panels([("run", metrics.rows(cpu_fed()))])]
    assert labels[-2:] == ["a worker's CPU a step (ms)", "the node's CPU a step (ms)"]  # make compare draws them


def test_two_shards_rates_add_up_and_a_read_of_a_job_is_kept_at_its_own_step():
    p = Progress({1: 1, 2: 1}, 1)
    for s in (-1, 0):
        for j in (1, 2):
            p.feed(rec(job=j, worker=0, step=s, t=float(s + 2), sent=0, retx=0))
    for shard, secs in ((0, 0.25), (1, 0.5)):
        p.feed(json.dumps({"ev": "commit", "job": 1, "shard": shard, "step": 0, "t": 1.0, "elements": 1000,
                           "seconds": secs, "commit_seconds": 2 * secs}))
    p.feed_drops({1: {}, 2: {}, 3: {"STALE": 9}})  # a job the run does not know is left out
    assert p.drops == {(1, 0): {}, (2, 0): {}}
    assert metrics.rows(p)[0].node_elements_per_s == 1000 / 0.25 + 1000 / 0.5
    assert metrics.rows(p)[0].node_commit_seconds == 1.0  # the step waited for the slower shard's disk


def test_a_jobs_drops_are_summed_over_its_switches_and_reasons_named():
    leaf = {n.drop_cell(1, n.DropReason.DUPLICATE): (2, 0), n.drop_cell(2, n.DropReason.STALE): (7, 0)}
    spine = {n.drop_cell(1, n.DropReason.DUPLICATE): (1, 0), n.drop_cell(1, n.DropReason.FUTURE_STEP): (4, 0)}
    assert job_drops([leaf, spine], [1, 2]) == {1: {"DUPLICATE": 3, "FUTURE_STEP": 4}, 2: {"STALE": 7}}


def test_a_script_log_record_gives_the_loss_without_accuracy_and_a_step_is_kept_once():
    p = Progress({1: 1}, 0)
    p.feed(rec(worker=0, step=-1, t=1.0, sent=0, retx=0))
    p.feed(rec(worker=0, step=0, t=2.0, sent=5, retx=0))
    p.feed(json.dumps({"ev": "log", "job": 1, "worker": 0, "step": 0, "loss": 0.75}))
    p.feed(json.dumps({"ev": "log", "job": 1, "worker": 0, "step": 0, "loss": 0.5}))  # the same step again
    (row,) = metrics.rows(p)
    assert row.loss == 0.5 and math.isnan(row.accuracy)
    assert "steps done 1  loss 0.5000  acc -" in p.bar()


def test_csv_round_trip_and_a_foreign_file_is_one_line(tmp_path):
    table = metrics.rows(fed())
    metrics.write_csv(tmp_path / "metrics.csv", table)
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert lines[0] == ",".join(metrics.COLUMNS)
    assert "drop_duplicate" in metrics.COLUMNS and len(metrics.DROP_COLUMNS) == len(n.DropReason)
    cells = dict(zip(metrics.COLUMNS, lines[2].split(",")))  # step 1: no read, so its drop cells are empty
    assert cells["switch_drops"] == cells["drop_duplicate"] == "" and cells["node_elements_per_s"] == "8192"
    back = metrics.read_csv(tmp_path / "metrics.csv")
    assert back[0].node_commit_seconds == 0.25 and math.isnan(back[1].node_commit_seconds)
    assert [(r.compute_seconds, r.wait_seconds, r.batch_loss) for r in back] \
        == [(r.compute_seconds, r.wait_seconds, r.batch_loss) for r in table]
    cpu = metrics.rows(cpu_fed())
    metrics.write_csv(tmp_path / "cpu.csv", cpu)
    assert [(round(r.worker_cpu_seconds, 6), r.node_cpu_seconds) for r in metrics.read_csv(tmp_path / "cpu.csv")[1:]] \
        == [(round(r.worker_cpu_seconds, 6), pytest.approx(r.node_cpu_seconds, abs=1e-6)) for r in cpu[1:]]
    assert [(r.step, r.loss, r.grad_frames, r.host_rejected, r.switch_drops) for r in back] \
        == [(r.step, r.loss, r.grad_frames, r.host_rejected, r.switch_drops) for r in table]
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a mindp metrics.csv"):
        metrics.read_csv(tmp_path / "x.csv")
    (tmp_path / "bad.csv").write_text(",".join(metrics.COLUMNS[:7]) + "\n1,x,1,1,1,1,1\n")
    with pytest.raises(ValueError, match="^" + str(tmp_path / "bad.csv")):
        metrics.read_csv(tmp_path / "bad.csv")


def test_an_older_runs_metrics_without_the_new_columns_still_reads(tmp_path):
    (tmp_path / "old.csv").write_text(",".join(metrics.COLUMNS[:7]) + "\n1,0,2.5,0.5,0.1,151,0\n")
    (r,) = metrics.read_csv(tmp_path / "old.csv")
    assert (r.loss, r.grad_frames, r.host_rejected, r.switch_drops) == (2.5, 151, 0, None)
    assert math.isnan(r.node_elements_per_s) and math.isnan(r.node_commit_seconds)
    assert math.isnan(r.compute_seconds) and math.isnan(r.wait_seconds) and math.isnan(r.batch_loss)
    assert math.isnan(r.worker_cpu_seconds) and math.isnan(r.node_cpu_seconds)
    assert [p.ylabel for p in compare.panels([("old", [r])])] == ["training loss", "test accuracy (%)", "step time (s)",
                                                                  "retransmissions per step"]  # no wait panel


def test_tensorboard_files_only_where_it_is_installed(tmp_path):
    wrote = metrics.write_tensorboard(tmp_path / "tb", metrics.rows(fed()))
    try:
        import tensorboard  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        assert wrote is False and not (tmp_path / "tb").exists()
    else:
        assert wrote is True and any((tmp_path / "tb" / "job1").iterdir())


def polyline_points(svg: str) -> list[tuple[float, float]]:
    pts = []
    for m in re.finditer(r'<polyline class="series" points="([^"]*)"', svg):
        pts += [tuple(map(float, p.split(","))) for p in m.group(1).split()]
    return pts


def test_the_legend_is_below_the_panels_never_over_a_line():
    svg = svgplot.chart([svgplot.Panel("step", "acc", {f"run {i}": ([0, 10], [0.0, 100.0]) for i in range(5)},
                                       yhi=100.0)], "t")
    lowest_line = max(y for _, y in polyline_points(svg))
    legend_ys = [float(m.group(1)) for m in re.finditer(r'<line class="legend" x1="[^"]*" y1="([^"]*)"', svg)]
    assert len(legend_ys) == 5 and min(legend_ys) > lowest_line + svgplot.MARGIN_B - 10
    height = float(re.search(r'<svg [^>]*height="(\d+)"', svg).group(1))
    assert max(legend_ys) < height


def write_run(root, name: str, loss0: float, model: str = "mlp (4,810 parameters)"):
    d = root / name
    d.mkdir(parents=True)
    metrics.write(d, fed(loss0=loss0))
    results.write_summary(d / "summary.json", {"model": model, "target": "embedded", "workers": 2, "loss_rate": 0.02})
    return d


def test_an_all_zero_series_gets_a_readable_axis():
    svg = svgplot.chart([svgplot.Panel("step", "retransmissions", {"run": ([0, 1, 2], [0.0, 0.0, 0.0])})], "t")
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    assert "1" in texts and not any("e-" in t for t in texts)  # was 0 .. 1e-09


def test_compare_draws_every_run_with_a_legend_naming_it(tmp_path, capsys):
    write_run(tmp_path, "20261128-010101", 2.0)
    write_run(tmp_path, "20261128-020202", 3.0, "gpt (1.3M parameters)")
    assert compare.main(["20261128-010101", str(tmp_path / "20261128-020202"), "--runs-dir", str(tmp_path)]) == 0
    svg = (tmp_path / "compare.svg").read_text()
    assert "20261128-010101: mlp (4,810 parameters), embedded, 2 workers, loss 0.02" in svg
    assert "20261128-020202: gpt (1.3M parameters)" in svg
    assert svg.count('<polyline class="series"') == 2 * 6  # loss, batch loss, accuracy, step time, wait, retx
    assert "waiting for the parameters (s)" in svg and "loss on the workers&#x27; batches" in svg
    out = capsys.readouterr().out
    assert str(tmp_path / "compare.svg") in out and ("compare.png" in out or "matplotlib is not installed" in out)


def test_compare_refuses_in_one_line(tmp_path, capsys):
    assert compare.main(["nosuch", "--runs-dir", str(tmp_path)]) == 2
    (tmp_path / "old").mkdir()
    assert compare.main(["old", "--runs-dir", str(tmp_path)]) == 2
    assert compare.main([]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"make compare: nosuch: no such run (a directory, or a name under {tmp_path}/)"
    assert "no metrics.csv" in err[1] and "name the runs" in err[2]


def test_tensorboard_scalars_go_through_its_own_writer(tmp_path, monkeypatch):
    """With a stand-in for torch.utils.tensorboard: one writer per job, each figure per step, closed."""
    import sys
    import types

    made = []

    class Writer:
        def __init__(self, logdir):
            self.logdir, self.scalars, self.closed = logdir, [], False
            made.append(self)

        def add_scalar(self, name, value, step):
            self.scalars.append((name, value, step))

        def close(self):
            self.closed = True

    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = Writer
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    assert metrics.write_tensorboard(tmp_path / "tb", metrics.rows(fed())) is True
    (w,) = made
    assert w.logdir == str(tmp_path / "tb" / "job1") and w.closed
    assert ("loss", 1.5, 0) in w.scalars and ("retransmissions", 1, 1) in w.scalars
    assert ("node_elements_per_s", 4096 / 0.5, 0) in w.scalars and ("dropped", 3, 2) in w.scalars
    assert ("node_commit_seconds", 0.25, 0) in w.scalars and ("wait_seconds", 0.5, 1) in w.scalars
    # no rate where the node reported none (step 2), no commit time where it did not say (steps 1, 2),
    # the workers' compute, wait and batch loss at every step, drops where read (steps 0, 2)
    assert ("batch_loss", 2.0, 1) in w.scalars
    assert len(w.scalars) == 3 * 6 + 2 + 1 + 3 * 3 + 2
