"""Set-up is idempotent and `make p4` without p4c keeps the committed artifacts."""
import pathlib
import subprocess

from p4src import artifacts

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_second_setup_has_nothing_to_do():
    # make test ran setup already; -q asks whether anything is out of date.
    proc = subprocess.run(["make", "-q", "setup"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, "make setup would install again"


def test_compile_without_p4c_keeps_artifacts_and_says_so(monkeypatch, capsys):
    before = artifacts.BMV2_JSON.stat().st_mtime_ns, artifacts.P4INFO.read_bytes()
    monkeypatch.setattr(artifacts, "find_p4c", lambda: None)
    assert artifacts.main(["compile"]) == 0
    assert "p4c-bm2-ss not found" in capsys.readouterr().err
    assert (artifacts.BMV2_JSON.stat().st_mtime_ns, artifacts.P4INFO.read_bytes()) == before


def test_check_reports_stale_sources(monkeypatch, capsys):
    monkeypatch.setattr(artifacts, "recorded_hash", lambda: "0" * 64)
    assert artifacts.main(["check"]) == 1
    assert "stale" in capsys.readouterr().err
