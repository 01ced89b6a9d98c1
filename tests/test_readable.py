"""mindp.readable: select's readable list through poll(2), which takes any descriptor number."""
import fcntl
import os
import socket

import pytest

from mindp.readable import millis, readable


def pair_numbered_from(low: int):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    out = []
    for s in (a, b):
        out.append(socket.socket(s.family, s.type, fileno=fcntl.fcntl(s.fileno(), fcntl.F_DUPFD_CLOEXEC, low)))
        s.close()
    return out


@pytest.mark.parametrize("low", [3, 1024, 4000])
def test_gives_the_readable_ones_at_any_descriptor_number(low):
    a, b = pair_numbered_from(low)
    c, d = pair_numbered_from(low)
    try:
        assert a.fileno() >= low
        assert readable([a, c], 0) == []
        d.send(b"x")
        assert readable([a, c], None) == [c]
        b.send(b"y")
        assert readable([a, c], 0) == [a, c]
        assert readable([c.fileno()], 0) == [c.fileno()]  # a bare descriptor as well
    finally:
        for s in (a, b, c, d):
            s.close()


def test_a_hang_up_is_readable_as_select_has_it():
    r, w = os.pipe()
    try:
        assert readable([r], 0) == []
        os.close(w)
        assert readable([r], 0) == [r]  # a read now returns the end of the file, not a wait
    finally:
        os.close(r)


def test_closed_sockets_and_descriptors_raise_as_select_does():
    a, b = socket.socketpair()
    a.close()
    with pytest.raises(ValueError):
        readable([a], 0)
    fd = b.fileno()
    b.close()
    with pytest.raises(OSError):
        readable([fd], 0)


@pytest.mark.parametrize("seconds,ms", [(None, None), (0, 0), (-0.5, 0), (0.0002, 1), (0.001, 1), (0.0011, 2),
                                        (0.05, 50), (0.1 + 0.2, 300), (1.0, 1000), (2.5e-7, 0)])
def test_timeouts_become_whole_milliseconds_rounded_up(seconds, ms):
    """Rounded up: a caller waiting out a 0.2 ms remainder waits 1 ms rather than spinning; 0.1 + 0.2
    s stays 300 ms (its float times 1000 is 300.00000000000006)."""
    assert millis(seconds) == ms
