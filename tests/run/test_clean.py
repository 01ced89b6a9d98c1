"""make clean: old runs go, the newest stays (runs/latest) unless ALL=1; nothing else is touched."""
import os
import pathlib

from mininet_topos import clean


def make_runs(root: pathlib.Path, names: list[str]) -> None:
    for name in names:
        (root / name / "logs").mkdir(parents=True)
        (root / name / "summary.json").write_text("{}")


def test_runs_are_ordered_by_time_then_suffix_and_others_ignored(tmp_path):
    make_runs(tmp_path, ["20261123-040508-2", "20261123-040508", "20261122-235959", "20261123-040508-10"])
    (tmp_path / "notes").mkdir()
    (tmp_path / "README").write_text("mine")
    names = [p.name for p in clean.runs(tmp_path)]
    assert names == ["20261122-235959", "20261123-040508", "20261123-040508-2", "20261123-040508-10"]
    assert clean.runs(tmp_path / "missing") == []


def test_clean_keeps_the_newest_and_points_latest_at_it(tmp_path):
    make_runs(tmp_path, ["20261122-235959", "20261123-040508", "20261123-101010"])
    clean.point_latest(tmp_path, tmp_path / "20261122-235959")  # stale link: repointed
    (tmp_path / "notes").mkdir()
    line = clean.clean(tmp_path)
    assert line.startswith("removed 2 run(s)") and "20261123-101010" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["20261123-101010", "latest", "notes"]
    assert os.readlink(tmp_path / "latest") == "20261123-101010"  # relative: the runs dir may move
    assert (tmp_path / "latest" / "summary.json").exists()
    assert clean.clean(tmp_path).startswith("removed 0 run(s)")  # twice is safe


def test_clean_all_removes_every_run_and_the_link(tmp_path, capsys):
    make_runs(tmp_path, ["20261122-235959", "20261123-040508"])
    clean.point_latest(tmp_path, tmp_path / "20261123-040508")
    assert clean.main(["--all", "--runs-dir", str(tmp_path)]) == 0
    assert "removed 2 run(s)" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
    assert clean.main(["--runs-dir", str(tmp_path / "never-made")]) == 0


def test_a_run_withdrawn_leaves_nothing_and_latest_names_the_run_before(tmp_path):
    """A run refused before its network came up (RESUME= of a script since changed): RESUME=latest
    must go on naming the run it named before."""
    make_runs(tmp_path, ["20261122-235959", "20261123-040508"])
    clean.point_latest(tmp_path, tmp_path / "20261123-040508")
    clean.withdraw(tmp_path / "20261123-040508")
    assert os.readlink(tmp_path / "latest") == "20261122-235959"
    clean.withdraw(tmp_path / "20261122-235959")
    assert list(tmp_path.iterdir()) == []
