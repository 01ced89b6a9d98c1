"""make run end to end: real Mininet, the real switch (embedded, and BMv2 where installed),
the real controller over P4Runtime, optimizer node and workers in Mininet hosts.

Each run is the orchestrator as `make run` starts it, with its own state file,
runs directory and free gRPC/thrift ports; every test checks that nothing it
started is left behind.
"""
from __future__ import annotations

import ast
import csv
import json
import os
import pathlib
import pty
import re
import select
import signal
import socket
import subprocess
import sys

import pytest

from host_agent import optim
from mindp import progress, protocol, targets, topology, workload
from mininet_topos.runstate import RunState
from p4src import artifacts
from tests.run.makerun import PREFIX, REPO, MakeRun, assert_clean, needs_root
from tests.tools import dissector

pytestmark = pytest.mark.net


def check_summary(s: dict, target: str, workers: int, steps: int, jobs: int = 1) -> None:
    for key in ("target", "workers", "steps", "jobs", "initial_loss", "final_loss", "final_accuracy",
                "max_abs_param_diff_vs_reference", "packets_sent", "retransmissions", "wall_seconds",
                "steps_per_second"):
        assert key in s, key
    assert (s["target"], s["workers"], s["steps"], s["jobs"]) == (target, workers, steps, jobs)
    assert s["max_abs_param_diff_vs_reference"] == 0.0
    assert s["digest_mismatches"] == 0  # no worker diverged from the node in any step
    assert len(s["per_job"]) == jobs
    n_chunks = -(-s["parameters"] // s["k"])  # at the run's K (BMv2's: 32)
    for j in s["per_job"]:
        assert j["max_abs_param_diff_vs_reference"] == 0.0
        # The switch completed every chunk of every step exactly once (resends are counted apart).
        assert j["switch_counters"]["completions"] == steps * n_chunks
        assert j["final_loss"] < 0.9 * j["initial_loss"]
        assert j["final_loss"] == pytest.approx(j["reference_final_loss"], abs=0.0)
    # Each worker sends at least one gradient frame per chunk per step.
    assert s["packets_sent"] >= jobs * workers * steps * n_chunks
    assert s["wall_seconds"] > 0 and s["steps_per_second"] > 0


@needs_root
def test_embedded_short_run_is_bit_exact_and_learns(tmp_path):
    run = MakeRun(tmp_path, "--target", "embedded", "--workers", "2", "--steps", "4", "--p4", "committed", "--pcap", "1")
    assert run.run() == 0, run.err
    s = run.summary()
    check_summary(s, "embedded", 2, 4)
    d = run.run_dir
    n_chunks = optim.layout_of(workload.init_params(workload.WorkloadConfig(n_workers=2))).n_chunks
    assert (d / "curve.svg").read_text().count('class="series"') == 2  # loss and accuracy of the one job
    topo = topology.Topology.load(d / "topology.json")
    assert sorted(topo.hosts) == ["opt1", "w1_0", "w1_1"] and topo.jobs[0].n_workers == 2
    logs = sorted(p.name for p in (d / "logs").iterdir())
    assert logs == ["controller.log", "optimizer-job1.log", "run.log", "switch.log", "worker-job1-0.log",
                    "worker-job1-1.log"]
    assert "job created" in (d / "logs" / "controller.log").read_text()
    log = (d / "logs" / "run.log").read_text()
    assert "bit-exact" in log
    assert re.search(r"teardown: agents [\d.]+ s, controller [\d.]+ s, switch [\d.]+ s, network [\d.]+ s$", log, re.M), log
    counters = [line for line in (d / "logs" / "switch.log").read_text().splitlines() if "P4 counters" in line]
    assert len(counters) == 1 and f"{4 * n_chunks} sums sent" in counters[0], counters
    # Absorbed gradients are not drops: only spurious retransmissions may be (busy machine).
    dropped, reasons = counters[0].split("; dropped ")[1].split(" ", 1)
    assert set(ast.literal_eval(reasons)) <= {"DUPLICATE", "STALE"}, counters
    assert int(dropped) == sum(ast.literal_eval(reasons).values()) and int(dropped) < 4 * n_chunks
    opt_stats = json.loads((d / "job1" / "optimizer-stats.json").read_text())
    assert opt_stats.get("rejected_length", 0) == 0, opt_stats  # no ICMP unreachable from the hosts' kernels
    pcaps = list((d / "pcaps").iterdir())
    assert len(pcaps) >= 3 and all(p.stat().st_size > 24 for p in pcaps)
    if dissector.TSHARK:  # the run's pcaps open decoded (tools/mindp.lua)
        grads = dissector.tshark(d / "pcaps" / f"{PREFIX}p1_in.pcap", "mindp.kind", "mindp.job", "mindp.worker",
                                 "mindp.step", "mindp.value")
        assert {(k, j, w) for k, j, w, *_ in grads} == {("1", "1", "0")}
        assert {int(r[3]) for r in grads} == {0, 1, 2, 3} and all(r[4] for r in grads)
        sums = dissector.tshark(d / "pcaps" / f"{PREFIX}p3_out.pcap", "mindp.kind", "mindp.nworkers", "mindp.chunk")
        assert {(k, n) for k, n, _ in sums} == {("2", "2")} and len({c for *_, c in sums}) == n_chunks
    assert "max_abs_param_diff_vs_reference  0.0" in run.out and "bit-exact" in run.out
    assert "training the reference in this process (4 steps)" in run.out and "reference: 4 step(s) in " in run.out
    assert_clean(run)


@needs_root
def test_a_run_with_check_0_trains_no_reference_and_says_its_bits_were_not_compared(tmp_path):
    run = MakeRun(tmp_path, "--target", "embedded", "--workers", "2", "--steps", "3", "--p4", "committed", "--check", "0")
    assert run.run() == 0, run.err
    s = run.summary()
    assert s["not_compared"].startswith("CHECK=0") and "max_abs_param_diff_vs_reference" not in s
    assert s["steps"] == 3 and s["per_job"][0]["reference_final_loss"] is None
    assert "training the reference" not in run.out and "not compared with the reference trainer (CHECK=0)" in run.out
    assert json.loads((run.run_dir / "config.json").read_text())["check"] is False
    assert_clean(run)


@needs_root
def test_embedded_run_with_loss_is_still_bit_exact(tmp_path):
    run = MakeRun(tmp_path, "--target", "embedded", "--workers", "2", "--steps", "4", "--loss", "0.05",
              "--p4", "committed", "--seed", "3", "--eval", "2")
    assert run.run() == 0, run.err
    s = run.summary()
    check_summary(s, "embedded", 2, 4)
    assert s["loss_rate"] == 0.05 and s["retransmissions"] > 0
    # EVAL=2: worker 0 evaluated the model before the first step and after steps 1 and 3 only.
    with open(run.run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows if r["loss"] not in ("", "nan")] == [1, 3], rows
    assert len(rows) == 4 and s["initial_loss"] > s["final_loss"] > 0
    # Every step's row has the workers' mean loss on their own batches, whatever EVAL says: step 0's
    # is that of the initial fp16 parameters on each worker's first batch.
    wl = workload.WorkloadConfig.load(run.run_dir / "job1" / "workload.json")
    start = {k: a.astype("float16") for k, a in optim.load_npz(run.run_dir / "job1" / "init.npz").items()}
    losses = [workload.loss_grad_fn(wl)(w, 0, start)[0] for w in range(2)]
    assert float(rows[0]["batch_loss"]) == pytest.approx(sum(losses) / 2, rel=1e-5)
    assert all(float(r["batch_loss"]) > 0 for r in rows)
    assert_clean(run)


@needs_root
def test_two_jobs_share_the_switch_both_bit_exact(tmp_path):
    run = MakeRun(tmp_path, "--target", "embedded", "--workers", "2", "--steps", "3", "--jobs", "2", "--p4", "committed")
    assert run.run() == 0, run.err
    s = run.summary()
    check_summary(s, "embedded", 2, 3, jobs=2)
    assert [j["job_id"] for j in s["per_job"]] == [1, 2]
    assert s["per_job"][0]["initial_loss"] != s["per_job"][1]["initial_loss"]  # different seeds, own models
    assert_clean(run)


@needs_root
@pytest.mark.bmv2
@pytest.mark.skipif(targets.find_bmv2() is None, reason="BMv2 simple_switch_grpc not installed")
@pytest.mark.skipif(not protocol.bmv2_fits(protocol.K), reason=f"BMv2 runs K up to {protocol.BMV2_MAX_K}")
def test_bmv2_short_run_is_bit_exact_and_learns(tmp_path):
    run = MakeRun(tmp_path, "--target", "bmv2", "--workers", "2", "--steps", "4", "--loss", "0.02")
    assert run.run() == 0, run.err
    check_summary(run.summary(), "bmv2", 2, 4)
    assert_clean(run)


@needs_root
def test_stop_after_a_crashed_run_removes_everything_and_is_safe_twice(tmp_path):
    run = MakeRun(tmp_path, "--target", "embedded", "--workers", "2", "--steps", "500", "--p4", "committed").start()
    recorded = run.wait_for(run.training)
    assert len(recorded.procs) >= 1 + 3 + 1 + 1 + 3  # orchestrator, host shells, switch shell, switch, agents
    run.proc.send_signal(signal.SIGKILL)  # a crash: no cleanup of its own
    run.wait()
    assert recorded.existing_interfaces(), "the crash should have left interfaces for stop to remove"
    first = run.stop()
    assert first.returncode == 0 and "ended" in first.stdout
    assert_clean(run, recorded)
    second = run.stop()
    assert second.returncode == 0 and "nothing to stop" in second.stdout


@needs_root
def test_stop_during_a_run_makes_it_clean_up_and_exit(tmp_path):
    run = MakeRun(tmp_path, "--target", "embedded", "--workers", "2", "--steps", "500", "--p4", "committed").start()
    recorded = run.wait_for(run.training)
    stop = run.stop()
    assert "asked the running make run to stop" in stop.stdout
    assert run.wait() == 130
    assert "stopped" in run.err and "Traceback" not in run.err
    assert "teardown: agents" in (run.run_dir / "logs" / "run.log").read_text()
    assert_clean(run, recorded)


@needs_root
def test_bad_input_is_one_line_and_starts_nothing(tmp_path):
    run = MakeRun(tmp_path, "--workers", "zero")
    assert run.run() == 2
    assert run.err.strip() == "make run: WORKERS must be an integer in 1..32, got 'zero'"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        run = MakeRun(tmp_path, "--target", "embedded", "--grpc-port", str(port))
        assert run.run() == 1
    assert "already in use" in run.err and len(run.err.strip().splitlines()) == 1
    assert not run.runs.exists()
    assert_clean(run)
    # A run whose processes are alive blocks a second one (and is not touched by it).
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        st = RunState(tmp_path / "run-state.json")
        st.add_proc(other.pid, "orchestrator", False)
        run = MakeRun(tmp_path, "--target", "embedded")
        assert run.run() == 1
        assert "a run is already active" in run.err and "make stop" in run.err
        assert other.poll() is None and run.state_file.exists()
    finally:
        other.kill()
        other.wait()


@needs_root
def test_a_node_ram_its_node_would_refuse_is_refused_before_the_network_starts(tmp_path):
    """The node's own planner judges NODE_RAM before Mininet starts; the least budget it names runs."""
    run = MakeRun(tmp_path, "--target", "embedded", "--p4", "committed", "--node-ram", "100K")
    assert run.run() == 2
    assert len(run.err.strip().splitlines()) == 1, run.err
    assert "NODE_RAM: the optimizer node of job 1 would refuse it: RAM budget 102400 B" in run.err
    least = re.search(r"NODE_RAM=(\w+) or more runs", run.err).group(1)
    assert "Mininet up" not in run.out
    assert_clean(run)
    assert not run.runs.exists() or not any(run.runs.iterdir())  # nothing of a refused run is kept
    named = re.search(r"mindp run (\S+):", run.out).group(1)  # the header names the run it then removes
    assert f"(nothing of {named} is kept)" in run.err
    (tmp_path / "least").mkdir()
    run = MakeRun(tmp_path / "least", "--target", "embedded", "--p4", "committed", "--node-ram", least,
                  "--workers", "2", "--steps", "3")
    assert run.run() == 0, run.err
    s = json.loads(next(run.runs.glob("*/summary.json")).read_text())
    assert s["max_abs_param_diff_vs_reference"] == 0.0


@needs_root
def test_a_missing_tool_is_named(tmp_path):
    run = MakeRun(tmp_path, "--target", "embedded")
    run.cmd = ["env", "PATH=/nonexistent", *run.cmd]
    assert run.run() == 1
    assert run.err.strip() == "make run: mnexec not found: install the Debian package mininet (make setup does)"
    assert not run.runs.exists()


def test_not_root_is_refused(tmp_path, monkeypatch, capsys):
    from mininet_topos import run as orchestrator

    monkeypatch.setattr(orchestrator.os, "geteuid", lambda: 1000)  # seam: a user without root
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        code = orchestrator.main(["--target", "embedded", "--runs-dir", str(tmp_path / "runs"),
                                  "--state-file", str(tmp_path / "state.json")])
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert code == 1
    assert capsys.readouterr().err.strip() == \
        "make run: must run as root (Mininet needs network namespaces): sudo make run"
    assert not (tmp_path / "runs").exists() and not (tmp_path / "state.json").exists()


class Terminal:
    """The orchestrator on a pseudo-terminal, as a user's shell runs it (the Mininet CLI reads it)."""

    def __init__(self, run: MakeRun):
        self.master, slave = pty.openpty()
        run.proc = subprocess.Popen(run.cmd, cwd=REPO, stdin=slave, stdout=slave, stderr=slave,
                                    start_new_session=True)
        MakeRun.started.append(run)
        os.close(slave)
        self.run = run
        self.text = ""

    def expect(self, marker: str, start: int = 0) -> str:
        """Everything written from `start` up to and including `marker` (however slowly it comes:
        it fails once neither the terminal nor the run's CPU time moved for progress.STALL s)."""
        def seen() -> bool:
            if marker in self.text[start:]:
                return True
            if select.select([self.master], [], [], 0.2)[0]:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:
                    chunk = b""
                if not chunk:  # the other end closed: the run ended
                    pytest.fail(f"the run ended before {marker!r}:\n{self.text[-3000:]}")
                self.text += chunk.decode(errors="replace")
            return marker in self.text[start:]

        try:
            progress.wait(seen, progress.both(lambda: len(self.text), progress.activity(self.run.proc.pid)),
                          stall=progress.STALL, what=f"{marker!r} on the terminal", poll=0)
        except progress.Stalled as exc:
            pytest.fail(f"{exc}:\n{self.text[-3000:]}")
        end = self.text.index(marker, start) + len(marker)
        return self.text[start:end]

    def command(self, line: str) -> str:
        """Type one CLI command; its output up to the next prompt."""
        start = len(self.text)
        os.write(self.master, (line + "\n").encode())
        return self.expect("mininet> ", start)

    def drain(self) -> None:
        while select.select([self.master], [], [], 0.2)[0]:
            try:
                if not os.read(self.master, 65536):
                    return
            except OSError:
                return

    def close(self) -> None:
        os.close(self.master)


@needs_root
@pytest.mark.parametrize("how", ["exit", "make stop"])
def test_cli_after_training_pings_runs_mindp_ctl_and_cleans_up(tmp_path, how):
    run = MakeRun(tmp_path, "--target", "embedded", "--workers", "2", "--steps", "3", "--p4", "committed")
    run.cmd[run.cmd.index("--cli") + 1] = "1"
    term = Terminal(run)
    try:
        term.expect("mininet> ")
        assert "bit-exact with the reference trainer" in term.text
        recorded = run.state()
        ping = term.command("pingall")
        assert "0% dropped" in ping and "(6/6 received)" in ping, ping
        one = term.command("w1_1 ping -c1 w1_0")
        assert "1 received" in one, one
        topo = run.run_dir / "topology.json"
        p4info = artifacts.P4INFO
        ctl = term.command(f"sh {pathlib.Path(sys.executable).parent / 'mindp-ctl'} --topology {topo} "
                           f"--p4info {p4info} --json stats")
        stats = json.loads(ctl[ctl.index("{"):ctl.rindex("}") + 1])
        assert stats["jobs"]["1"]["completions"] > 0, stats
        if how == "exit":
            os.write(term.master, b"exit\n")
            term.drain()
            assert progress.wait_process(run.proc) == 0
        else:
            stop = run.stop()
            assert "asked the running make run to stop" in stop.stdout
            term.drain()
            assert progress.wait_process(run.proc) == 130
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()
        term.close()
    assert_clean(run, recorded)


@needs_root
def test_log_debug_traces_every_packet_into_the_runs_switch_log(tmp_path):
    run = MakeRun(tmp_path, "--target", "embedded", "--workers", "2", "--steps", "1", "--p4", "committed",
              "--log", "debug")
    assert run.run() == 0, run.err
    trace = (run.run_dir / "logs" / "switch.log").read_text()
    for what in ("in on port 1", "parser state", "table 'MindpIngress.admission.workers': hit"):
        assert what in trace, what
    assert "Thrift off" not in trace  # the run gives the embedded switch its own Thrift port
    assert_clean(run)
