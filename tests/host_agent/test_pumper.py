"""The streaming thread's receive coalescing (host_agent.pumper): it waits `coalesce` before a pump
only when woken by frames while many chunks are in flight; a put's nudge pumps at once, and
coalesce 0 never waits."""
import pathlib
import socket
import threading
import time

import pytest

from host_agent.pumper import Pumper
from mindp import progress


class Window:
    def __init__(self, in_flight: int):
        self.n_sent, self.n_done = in_flight, 0

    def wake_at(self) -> float:
        return time.monotonic() + 3600.0  # no timer: only frames and nudges wake the thread


class Handle:
    """A StepHandle's face to the thread: counts its pumps, reads what the socket holds."""

    def __init__(self, sock, in_flight: int):
        self.sock = sock
        self.window = Window(in_flight)
        self.pumps = 0

    def pump(self, timeout: float) -> None:
        self.pumps += 1
        try:
            while True:
                self.sock.recv(64)
        except BlockingIOError:
            pass


@pytest.fixture
def pumper_run(monkeypatch):
    slept = []
    real_sleep = time.sleep

    def sleep(s):
        if threading.current_thread().name == "mindp-pump":
            slept.append(s)
        real_sleep(s)

    monkeypatch.setattr(time, "sleep", sleep)
    made = []

    def run(coalesce: float, in_flight: int, wake) -> tuple[int, list[float]]:
        """One wake-up of a followed handle by `wake` ('frame' or 'nudge'); (pumps, sleeps)."""
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        a.setblocking(False)
        p = Pumper(a, coalesce, coalesce_min=256)
        made.append((p, a, b))
        h = Handle(a, in_flight)
        p.follow(h)
        if wake == "frame":
            b.send(b"param")
        else:
            p.nudge()
        progress.wait(lambda: h.pumps >= 1, lambda: h.pumps, stall=30, what="the thread's pump")
        p.park()
        return h.pumps, list(slept)

    yield run
    for p, a, b in made:
        p.close()
        a.close()
        b.close()


@pytest.mark.parametrize("coalesce, in_flight, wake, waits", [
    (0.002, 300, "frame", True),  # a stream of answers: one pump takes a batch
    (0.002, 300, "nudge", False),  # chunks became ready: they leave now
    (0.002, 10, "frame", False),  # few in flight: the last answers are read at once
    (0.0, 300, "frame", False),  # coalescing off
])
def test_the_streaming_thread_waits_only_for_a_stream_of_answers(pumper_run, coalesce, in_flight, wake, waits):
    pumps, slept = pumper_run(coalesce, in_flight, wake)
    assert pumps >= 1
    assert slept == ([coalesce] if waits else [])


def test_the_streaming_thread_is_named_to_the_os():
    """top -H, perf and bench/torch_gpt.py tell the pump thread from the worker's main thread."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.setblocking(False)
    p = Pumper(a, 0.0, coalesce_min=256)
    try:
        h = Handle(a, 0)
        p.follow(h)
        p.nudge()
        progress.wait(lambda: h.pumps >= 1, lambda: h.pumps, stall=30, what="the thread's pump")  # it runs: named
        assert pathlib.Path(f"/proc/self/task/{p._thread.native_id}/comm").read_text() == "mindp-pump\n"
    finally:
        p.close()
        a.close()
        b.close()


def test_a_socket_closed_under_a_followed_step_parks_the_thread_and_is_told_by_park():
    """A caller that abandons a step and closes its socket (a test's worker killed, an agent torn
    down): the thread's wait on the socket fails; it stops pumping, raises nothing in its own thread
    (no 'exception in thread' warning) and park() reports why; close() still ends it."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.setblocking(False)
    p = Pumper(a, 0.0, coalesce_min=256)
    raised = []
    threading.excepthook, hook = (lambda args: raised.append(args.exc_value)), threading.excepthook
    try:
        h = Handle(a, 0)
        p.follow(h)
        a.close()
        p.nudge()
        progress.wait(lambda: p.error is not None, lambda: h.pumps, stall=30, what="the thread's failed wait")
        assert p._thread.is_alive() and p._handle is None
        with pytest.raises((ValueError, OSError)):
            p.park()
        p.close()
        assert not p._thread.is_alive() and raised == []
    finally:
        threading.excepthook = hook
        b.close()
