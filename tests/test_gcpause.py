"""mindp.gcpause: the collector is off while a large program loads, and left as it was found
afterwards, whatever the load did (a switch that loses its collector would grow without bound)."""
from __future__ import annotations

import gc

import pytest

from mindp import gcpause
from softswitch import compiler
from softswitch.compiler_errors import ProgramError


@pytest.fixture(autouse=True)
def restore_gc():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_paused_turns_the_collector_off_inside_and_back_on_after():
    gc.enable()
    with gcpause.paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_paused_keeps_a_callers_own_disable():
    gc.disable()
    with gcpause.paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_paused_restores_the_collector_when_the_body_raises():
    gc.enable()
    with pytest.raises(KeyError), gcpause.paused():
        raise KeyError("x")
    assert gc.isenabled()


def test_loading_a_program_pauses_the_collector_and_restores_it_even_when_the_program_is_refused(monkeypatch):
    seen = []
    real = compiler.program._load

    def spy(*args):
        seen.append(gc.isenabled())
        return real(*args)

    monkeypatch.setattr(compiler.program, "_load", spy)
    gc.enable()
    with pytest.raises(ProgramError):
        compiler.load(b"{not json")
    with pytest.raises(ProgramError):
        compiler.load(b'{"header_types": 5}')
    assert seen == [False, False]
    assert gc.isenabled()
