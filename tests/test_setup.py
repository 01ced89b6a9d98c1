"""Set-up is idempotent; `check` reports stale artifacts (make p4 without p4c: tests/run/test_p4_guard.py)."""
import pathlib
import subprocess

from p4src import artifacts

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_second_setup_has_nothing_to_do():
    # make test ran setup already; -q asks whether anything is out of date.
    proc = subprocess.run(["make", "-q", "setup"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, "make setup would install again"


def test_check_reports_stale_sources(monkeypatch, capsys):
    monkeypatch.setattr(artifacts, "recorded_hash", lambda root=None, k=None: "0" * 64)
    assert artifacts.main(["check"]) == 1
    assert "stale" in capsys.readouterr().err
