"""The host agent's console entry points run as processes: a run's exit code and output, the check that
a refusal is one clear line, and the optimizer node's options that stand in for a topology."""
import os
import sys

from mindp import progress


def run(module, *args, env=None):
    p = progress.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                     env=None if env is None else {**os.environ, **env})
    return p.returncode, p.stdout, p.stderr


def one_line_error(code, err, prog, needle):
    assert code != 0
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(prog) or "usage:" in err, err
    assert needle in err, err


EXPLICIT = ["--workers", "2", "--slots", "8", "--mac", "02:00:00:00:00:09", "--ip", "10.0.0.9"]
