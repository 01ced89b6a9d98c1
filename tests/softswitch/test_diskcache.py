"""The switch's start-up cache (softswitch.diskcache): a second start of the same JSON by the same code
checks, generates and compiles nothing and runs the same program; a changed JSON or drop port, a
damaged entry or a cache that cannot be written costs time, never a wrong program or a failed start."""
from __future__ import annotations

import os

import numpy as np
import pytest

from mindp.protocol import HARDWARE_K
from p4src import artifacts
from softswitch import compiler, diskcache
from softswitch.compiler import ProgramBuilder, runtime, shape
from softswitch.engine import Engine
from softswitch.native import build, cprogram

from . import compiled
from .both_paths import assert_same, generic_seeds, mutations

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C compiler")
NAME = "exprs"


def _forbid_recomputing(monkeypatch, tmp_path) -> None:
    def recomputed(*_args, **_kwargs):
        raise AssertionError("recomputed on a cached start")
    monkeypatch.setattr(shape, "check", recomputed)
    monkeypatch.setattr(ProgramBuilder, "emit_program", recomputed)
    monkeypatch.setattr(cprogram, "generate", recomputed)
    monkeypatch.setattr(runtime, "compile", recomputed, raising=False)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))


def _entries(tmp_path, suffix: str) -> list:
    return sorted((tmp_path / "mindp" / "softswitch").glob(f"*{suffix}"))


def test_a_second_start_recomputes_nothing_and_runs_the_same_program(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    data = compiled.json_path(NAME).read_bytes()
    first = Engine(compiler.load(data), "compiled")
    assert first.native is not None
    assert len(_entries(tmp_path, ".pysrc")) == len(_entries(tmp_path, ".program")) == 1
    with monkeypatch.context() as m:
        _forbid_recomputing(m, tmp_path)
        cached = Engine(compiler.load(data), "compiled")
    assert cached.native is not None and cached.program.source == first.program.source
    rng = np.random.default_rng(7)
    out = assert_same(cached, Engine(compiler.load(data), "python"), mutations(rng, generic_seeds(rng), 1500))
    assert out, "some frames are forwarded"


def test_another_json_or_drop_port_is_another_entry(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    text = compiled.json_path(NAME).read_text()
    compiler.load(text)
    compiler.load(text, drop_port=510)
    compiler.load(text + "\n")
    assert len(_entries(tmp_path, ".pysrc")) == 3
    assert compiler.load(text, drop_port=510).drop_port == 510


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_a_damaged_entry_is_recomputed_and_replaced(monkeypatch, tmp_path, damage):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    data = compiled.json_path(NAME).read_bytes()
    want = Engine(compiler.load(data), "compiled").program.source
    entries = _entries(tmp_path, ".pysrc") + _entries(tmp_path, ".pycode") + _entries(tmp_path, ".program")
    good = {path: path.read_bytes() for path in entries}
    for path, stored in good.items():
        if damage == "flip":
            path.write_bytes(stored[:-1] + bytes([stored[-1] ^ 1]))
        elif damage == "truncate":
            path.write_bytes(stored[: len(stored) // 2])
        else:
            path.write_bytes(b"")
        assert diskcache.read(path.name) is None
    again = Engine(compiler.load(data), "compiled")
    assert again.native is not None and again.program.source == want
    assert {path: path.read_bytes() for path in entries} == good, "each entry written again, whole"


def test_a_cache_that_cannot_be_written_costs_only_time(monkeypatch, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    data = compiled.json_path(NAME).read_bytes()
    assert compiler.load(data).source == compiler.load(data).source
    assert blocker.read_text() == ""


def test_the_cache_keeps_to_its_budget_removing_the_least_recently_used(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    directory = tmp_path / "mindp" / "softswitch"
    for i in range(4):
        diskcache.write(f"{i}.entry", bytes(1000))
        os.utime(directory / f"{i}.entry", (i, i))  # written in the order 0, 1, 2, 3
    assert diskcache.read("0.entry") == bytes(1000)  # used now: the latest
    (directory / ".tmp-under-way").write_bytes(bytes(5000))  # another start's write
    monkeypatch.setattr(diskcache, "BUDGET", 3200)  # three entries and their digests
    diskcache.write("4.entry", bytes(1000))
    assert sorted(p.name for p in directory.iterdir()) == [".tmp-under-way", "0.entry", "3.entry", "4.entry"]


@pytest.mark.parametrize("path", [compiled.json_path(n) for n in compiled.NAMES] + [artifacts.program(HARDWARE_K).json],
                         ids=lambda p: p.parent.name + "/" + p.stem)
def test_the_c_of_a_program_from_the_cache_is_the_c_of_one_generated(monkeypatch, tmp_path, path):
    """A start with the program's Python source cached but not its object (another CPU, other flags)
    generates C from the analysis alone: the same C as from a program generated in full."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    data = path.read_bytes()
    generated, cached = compiler.load(data), compiler.load(data)
    assert generated.analysis.lines and not cached.analysis.lines, "the second load took the cached source"
    assert cprogram.generate(cached) == cprogram.generate(generated)
