"""A run's teardown (Run.close): every phase runs and is timed into run.log, a phase that fails
is said on the console with its error instead of passing unseen, and an end that hangs leaves
every thread's stack in run.log."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from types import SimpleNamespace

from mindp import progress

from mininet_topos.console import Console
from mininet_topos.star import Run


def a_run(tmp_path, agents_close) -> tuple[Run, list[str]]:
    run = Run.__new__(Run)  # the teardown's seams only: no network, switch or agents
    done: list[str] = []
    run.console = Console()
    run.console.log = tmp_path / "run.log"
    run.agents = SimpleNamespace(close=agents_close)
    run.ctl = SimpleNamespace(close=lambda: done.append("controller"))
    run.net = SimpleNamespace(switches=[SimpleNamespace(stop_process=lambda: done.append("switch"))],
                              stop=lambda: done.append("network"))
    return run, done


def test_a_quiet_teardown_goes_to_the_log_only(tmp_path, capsys):
    run, done = a_run(tmp_path, lambda: None)
    run.close()
    assert done == ["controller", "switch", "network"]
    assert re.search(r"teardown: agents [\d.]+ s, controller [\d.]+ s, switch [\d.]+ s, network [\d.]+ s$",
                     (tmp_path / "run.log").read_text(), re.M)
    assert "teardown" not in capsys.readouterr().out


def test_a_failed_phase_is_said_with_its_error_and_the_next_phases_still_run(tmp_path, capsys):
    def broken():
        raise OSError("pipe gone")

    run, done = a_run(tmp_path, broken)
    run.close()
    assert done == ["controller", "switch", "network"]
    said = capsys.readouterr().out
    assert re.search(r"teardown: agents [\d.]+ s \(failed: OSError: pipe gone\), controller [\d.]+ s, switch", said)
    assert "failed: OSError: pipe gone" in (tmp_path / "run.log").read_text()


STUCK = textwrap.dedent("""
    import pathlib, sys, time
    from mininet_topos.console import Console

    def stuck_in_teardown(log):
        while "stuck_in_teardown" not in log.read_text():  # until the stacks are out
            time.sleep(0.05)

    console = Console()
    console.log = pathlib.Path(sys.argv[1])
    console.stacks_after(0.2)
    stuck_in_teardown(console.log)
""")


def test_an_end_that_hangs_writes_every_threads_stack_to_run_log(tmp_path):
    log = tmp_path / "run.log"
    proc = subprocess.Popen([sys.executable, "-c", STUCK, str(log)])
    progress.communicate(proc)  # the script ends once the stacks are in the log (a stall fails)
    text = log.read_text()
    assert proc.returncode == 0 and "Timeout (0:00:00.200000)!" in text
    assert re.search(r'File "<string>", line \d+ in stuck_in_teardown', text)

