"""Per-step metrics (metrics.csv) from the workers' records, the chart's legend out of the lines'
way, and `make compare` (tools/compare.py) drawing several runs in one chart."""
import json
import math
import re

import pytest

from mininet_topos import metrics, results, svgplot
from mininet_topos.progress import Progress
from tools import compare


def rec(**kw):
    return json.dumps({"ev": "step", "job": 1, **kw})


def fed(steps: int = 3, retx_at: int = 1, loss0: float = 2.0) -> Progress:
    p = Progress({1: 2}, steps)
    for s in range(-1, steps):
        for w in (0, 1):
            sent = 10 * (s + 1)
            retx = 1 if (w == 1 and s >= retx_at) else 0
            extra = dict(loss=loss0 - 0.5 * (s + 1), acc=0.1 * (s + 2)) if w == 0 else {}
            p.feed(rec(worker=w, step=s, t=100.0 + 2 * (s + 1) + w * 0.5, sent=sent, retx=retx, **extra))
    return p


def test_rows_are_per_step_deltas_of_every_worker():
    table = metrics.rows(fed())
    assert [r.step for r in table] == [0, 1, 2]
    r0, r1, _ = table
    assert (r0.loss, r0.accuracy) == (1.5, pytest.approx(0.2))
    assert r0.step_seconds == 2.0  # the last worker to finish step 0 against the last to be ready
    assert (r0.grad_frames, r0.retransmissions, r1.retransmissions, table[2].retransmissions) == (20, 0, 1, 0)


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
    assert (tmp_path / "metrics.csv").read_text().splitlines()[0] == ",".join(metrics.COLUMNS)
    back = metrics.read_csv(tmp_path / "metrics.csv")
    assert [(r.step, r.loss, r.grad_frames) for r in back] == [(r.step, r.loss, r.grad_frames) for r in table]
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a mindp metrics.csv"):
        metrics.read_csv(tmp_path / "x.csv")


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


def test_compare_draws_every_run_with_a_legend_naming_it(tmp_path, capsys):
    write_run(tmp_path, "20261128-010101", 2.0)
    write_run(tmp_path, "20261128-020202", 3.0, "gpt (1.3M parameters)")
    assert compare.main(["20261128-010101", str(tmp_path / "20261128-020202"), "--runs-dir", str(tmp_path)]) == 0
    svg = (tmp_path / "compare.svg").read_text()
    assert "20261128-010101: mlp (4,810 parameters), embedded, 2 workers, loss 0.02" in svg
    assert "20261128-020202: gpt (1.3M parameters)" in svg
    assert svg.count('<polyline class="series"') == 2 * 4  # loss, accuracy, step time, retransmissions
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
    assert len(w.scalars) == 3 * 5
