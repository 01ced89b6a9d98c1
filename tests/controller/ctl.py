"""mindp-ctl as the tests run it: its command line, its main in this process, and Ctl, a session
against one switch that checks each command's exit and its one-line errors."""
from __future__ import annotations

import contextlib
import io
import json
import pathlib
import subprocess
import sys

from controller.cli import main as ctl_main
from mindp import progress


def ctl_command() -> list[str]:
    script = pathlib.Path(sys.executable).with_name("mindp-ctl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "controller"]


def in_process(argv: list[str]) -> subprocess.CompletedProcess:
    """mindp-ctl's main in this process (a process start costs ~0.4 s of CPU; the entry point itself
    is run as a process by the tests that call ctl_command)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = ctl_main(argv)
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


class Ctl:
    def __init__(self, addr: str, topo_path: pathlib.Path):
        self.options = ["--grpc-addr", addr, "--topology", str(topo_path)]

    def run(self, *args: str, ok: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
        """`shell` (it execs p4runtime-shell, reading `stdin`) as a process; other commands in-process."""
        if "shell" in args:
            proc = progress.run([*ctl_command(), *self.options, *args], capture_output=True, text=True, input=stdin)
        else:
            proc = in_process([*self.options, *args])
        if ok:
            assert proc.returncode == 0, f"{args}: {proc.stderr}"
            assert proc.stderr == "", proc.stderr
        return proc

    def json(self, *args: str):
        return json.loads(self.run("--json", *args).stdout)

    def fails(self, *args: str, match: str, code: int = 1) -> str:
        proc = self.run(*args, ok=False)
        assert proc.returncode == code, (args, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert match in lines[0], lines[0]
        return lines[0]
