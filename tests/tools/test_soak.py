"""The soak's verdicts (tools/soak.py), without a network: RSS growth after warm-up and the fault plan."""
import argparse

from tools import soak


def report(peaks: dict[str, list[int]]) -> soak.Report:
    rep = soak.Report()
    for name, values in peaks.items():
        rep.rss.update({(name, w): kb for w, kb in enumerate(values) if kb})
    return rep


def test_growth_is_measured_after_the_warm_up_window():
    rep = report({"node": [50, 100, 104, 103], "leaky": [10, 100, 103, 110], "restarted": [90, 100, 0, 60],
                  "short": [100]})
    got = soak.growth(rep, 4)
    assert got["node"] == 1.04 and got["leaky"] == 1.10 and got["restarted"] == 0.6 and got["short"] == 1.0
    assert [n for n, g in got.items() if g > soak.GROWTH_LIMIT] == ["leaky"]


def test_every_fault_kind_is_planned_inside_the_run(tmp_path):
    args = argparse.Namespace(steps=2000, workers=2, seed=3, faults=2, loss=0.05)
    plan = soak.Soak(args, tmp_path).schedule()
    assert sorted(k for _, k in plan) == sorted(soak.FAULTS * 2)
    assert all(100 <= step <= 1900 for step, _ in plan) and plan == sorted(plan)


def test_digest_tally_counts_every_life_and_a_mismatch_fails(tmp_path):
    (tmp_path / "stats1-0-life0.json").write_text('{"digest_checks": 40, "sent": 9}')
    (tmp_path / "stats1-0-life1.json").write_text('{"digest_checks": 7}')
    (tmp_path / "stats1-1-life0.json").write_text("{")  # cut short: not counted, not a crash
    log = tmp_path / "w.log"
    log.write_text(f"mindp-worker 1/0: step 3: {soak.MISMATCH_LINE} in 2 chunk(s): 4, 5; taken again\n"
                   "mindp-worker 1/0: done\n")
    quiet = tmp_path / "q.log"
    quiet.write_text("mindp-worker 1/1: done\n")
    got = soak.digest_tally(sorted(tmp_path.glob("stats*.json")), [log, quiet, tmp_path / "missing.log"])
    assert (got.checks, got.mismatches) == (47, 1)
