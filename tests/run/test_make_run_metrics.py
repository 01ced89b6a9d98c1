"""make run's metrics.csv end to end: every column there, one row a step, the node's update rate in
each, and the switch's drops and the hosts' rejections counted per step: without loss none (but of
a resent gradient), with it some (resent gradients the switch has counted already are dropped as
duplicates)."""
from __future__ import annotations

import csv
import math

import pytest

from mininet_topos import metrics

from .makerun import MakeRun, assert_clean, needs_root

pytestmark = pytest.mark.net
STEPS = 8


def table(run: MakeRun) -> list[dict[str, str]]:
    with open(run.run_dir / "metrics.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == metrics.COLUMNS
        return list(reader)


@needs_root
@pytest.mark.parametrize("loss", ["0", "0.05"])
def test_metrics_count_drops_per_step_and_the_nodes_update_rate(tmp_path, loss):
    run = MakeRun(tmp_path, "--target", "embedded", "--workers", "2", "--steps", str(STEPS), "--loss", loss,
                  "--p4", "committed")
    assert run.run() == 0, run.err + run.out
    rows = table(run)
    assert [int(r["step"]) for r in rows] == list(range(STEPS))
    assert all(float(r["node_elements_per_s"]) > 0 and float(r["node_commit_seconds"]) > 0 for r in rows)  # every commit line read
    assert all(float(r["compute_seconds"]) > 0 and float(r["wait_seconds"]) > 0 for r in rows)  # every worker's step timed
    assert all(float(r["batch_loss"]) > 0 for r in rows)  # and its loss said
    assert all(float(r["worker_cpu_seconds"]) > 0 for r in rows)  # and its process's CPU
    assert rows[0]["node_cpu_seconds"] == "" and all(float(r["node_cpu_seconds"]) > 0 for r in rows[1:])
    read = [r for r in rows if r["switch_drops"] != ""]
    assert read, "no read of the switch's drops after any step"
    for r in read:  # the total is the sum of the reasons' columns
        assert int(r["switch_drops"]) == sum(int(r[c]) for c in metrics.DROP_COLUMNS)
    drops = sum(int(r["switch_drops"]) for r in read)
    counted = run.summary()["per_job"][0]["switch_counters"]["dropped"]
    assert drops <= counted  # the rows count what was read after each step; a late duplicate comes after
    resent = sum(int(r["retransmissions"]) for r in rows)
    # only a resent gradient is ever dropped (a duplicate, or of a step gone by): no other reason, no loss, no drop
    assert all(int(r[c]) == 0 for r in read for c in metrics.DROP_COLUMNS if c not in ("drop_duplicate", "drop_stale"))
    if loss == "0":
        assert drops <= resent and (resent or drops == counted == 0)
        assert sum(int(r["host_rejected"]) for r in rows) == 0
    else:
        assert drops > 0 and resent > 0
    s = run.summary()
    assert s["mean_compute_seconds"] > 0 and s["mean_wait_seconds"] > 0 and s["compute_share"] > 0
    assert s["worker_cpu_seconds_a_step"] > 0 and s["node_cpu_seconds_a_step"] > 0
    assert s.get("switch_cpu_seconds_a_step", 0) >= 0  # (absent when one read saw every step done)
    assert f"CPU a step: a worker {s['worker_cpu_seconds_a_step'] * 1000:.1f} ms" in run.out
    back = metrics.read_csv(run.run_dir / "metrics.csv")
    assert len(back) == STEPS and not any(math.isnan(r.node_elements_per_s) for r in back)
    assert_clean(run)
