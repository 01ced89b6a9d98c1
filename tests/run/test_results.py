"""Comparison with the reference, summary.json fields, table and curve."""
import dataclasses
import json
import math
import xml.etree.ElementTree as ET

import numpy as np

from mininet_topos import results, svgplot
from mininet_topos.progress import Curve


def test_max_abs_diff():
    a = {"w": np.array([1.0, 2.0], dtype=np.float16), "b": np.zeros(3, dtype=np.float32)}
    assert results.max_abs_diff(a, {k: v.copy() for k, v in a.items()}) == 0.0
    b = {"w": np.array([1.0, 2.5], dtype=np.float16), "b": np.zeros(3, dtype=np.float32)}
    assert results.max_abs_diff(a, b) == 0.5
    assert math.isinf(results.max_abs_diff(a, {"w": a["w"]}))
    assert math.isinf(results.max_abs_diff(a, {"w": np.array([np.nan, 2.0]), "b": a["b"]}))


def job(j, diff=0.0, loss=(2.0, 0.5)):
    return results.JobResult(job_id=j, initial_loss=loss[0], final_loss=loss[1], final_accuracy=0.9,
                             reference_final_loss=loss[1], max_abs_param_diff_vs_reference=diff,
                             packets_sent=100, retransmissions=3)


def test_summary_has_the_required_fields_and_aggregates_jobs(tmp_path):
    cfg = {"target": "embedded", "workers": 2, "steps": 10, "loss": 0.0, "seed": 0}
    s = results.summary(cfg, [job(1), job(2, diff=0.25, loss=(3.0, 1.0))], wall_seconds=4.0, setup_seconds=1.0,
                        model="cnn (3.8k parameters)", parameters=3818)
    for k in results.TABLE_FIELDS:
        assert k in s
    assert (s["model"], s["parameters"]) == ("cnn (3.8k parameters)", 3818)
    assert s["jobs"] == 2 and s["initial_loss"] == 2.5 and s["final_loss"] == 0.75
    assert s["max_abs_param_diff_vs_reference"] == 0.25
    assert s["packets_sent"] == 200 and s["retransmissions"] == 6 and s["steps_per_second"] == 2.5
    results.write_summary(tmp_path / "s.json", s)
    assert json.loads((tmp_path / "s.json").read_text())["per_job"][1]["job_id"] == 2
    t = results.table(s)
    assert all(k in t for k in results.TABLE_FIELDS) and "0.25" in t and "cnn (3.8k parameters)" in t
    assert "compute_share" not in t  # no worker timed its steps
    assert t.splitlines()[-1].split() == ["steps_per_second", "2.5"]
    assert results.table({**s, "compute_share": 0.9219}).splitlines()[-1].split() == ["compute_share", "0.9219"]


def test_a_run_not_compared_says_so_instead_of_a_difference():
    """CHECK=0: no reference trained, so no difference is claimed (none a 0.0 that reads as bit-exact)."""
    cfg = {"target": "embedded", "workers": 2, "steps": 10, "loss": 0.0, "seed": 0}
    s = results.summary(cfg, [job(1), job(2, diff=None)], wall_seconds=4.0, setup_seconds=1.0, model="mlp", parameters=1)
    assert "max_abs_param_diff_vs_reference" not in s and s["not_compared"] == results.NOT_CHECKED
    t = results.table(s)
    assert "max_abs_param_diff_vs_reference" not in t and t.splitlines()[-1].split() == ["steps_per_second", "2.5"]


def series(path) -> list[list[tuple[float, float]]]:
    """The SVG's data lines, each as its (x, y) points on the page."""
    root = ET.parse(path).getroot()
    lines = [e for e in root.iter("{http://www.w3.org/2000/svg}polyline") if e.get("class") == "series"]
    return [[tuple(map(float, p.split(","))) for p in e.get("points").split()] for e in lines]


def test_curve_svg_draws_each_jobs_loss_and_accuracy(tmp_path):
    curves = {1: Curve([-1, 0, 1], [2.0, 1.0, 0.5], [0.1, 0.5, 0.8]), 2: Curve([-1, 0, 1], [2.2, 1.5, 1.4], [0.1, 0.3, 0.6])}
    results.plot(tmp_path / "c.svg", curves, "mindp: mlp & <friends>")
    text = (tmp_path / "c.svg").read_text()
    assert "mindp: mlp &amp; &lt;friends&gt;" in text and "job 2" in text
    loss1, loss2, acc1, acc2 = series(tmp_path / "c.svg")
    assert len(loss1) == 3 and len(acc2) == 3
    assert [x for x, _ in loss1] == [x for x, _ in loss2] and loss1[0][0] < loss1[1][0] < loss1[2][0]
    # Page y grows downwards: falling loss, rising accuracy; job 2's loss ends above job 1's.
    assert loss1[0][1] < loss1[1][1] < loss1[2][1] and acc1[0][1] > acc1[1][1] > acc1[2][1]
    assert loss2[2][1] < loss1[2][1]
    assert min(x for x, _ in acc1) > max(x for x, _ in loss1)  # the accuracy panel is to the right


def test_ticks_are_round_and_cover_the_range():
    for lo, hi in [(0, 2.3), (0, 100), (1, 7), (0, 0.004), (5, 5)]:
        t = svgplot.ticks(lo, hi)
        assert t[0] <= lo and t[-1] >= hi and 2 <= len(t) <= 12
        steps = {round(b - a, 12) for a, b in zip(t, t[1:])}
        assert len(steps) == 1 and f"{steps.pop():.0e}"[0] in "125"
    assert all(v == int(v) for v in svgplot.ticks(0, 3, integer=True))


def test_curve_title_names_the_model_and_says_packet_loss_only_with_loss():
    title = results.curve_title("gpt (1.3M parameters)", "bmv2", 2, 4, 0.02)
    assert "packet loss 0.02" in title and "2 job(s) x 4 workers" in title and "bmv2" in title
    assert "gpt (1.3M parameters)" in title
    clean = results.curve_title("mlp (4810 parameters)", "embedded", 1, 4, 0.0)
    assert "loss" not in clean and "mlp (4810 parameters)" in clean


def test_the_gpt_accuracy_axis_says_next_byte(tmp_path):
    assert "next byte" in results.accuracy_label("gpt") and "next byte" not in results.accuracy_label("cnn")
    c = Curve([-1, 0], [5.6, 4.7], [0.0, 0.2])
    results.plot(tmp_path / "g.svg", {1: c}, "gpt", results.accuracy_label("gpt"))
    assert "test accuracy, next byte (%)" in (tmp_path / "g.svg").read_text()


def test_n_params_counts_every_element():
    assert results.n_params({"a": np.zeros((3, 4)), "b": np.zeros(5)}) == 17


def test_digest_counters_are_summed_from_the_workers_done_records():
    done = [{"stats": {"digest_checks": 4, "digest_mismatches": 1}}, {"stats": {"digest_checks": 4}}, {}, None]
    counts = results.digest_counts(done)
    assert counts == {"digest_checks": 8, "digest_mismatches": 1}
    cfg = {"target": "embedded", "workers": 2, "steps": 4, "loss": 0.0, "seed": 0}
    s = results.summary(cfg, [dataclasses.replace(job(1), **counts), job(2)], 1.0, 0.0, "mlp", 10)
    assert (s["digest_checks"], s["digest_mismatches"]) == (8, 1)


def test_a_run_with_a_digest_mismatch_ends_with_a_warning_naming_the_logs():
    assert results.digest_warning({"digest_checks": 8, "digest_mismatches": 0}, "runs/x/logs") is None
    line = results.digest_warning({"digest_checks": 8, "digest_mismatches": 1}, "runs/x/logs")
    assert line.startswith("  WARNING: 1 of 8 step digest check(s)") and "runs/x/logs" in line


def test_skipped_steps_are_the_steps_of_the_nodes_nonfinite_chunks_and_are_told():
    assert results.skipped_steps({"nonfinite": [[4, 0], [1, 3], [4, 2]]}) == [1, 4]
    assert results.skipped_steps({}) == [] and results.skipped_line([]) is None
    assert results.skipped_line([1, 4]) == ("  2 step(s) skipped by the optimizer node, a gradient not finite (Inf or "
                                            "NaN): 1, 4 (the parameters kept, as torch's GradScaler skips a step)")
    assert ": 0, 1, 2, 3, 4, 5, 6, 7 ... (" in results.skipped_line(list(range(9)))
