"""make run as the tests start it: the orchestrator with its own state file, runs directory,
interface names and free gRPC/thrift ports, its progress as a deadline's measure, and what a
test checks or ends after it. The harness of tests/run's make-run tests (tests/run/conftest.py
gives every test there `stop_left_runs`)."""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from mindp import progress, targets
from mindp.harness import testbed
from mininet_topos.runstate import RunState

REPO = pathlib.Path(__file__).resolve().parents[2]

#: Interface names of this test process (its name tag: no other live process has it, so test workers
#: and test runs side by side never meet), never make run's own mnr-.
PREFIX = testbed.tagged("mt") + "-"
#: Consecutive gRPC and Thrift ports a run gets, enough for the trees the tests build (a tree's
#: switches take the next ports; ports taken one by one met once: a leaf's Thrift on the spine's gRPC).
TREE_PORTS = 8
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="make run needs root")


class MakeRun:
    started: list[MakeRun] = []  # the runs of the test in progress, for stop_left_runs

    def __init__(self, tmp: pathlib.Path, *args: str):
        self.tmp = tmp
        self.state_file = tmp / "run-state.json"
        self.runs = tmp / "runs"
        grpc, thrift = targets.free_port(TREE_PORTS), targets.free_port(TREE_PORTS)
        self.cmd = [sys.executable, "-m", "mininet_topos.run", "--runs-dir", str(self.runs), "--state-file",
                    str(self.state_file), "--grpc-port", str(grpc), "--thrift-port", str(thrift), "--cli", "0",
                    "--if-prefix", PREFIX, *args]
        self.proc: subprocess.Popen | None = None
        self.out = self.err = ""

    def start(self, ctrl_c: bool = False) -> MakeRun:
        """ctrl_c: the run takes SIGINT as a terminal's foreground job does. A shell without job
        control starts background commands with SIGINT ignored, and Python then keeps it ignored:
        a `make test &` would otherwise hand that on to the run, which would train through it."""
        self.proc = subprocess.Popen(self.cmd, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True,
                                     preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if ctrl_c else None)
        MakeRun.started.append(self)
        return self

    def wait(self) -> int:
        """Its exit code; fails once the run (its processes, its runs directory) made no progress
        for progress.STALL s."""
        try:
            self.out, self.err = progress.communicate(self.proc, progress=self.written)
        except progress.Stalled as exc:
            pytest.fail(f"make run hung: {exc}{self.log_tails()}")
        if self.proc.returncode:
            self.out += self.log_tails()  # (not err: tests check its one line) logs go with tmp_path (CI)
        return self.proc.returncode

    def log_tails(self, lines: int = 15) -> str:
        """The last lines of each log of the run, for a failure's message."""
        logs = sorted(self.runs.glob("*/logs/*.log")) if self.runs.exists() else []
        return "".join(f"\n--- {p.name} (last {lines} lines)\n" + "\n".join(p.read_text(errors="replace").splitlines()[-lines:])
                       for p in logs)

    def run(self) -> int:
        return self.start().wait()

    def stop(self) -> subprocess.CompletedProcess:
        """`make stop` on this run (its module on the run's state file): its exit code and output."""
        return progress.run([sys.executable, "-m", "mininet_topos.stop", "--state-file", str(self.state_file)],
                            cwd=REPO, capture_output=True, text=True)

    def written(self) -> int:
        """Bytes the run wrote so far (logs, results). Files come and go while it looks (the node
        renames its commit's .tmp): one gone between listing and stat counts nothing."""
        total = 0
        for root, _, files in os.walk(self.runs):
            for name in files:
                try:
                    total += os.stat(os.path.join(root, name)).st_size
                except FileNotFoundError:
                    pass
        return total

    @property
    def run_dir(self) -> pathlib.Path:
        (d,) = [p for p in self.runs.iterdir() if p.name != "latest"]
        assert (self.runs / "latest").resolve() == d.resolve()  # runs/latest points at the newest run
        return d

    def summary(self) -> dict:
        """The run's summary.json; a worker's digest mismatch fails here, in every test that reads it:
        the check repairs the worker, so the run would otherwise end bit-exact with the divergence
        unseen (no test here injects one)."""
        s = json.loads((self.run_dir / "summary.json").read_text())
        assert not s.get("digest_mismatches"), f"{s['digest_mismatches']} digest mismatch(es): see {self.run_dir}"
        return s

    def state(self) -> RunState | None:
        return RunState.load(self.state_file)

    def wait_for(self, what):
        """what()'s first true value, while the run makes progress."""
        got = None

        def done():
            nonlocal got
            got = what()
            if not got and self.proc.poll() is not None:
                self.wait()
                pytest.fail(f"make run ended early ({self.proc.returncode}):\n{self.out}\n{self.err}")
            return bool(got)

        try:
            progress.wait(done, progress.both(progress.activity(self.proc.pid), self.written), stall=progress.STALL,
                          what="make run", poll=0.2)
        except progress.Stalled as exc:
            pytest.fail(str(exc))
        return got

    def training(self):
        """The state once a worker has completed a step."""
        st = self.state()
        if st is None or not self.runs.exists():
            return None
        logs = list(self.runs.glob("*/logs/worker-*.log"))
        return st if any('"step": 0' in p.read_text() for p in logs) else None


@pytest.fixture(autouse=True)
def stop_left_runs():
    """End what a failed test's runs left (a run still going, a crashed run's network and
    processes), as `make stop` does, so that the next test of this worker does not meet them."""
    MakeRun.started.clear()
    yield
    for run in MakeRun.started:
        if run.proc.poll() is None or run.state_file.exists():
            run.stop()
        if run.proc.poll() is None:
            progress.end(run.proc)
    MakeRun.started.clear()


def assert_clean(run: MakeRun, recorded: RunState | None = None) -> None:
    assert not run.state_file.exists(), "state file left behind"
    present = [i for i in os.listdir("/sys/class/net") if i.startswith(PREFIX)]
    assert present == [], f"interfaces left: {present}"
    if recorded is not None:
        assert [p for p in recorded.live_procs() if p.name != "orchestrator"] == []
