"""mindp.gcpause: the collector is off while a large program loads, and left as it was found
afterwards, whatever the load did (a switch that loses its collector would grow without bound);
the switch process's program, once loaded, is out of the collector's later passes (a pass over
it held the packet loop for 0.8 s at K = 1,024), and a program replaced is collected still."""
from __future__ import annotations

import gc
import weakref

import pytest

from mindp import gcpause
from p4src import artifacts
from softswitch import compiler
from softswitch.compiler_errors import ProgramError
from softswitch.engine import Engine


@pytest.fixture(autouse=True)
def restore_gc():
    was = gc.isenabled()
    yield
    gc.unfreeze()
    (gc.enable if was else gc.disable)()


class Node:
    """A cycle only the collector frees."""

    def __init__(self):
        self.me = self


def tracked(obj) -> bool:
    """Whether the collector's passes walk obj (frozen objects are in none of its generations)."""
    return any(o is obj for o in gc.get_objects())


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


def test_settle_takes_live_objects_out_of_the_collectors_passes_and_a_dropped_cycle_back_next_time():
    node = Node()
    ref = weakref.ref(node)
    assert tracked(node)
    gcpause.settle()
    assert not tracked(node) and gc.get_freeze_count() > 0
    del node
    gc.collect()
    assert ref() is not None  # frozen: a cycle dropped after settle waits for the next one
    gcpause.settle()
    assert ref() is None


def test_the_switch_process_engine_settles_each_program_it_loads_and_the_default_engine_does_not():
    path = artifacts.program(32).json
    plain = Engine(compiler.load(path.read_bytes()))
    assert tracked(plain.program) and gc.get_freeze_count() == 0
    switch = Engine(compiler.load(path.read_bytes()), settle_gc=True)
    first = weakref.ref(switch.program)
    assert not tracked(switch.program)
    switch.load(compiler.load(path.read_bytes()))  # a controller pushes another pipeline
    assert not tracked(switch.program)
    assert first() is None  # the program it replaced was freed, its cycles too
