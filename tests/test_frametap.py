"""testbed.FrameTap's waits on real veths: a reflector on the switch side of the host's veth stands in
for a switch, so the tests control exactly which frames come back and when."""
import select
import time

import pytest

from mindp import progress

from mindp.harness import testbed
from mindp.topology import Host

FRAME = b"\xff" * 6 + bytes.fromhex("020000000101") + b"\x88\xb5" + b"tap".ljust(50, b"\0")


@pytest.fixture
def tap_and_switch_side():
    with testbed.Testbed("tap") as bed:
        bed.add(Host("h1", "02:00:00:00:01:01", "10.9.1.1", 1))
        tap = testbed.FrameTap(bed)
        outer = testbed.raw_socket(bed.hosts["h1"].switch_iface)
        try:
            yield tap, outer
        finally:
            tap.close()
            outer.close()


def receive_sent(outer) -> bytes:
    """The tap's frame as the switch side sees it (the host's kernel may send its own too)."""
    while True:
        assert select.select([outer], [], [], progress.STALL)[0], "the tap's frame never crossed the veth"
        frame = outer.recv(2048)
        if frame == FRAME:
            return frame


@pytest.mark.net
def test_the_quiet_period_follows_how_long_exchanges_take(tap_and_switch_side):
    """Before any exchange the caller's grace; after one the switch answered slowly (the reflector
    waits 0.05 s), ten times that, up to the caller's grace."""
    tap, outer = tap_and_switch_side
    assert tap.quiet_period(7.0) == 7.0
    tap.send("h1", FRAME)
    echo = receive_sent(outer)
    time.sleep(0.05)
    outer.send(echo)
    assert tap.collect(1)["h1"] == [FRAME]
    assert tap.quiet_period(7.0) >= tap.GRACE_FACTOR * 0.05
    assert tap.quiet_period(0.2) == 0.2


@pytest.mark.net
def test_a_collect_that_expects_nothing_waits_its_whole_grace(tap_and_switch_side):
    """Nothing arriving does not show that a switch processed what was sent: however fast the last
    exchanges were, such a check waits the caller's grace (tests read counters right after)."""
    tap, outer = tap_and_switch_side
    tap.send("h1", FRAME)
    outer.send(receive_sent(outer))
    tap.collect(1)
    start = time.monotonic()
    assert not any(tap.collect(0, grace=0.3).values())
    assert time.monotonic() - start >= 0.3
