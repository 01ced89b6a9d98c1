"""The cyclic garbage collector paused while a large tree of objects is built, and kept off it once built.

A BMv2 JSON is 16 MB at K = 1,024: parsing it and building the switch's program from it allocate
about 400,000 dicts and lists, none of them garbage, and the collector ran again and again over the
growing tree meanwhile (json.loads of that program: 0.7 s, 0.14 s paused; the whole load 0.8 s,
0.2 s paused)."""
from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def paused():
    """The collector off inside, then as it was found (a caller's own gc.disable() is kept)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def settle() -> None:
    """Collect once, then leave every object alive now out of the collector's later passes
    (gc.freeze): a process that keeps a large tree for good (the switch's program: about a million
    objects at K = 1,024) would otherwise have the collector walk all of it each time enough new
    objects survive, a pass of 0.8 s here that held the packet loop and cost a step a second of
    timeouts. A tree dropped later (a program replaced) is freed by its reference counts; the next
    settle() takes it back into the collector first, so its cycles are collected then."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
