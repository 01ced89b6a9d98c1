"""The end of a SCRIPT= run without Mininet: ScriptRun.report on a finished run's files. A failing
mindp_reference is the script's one line and its summary.json is kept, saying why the bits were not
compared; the summary states the packet loss and seed as a MODEL= run's does (make compare's legend)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("torch")

from mininet_topos import results  # noqa: E402
from mininet_topos.console import Console  # noqa: E402
from mininet_topos.progress import Progress  # noqa: E402
from mininet_topos.script_run import ScriptRun  # noqa: E402
from tools import compare  # noqa: E402

BROKEN_REFERENCE = '''
import torch

def mindp_reference(argv):
    return dict(model=lambda: torch.nn.Linear(2, 1), batch=lambda rank, step: (torch.ones(1, 2), torch.ones(1, 1)),
                loss=lambda m, x, y: ((m(x) - y) ** 2).mean(), steps=2,
                optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=0.1))  # not (opt, None)
'''


def finished_run(tmp_path, script: str, check: bool = True, loss: float = 0.0, seed: int = 0) -> ScriptRun:
    """A ScriptRun after training 2 steps on 2 ranks: the node's export and stats, the ranks' figures."""
    (tmp_path / "train.py").write_text(script)
    run = ScriptRun.__new__(ScriptRun)  # report's seams only: no network, switch or agents
    run.console, run.dir, run.logs, run.target, run.resume_step = Console(), tmp_path, tmp_path / "logs", "embedded", 0
    run.cfg = SimpleNamespace(script=str(tmp_path / "train.py"), script_args="", check=check, loss=loss, seed=seed,
                              jobs=1, total_workers=2, model="mlp")
    run.logs.mkdir()
    run.spec_dir = tmp_path / "job1" / "spec"
    run.spec_dir.mkdir(parents=True)
    (run.spec_dir / "optimizer.json").write_text(json.dumps({"schedule": {"kind": "none"}}))
    (tmp_path / "config.json").write_text(json.dumps({"script_args": ""}))
    np.savez(tmp_path / "job1" / "master.npz", weight=np.zeros((1, 2), np.float32), bias=np.zeros(1, np.float32))
    (tmp_path / "job1" / "stats.json").write_text(json.dumps({"committed": 1}))
    run.files = SimpleNamespace(master_path=tmp_path / "job1" / "master.npz", opt_stats_path=tmp_path / "job1" / "stats.json")
    run.topo = SimpleNamespace(jobs=[SimpleNamespace(n_workers=2)])
    run.progress = Progress({1: 2}, 0)
    for s in (0, 1):
        for w in (0, 1):
            run.progress.feed(json.dumps({"ev": "step", "job": 1, "worker": w, "step": s, "sent": 4, "retx": 0,
                                          "loss": 2.0 - s, "t": 10.0 + s}))
    return run


def test_a_failing_mindp_reference_is_the_scripts_one_line_and_the_summary_is_kept(tmp_path, capsys):
    run = finished_run(tmp_path, BROKEN_REFERENCE)
    assert run.report(run.progress, 2.0, 1.0, "train.py") == 1
    out, err = capsys.readouterr()
    why = "the script's mindp_reference failed (TypeError: cannot unpack non-iterable SGD object)"
    assert err.strip() == f"make run: the check could not run: {why}; traceback in {tmp_path}/logs/reference.log"
    assert "Traceback" not in out + err
    assert 'opt, sched = parts["optimizer"](net)' in (tmp_path / "logs" / "reference.log").read_text()
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["not_compared"] == why and s["max_abs_param_diff_vs_reference"] is None and s["steps"] == 2
    assert (tmp_path / "curve.svg").exists() and (tmp_path / "metrics.csv").exists()


def test_a_script_runs_summary_states_its_packet_loss_and_seed_as_a_model_runs_does(tmp_path, capsys):
    run = finished_run(tmp_path, "", check=False, loss=0.05, seed=7)
    assert run.report(run.progress, 2.0, 1.0, "train.py") == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert (s["loss_rate"], s["seed"], s["not_compared"]) == (0.05, 7, results.NOT_CHECKED)
    assert results.faults(0.05, 7).keys() <= s.keys()  # the fields of results.summary (MODEL= runs)
    assert compare.label(tmp_path).endswith("2 workers, loss 0.05")
