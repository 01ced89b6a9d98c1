"""An edited P4 program is never silently ignored: without p4c, `make p4` and `make run`
refuse committed artifacts that differ from the sources (issue 16.1).

p4c is hidden through the find_p4c seam; the sources are a copy of p4src/ in a
temporary directory, edited there (the shared tree is never touched).
"""
from __future__ import annotations

import pathlib
import shutil

import pytest

from mininet_topos import preflight as orchestrator
from p4src import artifacts, gen_p4


@pytest.fixture
def tree(tmp_path, monkeypatch) -> pathlib.Path:
    root = tmp_path / "p4src"
    shutil.copytree(artifacts.HERE, root, ignore=shutil.ignore_patterns("__pycache__", "*.py", "build"))
    prog = artifacts.Program(artifacts.P.K, root)
    monkeypatch.setattr(artifacts, "HERE", root)
    monkeypatch.setattr(artifacts, "BMV2_JSON", prog.json)
    monkeypatch.setattr(artifacts, "P4INFO", prog.p4info)
    monkeypatch.setattr(artifacts, "find_p4c", lambda: None)
    # A consistent tree by construction, whatever state the working copy is in: the hash of these
    # sources recorded (the committed JSON stands in for their program).
    for k in artifacts.COMMITTED_K:
        artifacts.Program(k, root).hash_file.write_text(artifacts.source_hash(root, k) + "  p4c\n")
    return root


def edit(path: pathlib.Path) -> None:
    path.write_text(path.read_text() + "\n/* an edit the committed program does not have */\n")


def test_unchanged_sources_are_current_and_make_p4_keeps_them(tree, capsys):
    assert artifacts.staleness() is None
    assert artifacts.main(["compile"]) == 0
    assert "matches the P4 sources" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["mindp.p4", "aggregation.p4", "constants.p4"])
def test_make_p4_without_p4c_refuses_an_edited_program_in_one_line(tree, capsys, name):
    before = {p: p.read_bytes() for p in (tree / "compiled").rglob("*") if p.is_file()}
    edit(tree / name)
    assert artifacts.main(["compile"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("make p4: ")
    assert "p4c-bm2-ss is not installed" in err and "/opt/p4tools/bin" in err
    assert {p: p.read_bytes() for p in (tree / "compiled").rglob("*") if p.is_file()} == before
    assert artifacts.main(["check"]) == 1


def test_a_change_of_the_generated_text_is_stale(tree, monkeypatch):
    render = gen_p4.render
    monkeypatch.setattr(gen_p4, "render", lambda k=artifacts.P.K: {**render(k), "switch.p4": "/* changed */"})
    assert "changed since p4src/compiled/k" in artifacts.staleness()
    assert artifacts.main(["compile"]) == 1


def test_missing_hash_file_is_stale(tree):
    artifacts.Program(artifacts.P.K, tree).hash_file.unlink()
    assert "no recorded source hash" in artifacts.staleness()


def test_make_run_refuses_a_stale_committed_program_naming_the_fix(tree, tmp_path):
    json_path, p4info, how = orchestrator.p4_program("auto", tmp_path)
    assert (json_path, p4info) == (artifacts.BMV2_JSON, artifacts.P4INFO) and "matches the sources" in how
    edit(tree / "admission.p4")
    for mode in ("auto", "committed"):
        with pytest.raises(orchestrator.RunError) as err:
            orchestrator.p4_program(mode, tmp_path)
        msg = str(err.value)
        assert "changed since p4src/compiled/k" in msg and "install p4c" in msg
        assert "\n" not in msg


def test_make_run_committed_with_p4c_installed_says_to_recompile(tree, tmp_path, monkeypatch):
    monkeypatch.setattr(artifacts, "find_p4c", lambda: "/somewhere/p4c-bm2-ss")
    edit(tree / "mindp.p4")
    with pytest.raises(orchestrator.RunError, match="run make p4, or drop --p4 committed"):
        orchestrator.p4_program("committed", tmp_path)


def test_make_run_with_p4c_compiles_only_sources_the_committed_program_does_not_match(tree, tmp_path, monkeypatch):
    calls = []

    def fake_compile(p4c, main, json_path, p4info, k=None):
        calls.append(p4c)
        json_path.write_text("{}")
        p4info.write_text("")

    monkeypatch.setattr(artifacts, "find_p4c", lambda: "/somewhere/p4c-bm2-ss")
    monkeypatch.setattr(artifacts, "compile_program", fake_compile)
    json_path, _, how = orchestrator.p4_program("auto", tmp_path / "a")
    assert json_path == artifacts.BMV2_JSON and "matches the sources" in how and not calls
    (tmp_path / "b").mkdir()
    json_path, _, how = orchestrator.p4_program("compile", tmp_path / "b")
    assert json_path == tmp_path / "b" / "p4" / "mindp.json" and calls == ["/somewhere/p4c-bm2-ss"]
    edit(tree / "mindp.p4")
    (tmp_path / "c").mkdir()
    json_path, _, how = orchestrator.p4_program("auto", tmp_path / "c")
    assert json_path == tmp_path / "c" / "p4" / "mindp.json" and "compiled with" in how and len(calls) == 2


@pytest.fixture
def uncommitted_k(tree, monkeypatch) -> int:
    """This process's K is one p4src/compiled/ holds no program for (as make run K=256 sets it)."""
    k = 256
    assert k not in artifacts.COMMITTED_K
    prog = artifacts.Program(k, tree)
    monkeypatch.setattr(artifacts.P, "K", k)
    monkeypatch.setattr(artifacts, "BMV2_JSON", prog.json)
    monkeypatch.setattr(artifacts, "P4INFO", prog.p4info)
    return k


def test_make_run_at_a_k_without_a_program_or_p4c_names_the_ks_it_can_run(uncommitted_k, tmp_path):
    for mode in ("auto", "committed"):
        with pytest.raises(orchestrator.RunError) as err:
            orchestrator.p4_program(mode, tmp_path)
        msg = str(err.value)
        assert f"k{uncommitted_k}/ holds no program" in msg and "p4c is not installed" in msg and "/opt/p4tools" in msg
        assert " or ".join(f"K={k}" for k in artifacts.COMMITTED_K) in msg and "\n" not in msg


def test_make_run_committed_at_a_k_without_a_program_does_not_blame_p4c(uncommitted_k, tmp_path, monkeypatch):
    monkeypatch.setattr(artifacts, "find_p4c", lambda: "/somewhere/p4c-bm2-ss")
    with pytest.raises(orchestrator.RunError) as err:
        orchestrator.p4_program("committed", tmp_path)
    assert "not installed" not in str(err.value) and "without --p4 committed" in str(err.value)


def test_make_run_says_it_compiles_before_p4c_runs(uncommitted_k, tmp_path, monkeypatch):
    """p4c takes minutes at a large K: the run's console says so before, not after."""
    events = []

    def fake_compile(p4c, main, json_path, p4info, k=None):
        events.append("p4c")
        json_path.write_text("{}")
        p4info.write_text("")

    monkeypatch.setattr(artifacts, "find_p4c", lambda: "/somewhere/p4c-bm2-ss")
    monkeypatch.setattr(artifacts, "compile_program", fake_compile)
    _, _, how = orchestrator.p4_program("auto", tmp_path, events.append)
    assert len(events) == 2 and events[1] == "p4c" and "compiled with" in how
    assert f"compiling mindp.p4 for K = {uncommitted_k} with /somewhere/p4c-bm2-ss" in events[0]
