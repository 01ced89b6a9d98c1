"""Stop signals (Ctrl-C, SIGTERM, SIGHUP) raised where raising is safe.

Python raises a signal handler's exception at whatever bytecode the main thread has reached. Inside
gRPC's Python layer that can be just after it took a lock of the channel's, which is then never let
go: the session's stream threads block on it and closing the session waits for them for ever
(make run's Ctrl-C during a switch probe). A handler
installed by `deferred` raises at once unless the main thread is inside `shielded()` (every RPC of
the controller's), where it notes the signal and raises it as the outermost shield ends. Elsewhere
in gRPC or logging, or entering a lock, it notes the signal too, and a timer (SIGALRM) looks again
every RETRY s until the thread is out."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import NoReturn

#: Seconds between looks while a signal waits for the main thread to leave unsafe code.
RETRY = 0.05

Raiser = Callable[[int], BaseException]


def _package_dir(name: str) -> str | None:
    spec = importlib.util.find_spec(name)
    locations = spec.submodule_search_locations if spec else None
    return os.path.join(next(iter(locations)), "") if locations else None


#: Code whose locks a raised exception could leave held: gRPC's (shared with its own threads) and
#: logging's (shared with every thread that logs).
_UNSAFE_DIRS = tuple(d for d in (_package_dir("grpc"), os.path.join(os.path.dirname(logging.__file__), ""))
                     if d)


def unsafe(frame: FrameType | None) -> bool:
    """Whether raising in `frame` could leave a lock held: it or a caller runs gRPC or logging, or
    it is a lock's __enter__ (which has taken the lock but not yet entered its with-block)."""
    if frame is not None and frame.f_code.co_name == "__enter__" and frame.f_code.co_filename == threading.__file__:
        return True
    while frame is not None:
        if frame.f_code.co_filename.startswith(_UNSAFE_DIRS):
            return True
        frame = frame.f_back
    return False


class shielded:
    """`with shielded():` around code a stop signal must not cut short (a gRPC call): one that
    comes within is raised as the outermost shield ends. Other threads than the main one get no
    signals: for them it does nothing."""

    depth = 0  # the main thread's shields open

    def __enter__(self) -> shielded:
        if threading.get_ident() == threading.main_thread().ident:
            shielded.depth += 1
            self.counted = True
        else:
            self.counted = False
        return self

    def __exit__(self, *exc) -> None:
        if not self.counted:
            return
        shielded.depth -= 1
        if shielded.depth == 0 and _active is not None and _active.pending is not None:
            signum, _active.pending = _active.pending, None
            raise _active.raisers[signum](signum)  # the stop asked for wins over the call's own error


def interruptible(call):
    """A long call's answer (a gRPC future: a pipeline push, minutes on a busy machine), waited for
    in our own code rather than inside gRPC's: a stop signal may come at once, leaving none of
    gRPC's locks held, and cancels the call. Short calls are `shielded()` instead."""
    done = threading.Event()
    call.add_done_callback(lambda _: done.set())
    try:
        done.wait()
    except BaseException:
        call.cancel()
        raise
    return call.result()


class _Deferring:
    """The installed handlers' state: which exception each signal raises, and the signal waiting."""

    def __init__(self, raisers: Mapping[int, Raiser]):
        self.raisers = dict(raisers)
        self.pending: int | None = None
        self.armed = False  # whether the timer is ours to cancel

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if shielded.depth:
            self.pending = self.pending or signum  # the shield's end raises it
            return
        if unsafe(frame):
            self.pending = self.pending or signum
            signal.setitimer(signal.ITIMER_REAL, RETRY)
            self.armed = True
            return
        self.pending = None
        raise self.raisers[signum](signum)

    def retry(self, _signum: int, frame: FrameType | None) -> None:
        if self.pending is not None:
            self.handle(self.pending, frame)

    def drop(self) -> int | None:
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            self.armed = False
        pending, self.pending = self.pending, None
        return pending


_active: _Deferring | None = None


def keyboard_interrupt(_signum: int) -> BaseException:
    return KeyboardInterrupt()


#: Ctrl-C as Python raises it (KeyboardInterrupt), deferred: what a command holding a P4Runtime
#: session passes to `deferred` when only Ctrl-C stops it (mindp-ctl, the benches, tools.soak).
CTRL_C: Mapping[int, Raiser] = {signal.SIGINT: keyboard_interrupt}


@contextlib.contextmanager
def deferred(raisers: Mapping[int, Raiser]) -> Iterator[None]:
    """Within the block, each signal of `raisers` that is not ignored raises raisers[signal](signal)
    in the main thread, at the first safe point; the previous handlers come back after it. A signal
    still waiting when the block ends normally is raised then. Outside the main thread (a test's in-process call) no
    handler can be set: the block runs as it is."""
    global _active
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # An ignored signal stays ignored (nohup, a shell without job control ignoring Ctrl-C for '&')
    state = _Deferring({s: r for s, r in raisers.items() if signal.getsignal(s) is not signal.SIG_IGN})
    outer = _active
    saved = {s: signal.getsignal(s) for s in (*state.raisers, signal.SIGALRM)}
    for s in state.raisers:
        signal.signal(s, state.handle)
    signal.signal(signal.SIGALRM, state.retry)
    _active = state
    try:
        yield
    finally:
        pending = state.drop()
        for s, handler in saved.items():
            signal.signal(s, handler)
        _active = outer
    if pending is not None:
        raise state.raisers[pending](pending)


def exit_with(main: Callable[[], int | None], name: str) -> NoReturn:
    """Exit with main()'s code, run with Ctrl-C deferred (a bench or tool holding P4Runtime sessions
    in its process). A Ctrl-C ends it with one line and 130, the shell's code for SIGINT, after the
    cleanup main()'s own blocks run on the way out (testbeds, switches, controllers)."""
    try:
        with deferred(CTRL_C):
            sys.exit(main())
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        sys.exit(130)


def ignore(*signums: int) -> None:
    """Ignore `signums` from now on (a teardown a second Ctrl-C must not cut short), and drop a
    signal still waiting to be raised: the teardown is the answer to it."""
    for s in signums:
        signal.signal(s, signal.SIG_IGN)
    if _active is not None:
        _active.drop()
