"""make compare's refusals (tools/compare.py): each a one-line error, exit 2, nothing drawn."""
from __future__ import annotations

import json
import os

import pytest

from mininet_topos import metrics
from tools import compare


def write_run(root, name: str, loss_rate=0.02):
    """A run as an older mindp wrote it: metrics.csv's first columns and a summary."""
    d = root / name
    d.mkdir(parents=True)
    (d / "metrics.csv").write_text(",".join(metrics.COLUMNS[:7]) + "\n1,0,2.5,0.5,0.1,151,0\n")
    (d / "summary.json").write_text(json.dumps({"model": "mlp", "target": "embedded", "workers": 2,
                                                "loss_rate": loss_rate}))
    return d


def refused(argv, capsys) -> str:
    assert compare.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.rstrip("\n")


def test_a_run_given_twice_is_refused(tmp_path, capsys):
    """It drew one line per panel and said '2 runs compared'."""
    d = write_run(tmp_path, "20261128-010101")
    os.symlink(d.name, tmp_path / "latest")
    write_run(tmp_path, "20261128-020202")
    runs = ["--runs-dir", str(tmp_path)]
    assert refused(["20261128-010101", "20261128-020202", "20261128-010101", *runs], capsys) == \
        "make compare: run 20261128-010101 given twice"
    assert refused(["latest", str(d), *runs], capsys) == \
        f"make compare: run 20261128-010101 given twice (as latest and {d})"
    assert not (tmp_path / "compare.svg").exists()


@pytest.mark.parametrize("summary, why", [
    ({"model": "mlp", "loss_rate": "0.05"}, "loss_rate '0.05' is not a number"),
    ({"model": "mlp", "loss_rate": True}, "loss_rate True is not a number"),
    (["mlp"], "not a JSON object"),
])
def test_a_summary_that_is_not_what_a_run_writes_is_refused(tmp_path, capsys, summary, why):
    d = write_run(tmp_path, "r")
    (d / "summary.json").write_text(json.dumps(summary))
    assert refused([str(d), "--out", str(tmp_path / "c")], capsys) == f"make compare: {d / 'summary.json'}: {why}"


def test_an_out_that_cannot_be_written_is_refused(tmp_path, capsys):
    d = write_run(tmp_path, "r", loss_rate=None)  # no loss given: still drawn
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "x"
    assert refused([str(d), "--out", str(out)], capsys) == \
        f"make compare: cannot write {out}: {tmp_path / 'file'}: not a directory"
    (tmp_path / "c.svg").mkdir()  # where the chart goes: a directory
    assert refused([str(d), "--out", str(tmp_path / "c")], capsys) == \
        f"make compare: cannot write {tmp_path / 'c'}: {tmp_path / 'c.svg'}: Is a directory"
