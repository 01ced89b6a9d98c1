"""Waiting until sockets are readable, with poll(2).

select(2), and so `select.select`, refuses a descriptor numbered 1,024 or more (FD_SETSIZE): in a
training process that holds many files (data loaders, datasets, checkpoints; a `ulimit -n` of
thousands, as containers set), the sockets opened last get such numbers, and an agent stopped
with "filedescriptor out of range in select()". poll(2) has no such bound and costs the same
(under 1 us for two sockets); every wait of the agents and harnesses goes through here."""
from __future__ import annotations

import errno
import os
import select
from typing import Sequence, TypeVar

T = TypeVar("T")
_WANT = select.POLLIN | select.POLLPRI


def readable(files: Sequence[T], timeout: float | None) -> list[T]:
    """Those of `files` (sockets, pipes: objects with fileno(), or descriptors) with something to
    read, an error or a hang-up, within `timeout` seconds (None: until one has): what
    `select.select(files, [], [], timeout)[0]` gives. A closed socket raises ValueError as select
    does, a descriptor no longer open OSError(EBADF). poll counts whole milliseconds: a timeout is
    rounded up, so a caller waiting out a sub-millisecond remainder waits, not spins."""
    p = select.poll()
    fds = []
    for f in files:
        fd = f if isinstance(f, int) else f.fileno()
        p.register(fd, _WANT)  # (ValueError for a closed socket's -1)
        fds.append(fd)
    events = dict(p.poll(millis(timeout)))
    if any(e & select.POLLNVAL for e in events.values()):
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))
    return [f for f, fd in zip(files, fds) if fd in events]


def millis(timeout: float | None) -> int | None:
    """poll's timeout for `timeout` seconds: whole milliseconds, rounded up from whole microseconds
    (a float's last bits add no millisecond: 0.1 + 0.2 s is 300 ms; 0.2 ms is 1 ms, not a spin)."""
    return None if timeout is None else -(-max(0, round(timeout * 1e6)) // 1000)
