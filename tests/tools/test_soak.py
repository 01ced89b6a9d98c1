"""The soak's verdicts (tools/soak.py), without a network: RSS growth after warm-up and the fault plan."""
import argparse
import subprocess
import sys

import numpy as np
import pytest

from host_agent import resume
from host_agent.node import UP_LINE

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


def test_the_embedded_switch_gets_its_faults_wherever_it_is_the_one_started(monkeypatch):
    args = argparse.Namespace(target="auto", dup=0.01, reorder=0.02, seed=5)
    monkeypatch.setattr(soak.targets, "find_bmv2", lambda: "/opt/p4tools/bin/simple_switch_grpc")
    monkeypatch.setattr(soak, "K", 512)  # a K BMv2 cannot run: auto starts the embedded switch
    assert soak.switch_fault_args(args) == ["--dup-prob", "0.01", "--reorder-prob", "0.02", "--seed", "5"]
    monkeypatch.setattr(soak, "K", 32)  # BMv2 runs it: no switch faults (BMv2 has none)
    assert soak.switch_fault_args(args) == []
    assert soak.switch_fault_args(argparse.Namespace(target="embedded", dup=0.0, reorder=0.0, seed=0))[:2] == \
        ["--dup-prob", "0.0"]


def test_a_stopped_soak_says_where_each_worker_stands(tmp_path):
    args = argparse.Namespace(steps=2000, workers=2, seed=3, faults=1, loss=0.05)
    s = soak.Soak(args, tmp_path)
    s.workers = {(1, 0): None, (1, 1): None}
    path = s.resume_path(1, 0)
    resume.create(path, 1, 0, s.layout, np.zeros(s.layout.total, np.float16), 75, None)
    f = resume.ResumeFile(path, 1, 0, s.layout)
    f.record(75, np.array([0, 4]), np.array([False, False]))
    assert s.standing() == [f"  worker 0 of job 1: step 75, 2 of {s.layout.n_chunks} chunks answered",
                            "  worker 1 of job 1: no resume file"]


def test_the_rss_rule_catches_a_process_that_keeps_what_it_takes():
    """Real RSS read as the soak reads it: a process holding 16 MB more each window fails the rule,
    one that frees what it takes passes."""
    code = ("import sys\nheld = []\nfor line in sys.stdin:\n    b = bytearray(16 << 20)\n"
            "    if line.strip() == 'keep':\n        held.append(b)\n    del b\n    print('ok', flush=True)\n")
    for how, grows in (("keep", True), ("free", False)):
        with subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) as proc:
            rep = soak.Report()
            for window in range(4):
                proc.stdin.write(how + "\n")
                proc.stdin.flush()
                assert proc.stdout.readline() == "ok\n"
                rep.rss[("p", window)] = soak.rss_kb(proc.pid)
            proc.stdin.close()
        assert (soak.growth(rep, 4)["p"] > soak.GROWTH_LIMIT) is grows, rep.rss


class LocalHost:
    """A testbed host's popen, in this namespace: the seam Agent starts its process through."""

    @staticmethod
    def popen(*argv, **kw):
        return subprocess.Popen(list(argv), **kw)


def test_workers_start_once_this_life_of_the_node_is_up_and_a_node_that_dies_first_says_so(tmp_path):
    script = tmp_path / "node.py"
    script.write_text("import sys, time\nprint('opening', flush=True)\n"
                      "if sys.argv[1] == 'die':\n    sys.exit(3)\n"
                      "time.sleep(0.3)\nprint(sys.argv[1], flush=True)\ntime.sleep(60)\n")
    agent = soak.Agent("node", LocalHost(), [str(script), UP_LINE + " 1"], tmp_path / "node.log")
    try:
        assert agent.start().wait_line(UP_LINE) is agent
        assert UP_LINE in (tmp_path / "node.log").read_text()
        agent.argv = [str(script), "die"]  # the next life ends before its line: the last life's does not count
        agent.restart()
        with pytest.raises(RuntimeError, match=r"node exited with code 3 before 'mindp-optimizer: job'"):
            agent.wait_line(UP_LINE)
    finally:
        agent.kill()


class NoNetwork:
    """In place of Soak: a soak main() lets through gets this far and no further (no namespace)."""

    def __init__(self, args, work):
        raise AssertionError(f"the soak started with {args}")


@pytest.mark.parametrize("argv, says", [
    (["--target", "bogus"], "soak: --target: unknown target 'bogus': choose one of auto, bmv2, embedded, embedded-python"),
    (["--workers", "0"], "soak: --workers must be 1..32 (a job's worker ids are 0..31), not 0"),
    (["--workers", "40"], "soak: --workers must be 1..32 (a job's worker ids are 0..31), not 40"),
    (["--loss", "7"], "soak: --loss must be a probability in [0, 1), not 7"),
    (["--dup", "-3"], "soak: --dup must be a probability in [0, 1), not -3"),
    (["--reorder", "nan"], "soak: --reorder must be a probability in [0, 1), not nan"),
    (["--faults", "-2"], "soak: --faults must be >= 0, not -2"),
    (["--window", "0"], "soak: --window must be >= 1"),
    # growth() has no window after the base one: the RSS check would pass without being made
    (["--steps", "1000"], "soak: --steps must cover 3 windows (warm-up, base, later): at least 3 x --window"),
    (["--steps", "1499"], "soak: --steps must cover 3 windows (warm-up, base, later): at least 3 x --window"),
])
def test_bad_arguments_are_refused_in_one_line_before_any_network(monkeypatch, capsys, argv, says):
    monkeypatch.setattr(soak, "Soak", NoNetwork)
    assert soak.main(argv) == 2
    assert capsys.readouterr().err == says + "\n"


def test_keep_must_be_a_new_or_empty_directory_and_the_limits_themselves_pass(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(soak, "Soak", NoNetwork)
    monkeypatch.setattr(soak.os, "geteuid", lambda: 0)
    (tmp_path / "file").write_text("x")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "worker1-0.resume").write_text("a previous soak's")  # it would be resumed from
    assert soak.main(["--keep", str(tmp_path / "file")]) == 2
    assert soak.main(["--keep", str(tmp_path / "old")]) == 2
    assert soak.main(["--keep", str(tmp_path / "file" / "sub")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"soak: --keep {tmp_path / 'file'} is not a directory",
        f"soak: --keep {tmp_path / 'old'} is not empty: give a new or empty directory",
        f"soak: cannot create --keep {tmp_path / 'file' / 'sub'}: Not a directory"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(AssertionError, match="the soak started"):
        soak.main(["--keep", str(tmp_path / "empty"), "--workers", "32", "--steps", "3", "--window", "1",
                   "--loss", "0", "--dup", "0.99", "--faults", "0", "--target", "embedded"])


def test_a_switch_that_does_not_come_up_ends_the_soak_in_one_line(monkeypatch, capsys, tmp_path):
    class SwitchDown:
        def __init__(self, args, work):
            pass

        def start(self):
            raise soak.targets.TargetError("embedded switch exited with code 1 at start; see switch.log")

        def close(self):
            pass

    monkeypatch.setattr(soak, "Soak", SwitchDown)
    monkeypatch.setattr(soak.os, "geteuid", lambda: 0)
    assert soak.main(["--keep", str(tmp_path / "k"), "--target", "embedded"]) == 1
    assert capsys.readouterr().err == "soak: embedded switch exited with code 1 at start; see switch.log\n"
