"""mindp.interrupts: a stop signal is raised in the main thread only where raising leaves no lock
held. A Ctrl-C raised inside gRPC's Python layer once left a channel lock taken, and make run's
teardown then waited for ever on the session's stream (CI, test_make_run_resume)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from concurrent import futures

import grpc
import pytest

from mindp import interrupts

SIG = signal.SIGUSR1  # a pytest-xdist worker ignores SIGINT: these tests use a signal of their own


class Stop(BaseException):
    pass


RAISERS = {SIG: lambda signum: Stop(signum)}


def wait_for_stop() -> None:
    """Sleeps until the deferred signal is raised (a hang guard of 60 s, far above RETRY)."""
    for _ in range(6000):
        time.sleep(0.01)
    pytest.fail("the deferred signal was never raised")


@pytest.fixture
def echo():
    server = grpc.server(futures.ThreadPoolExecutor(2))
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", {"Echo": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield channel
    channel.close()
    server.stop(None)


def test_a_signal_inside_a_grpc_call_is_raised_once_the_call_has_returned(echo):
    arrived = []

    def deserialize(data: bytes) -> bytes:  # gRPC runs it in the calling thread, inside its call
        signal.raise_signal(SIG)
        arrived.append(True)
        return data

    call = echo.unary_unary("/t.T/Echo", response_deserializer=deserialize)
    answers = []
    with pytest.raises(Stop), interrupts.deferred(RAISERS):
        answers.append(call(b"x", timeout=60))
        wait_for_stop()
    assert arrived and answers == [b"x"]  # the call ran to its end with the signal waiting
    # nothing of the channel is left held: it still answers, then closes
    assert echo.unary_unary("/t.T/Echo")(b"y", timeout=60) == b"y"


def test_a_signal_outside_grpc_is_raised_at_once():
    reached = []
    with pytest.raises(Stop), interrupts.deferred(RAISERS):
        signal.raise_signal(SIG)
        reached.append(True)
    assert not reached


def test_the_previous_handlers_come_back_after_the_block():
    before = signal.getsignal(SIG), signal.getsignal(signal.SIGALRM)
    with interrupts.deferred(RAISERS):
        assert signal.getsignal(SIG) is not before[0]
    assert (signal.getsignal(SIG), signal.getsignal(signal.SIGALRM)) == before


def test_an_ignored_signal_stays_ignored():
    saved = signal.signal(SIG, signal.SIG_IGN)
    try:
        with interrupts.deferred(RAISERS):
            signal.raise_signal(SIG)
            assert signal.getsignal(SIG) is signal.SIG_IGN
    finally:
        signal.signal(SIG, saved)


def test_a_signal_still_waiting_when_the_block_ends_is_raised_then(echo):
    call = echo.unary_unary("/t.T/Echo", response_deserializer=lambda d: signal.raise_signal(SIG) or d)
    answers = []
    with pytest.raises(Stop), interrupts.deferred(RAISERS):
        answers.append(call(b"x", timeout=60))  # the block ends before the timer comes round
    assert answers == [b"x"]


def test_ignore_drops_a_waiting_signal(echo):
    call = echo.unary_unary("/t.T/Echo", response_deserializer=lambda d: signal.raise_signal(SIG) or d)
    with interrupts.deferred(RAISERS):
        call(b"x", timeout=60)
        interrupts.ignore(SIG)  # a teardown: the answer to the signal already under way
        time.sleep(5 * interrupts.RETRY)  # the timer, had it been left, would have raised by now


def test_a_lock_being_entered_is_unsafe_and_plain_code_is_not():
    seen = {}

    class Lock:
        acquire = release = None  # Condition() takes these; only __enter__ is used here

        def __enter__(self):
            seen["frame"] = sys._getframe(1)  # threading.Condition.__enter__'s frame
            return self

        def __exit__(self, *exc):
            return False

    with threading.Condition(Lock()):
        pass
    assert interrupts.unsafe(seen["frame"])
    assert not interrupts.unsafe(sys._getframe())


def test_outside_the_main_thread_the_block_only_runs():
    ran = []

    def body():
        with interrupts.deferred(RAISERS):
            ran.append(signal.getsignal(SIG))

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert ran == [signal.getsignal(SIG)]


def test_a_signal_within_a_shield_is_raised_as_the_outermost_shield_ends():
    reached = []
    with pytest.raises(Stop), interrupts.deferred(RAISERS):
        with interrupts.shielded():
            with interrupts.shielded():
                signal.raise_signal(SIG)
                reached.append("inner")
            reached.append("outer")  # the inner shield's end is not the outermost
        reached.append("after")
    assert reached == ["inner", "outer"]


def test_a_long_call_waited_for_interruptibly_stops_at_once_and_is_cancelled(echo):
    """interrupts.interruptible (a pipeline push): the stop comes while the switch is still
    working, the call is cancelled, and the channel is left usable."""
    entered, cancelled = threading.Event(), threading.Event()

    def slow(request, context):
        entered.set()
        while context.is_active():
            time.sleep(0.01)
        cancelled.set()
        return request

    server = grpc.server(futures.ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "t.Slow", {"Push": grpc.unary_unary_rpc_method_handler(slow)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    main = threading.main_thread().ident

    def stop_once_entered():
        entered.wait()
        signal.pthread_kill(main, SIG)

    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            threading.Thread(target=stop_once_entered, daemon=True).start()
            with pytest.raises(Stop), interrupts.deferred(RAISERS):
                interrupts.interruptible(channel.unary_unary("/t.Slow/Push").future(b"x", timeout=600))
            assert cancelled.wait(60)
            assert echo.unary_unary("/t.T/Echo")(b"y", timeout=60) == b"y"
    finally:
        server.stop(None)


def test_every_rpc_of_the_controller_is_shielded_or_interruptible():
    """A stop signal must never be raised inside gRPC: each call on a P4Runtime stub in
    controller/ is made within `interrupts.shielded()` or waited for by `interruptible`."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1] / "controller"
    bare = []
    for path in sorted(root.glob("*.py")):
        tree = ast.parse(path.read_text())
        guarded: set[int] = set()
        for node in ast.walk(tree):
            shield = isinstance(node, ast.With) and any("shielded" in ast.unparse(i.context_expr) for i in node.items)
            waited = isinstance(node, ast.Call) and ast.unparse(node.func) == "interrupts.interruptible"
            if shield or waited:
                guarded.update(id(n) for n in ast.walk(node))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ".stub." in f".{ast.unparse(node.func)}" and id(node) not in guarded:
                bare.append(f"{path.name}:{node.lineno} {ast.unparse(node.func)}")
    assert bare == []


def test_every_command_holding_a_p4runtime_session_defers_ctrl_c():
    """A bench or tool that opens P4Runtime sessions in its own process (a controller, a switch
    connection, a testbed of trees) runs them within `interrupts.deferred`: its Ctrl-C must not
    land inside gRPC either."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    sessions = ("Controller(", "SwitchConnection(", "treebed")
    scripts = [p for d in ("bench", "tools") for p in sorted((root / d).glob("*.py"))
               if any(s in p.read_text() for s in sessions)]
    assert len(scripts) >= 5  # bench/softswitch, bench/dataplane, bench/scale, tools/soak, tools/stress_ctl
    calls = ("interrupts.deferred(", "interrupts.exit_with(")
    assert [p.name for p in scripts if not any(c in p.read_text() for c in calls)] == []


def test_exit_with_exits_with_mains_code_and_130_after_a_ctrl_c(capsys):
    with pytest.raises(SystemExit) as done:
        interrupts.exit_with(lambda: 3, "bench/x.py")
    assert done.value.code == 3 and capsys.readouterr().err == ""

    def stopped():
        os.kill(os.getpid(), signal.SIGINT)  # as a Ctrl-C in the terminal
        time.sleep(5)  # the deferred handler raises here, at once

    # A suite started in the background by a shell without job control (`make test &` in a script)
    # inherits SIGINT ignored, which exit_with rightly keeps ignored: Ctrl-C as a terminal's shell
    # leaves it is what this test is about.
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(SystemExit) as done:
            interrupts.exit_with(stopped, "bench/x.py")
    finally:
        signal.signal(signal.SIGINT, saved)
    assert done.value.code == 130 and capsys.readouterr().err == "bench/x.py: interrupted\n"
