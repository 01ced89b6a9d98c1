"""Threads named as the OS sees them, so that `top -H`, `ps -L`, perf, py-spy and
/proc/PID/task/TID/comm tell mindp's threads apart: before Python 3.14 every thread of a process
carries the process's name there, whatever threading.Thread(name=...) says."""
from __future__ import annotations

import ctypes
import sys
import threading

PR_SET_NAME = 15
NAME_MAX = 15  # bytes the kernel keeps (16 with the terminating NUL)
PREFIX = "mindp-"  # of every thread mindp names (bench/torch_gpt.py reports their CPU apart)


def name_os_thread(name: str) -> None:
    """Give the calling thread `name` (its first NAME_MAX bytes) where the OS has thread names
    (Linux); elsewhere, or if the call fails, nothing changes: a name is only a debugging aid."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:NAME_MAX]), 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Thread(threading.Thread):
    """A threading.Thread whose OS thread takes its name as it starts."""

    def run(self) -> None:
        name_os_thread(self.name)
        super().run()
