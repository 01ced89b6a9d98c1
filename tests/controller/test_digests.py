"""mindp-ctl stats --run DIR: the workers' step-digest counters of a make run, from its workers'
logs (done records; a running worker's mismatch lines), beside the switch's counters."""
from __future__ import annotations

import json

from controller import digests
from controller.stats import snapshot

from .ctl import Ctl

MISMATCH = ("mindp-worker 1/2: step 3: parameters differ from the optimizer node's digest in 2 chunk(s): 4, 5; "
            "taken again from the node")


def done(checks: int, mismatches: int = 0) -> str:
    return json.dumps({"ev": "done", "job": 1, "worker": 0, "t": 1.0,
                       "stats": {"sent": 9, "digest_checks": checks, "digest_mismatches": mismatches}})


def run_dir(tmp_path):
    """Job 1: two workers done (4 checks each, one mismatch), one still running that printed a
    mismatch line; job 2: one worker without any record yet."""
    logs = tmp_path / "run" / "logs"
    logs.mkdir(parents=True)
    step = json.dumps({"ev": "step", "job": 1, "worker": 0, "step": 3})
    (logs / "worker-job1-0.log").write_text(f"{step}\n{MISMATCH}\n{done(4, 1)}\n")
    (logs / "worker-job1-1.log").write_text(f"{step}\nnot json {{\n{done(4)}\n")
    (logs / "worker-job1-2.log").write_text(f"{step}\n{MISMATCH}\n")
    (logs / "worker-job2-0.log").write_text("")
    (logs / "optimizer-job1.log").write_text(MISMATCH + "\n")  # not a worker's
    return tmp_path / "run"


def test_counts_from_done_records_and_running_workers_mismatch_lines(tmp_path):
    got = digests.read_run(run_dir(tmp_path), [1, 2, 3])
    assert got[1] == digests.DigestCounts(checks=8, mismatches=2, workers_done=2, workers=3)
    assert got[2] == digests.DigestCounts(workers=1) and got[3] == digests.DigestCounts()


def test_snapshot_carries_them_in_json_and_text(tmp_path):
    snap = digests.attach(snapshot({}, 1.0, [1]), str(run_dir(tmp_path)))
    d = snap.to_dict()
    assert d["digests"] == {"1": {"checks": 8, "mismatches": 2, "workers_done": 2, "workers": 3}}
    assert d["run"] == str(tmp_path / "run")
    assert digests.text(snap).endswith("job 1: 8 checked, 2 mismatched (2 of 3 workers done)")
    plain = snapshot({}, 1.0, [1])
    assert "digests" not in digests.attach(plain, None).to_dict() and digests.text(plain) == ""


def test_mindp_ctl_stats_run(switch, topo, tmp_path):
    path = tmp_path / "topo.json"
    topo.dump(path)
    cli = Ctl(switch.addr, path)
    cli.run("push")
    cli.run("jobs", "create", "--job-id", "1")
    run = run_dir(tmp_path)
    assert "job 1: 8 checked, 2 mismatched (2 of 3 workers done)" in cli.run("stats", "--run", str(run)).stdout
    assert cli.json("stats", "--run", str(run))["digests"]["1"]["mismatches"] == 2
    assert "digests" not in cli.json("stats")
    cli.fails("stats", "--run", str(tmp_path), match="not a make run directory (no logs/ in it)")


def test_a_script_runs_ranks_count_by_their_exit_records(tmp_path):
    """SCRIPT= runs: torchrun's ranks write logs/ranks/rank<r>.jsonl; a rank that exited wrote its
    done record; one still running (no done record) has no checks known yet."""
    run = run_dir(tmp_path)
    ranks = run / "logs" / "ranks"
    ranks.mkdir()
    step = json.dumps({"ev": "step", "job": 2, "worker": 0, "step": 4})
    (ranks / "rank0.jsonl").write_text(f"{step}\n" + done(5, 1).replace('"job": 1', '"job": 2') + "\n")
    (ranks / "rank1.jsonl").write_text(f"{step}\n")
    got = digests.read_run(run, [1, 2])
    assert got[2] == digests.DigestCounts(checks=5, mismatches=1, workers_done=1, workers=3)
    assert got[1] == digests.DigestCounts(checks=8, mismatches=2, workers_done=2, workers=3)
