"""What the orchestrator tells the user: its lines, also kept in the run's logs/run.log, and the
one line that says why a run ended."""
from __future__ import annotations

import contextlib
import faulthandler
import pathlib
import signal
import sys
import time


class RunError(RuntimeError):
    """Why the run cannot go on, in one line that names the log to read."""


class Stopped(BaseException):
    """SIGTERM/SIGHUP: `make stop` or a closed terminal. Defined here, not in run.py, which runs as
    __main__: a class of its own there would not be the one its modules catch. A BaseException, as
    KeyboardInterrupt: a signal that comes during a switch probe is no switch failure."""


def one_line(text: str) -> str:
    """The last non-empty line of a message (a tool's traceback ends with its cause)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text


def how_it_ended(returncode: int) -> str:
    """'exit 3', or 'killed by SIGKILL' for a process a signal ended."""
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
    return f"exit {returncode}"


class Console:
    """stdout for the user; once the run has a directory, every line is also appended to its run.log."""

    def __init__(self) -> None:
        self.log: pathlib.Path | None = None

    def keep(self, line: str) -> None:
        """A line for the run's log only."""
        if self.log is not None:
            with contextlib.suppress(OSError), open(self.log, "a") as f:
                f.write(line + "\n")

    def say(self, msg: str = "") -> None:
        print(msg, flush=True)
        self.keep(msg.lstrip("\r"))

    def stacks_after(self, seconds: float) -> None:
        """Every thread's stack into run.log if this process is still at it `seconds` from now,
        unless stacks_cancelled() comes first (faulthandler's own thread: it dumps even while the
        main thread holds the interpreter)."""
        if self.log is not None:
            with contextlib.suppress(OSError):
                faulthandler.dump_traceback_later(seconds, file=open(self.log, "a"))  # (held until cancelled)

    @staticmethod
    def stacks_cancelled() -> None:
        faulthandler.cancel_dump_traceback_later()

    def fail(self, msg: str) -> None:
        """The one line that says why the run ended, on stderr and in the run's log."""
        print(f"\nmake run: {msg}", file=sys.stderr, flush=True)
        self.keep(f"make run: {msg}")


def duration(seconds: float) -> str:
    """'42 s', '6 min 5 s', '2 h 3 min'."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def pace(done: int, total: int, seconds: float) -> str:
    """'step 300/1500, 3.12 steps/s, 6 min 25 s left' (no rate before the first step is done)."""
    if done <= 0 or seconds <= 0:
        return f"step {done}/{total}"
    rate = done / seconds
    return f"step {done}/{total}, {rate:.3g} steps/s, {duration((total - done) / rate)} left"


class ProgressLine:
    """The live progress line: redrawn in place on a terminal; elsewhere (a log, a pipe) printed at
    most every `every` s when the step moved on, and once more at the end if its text changed since
    (a log's last lines may bring the last loss)."""

    def __init__(self, console: Console, indent: str = "", every: float = 5.0, tty: bool | None = None):
        self.console, self.indent, self.every = console, indent, every
        self.tty = sys.stdout.isatty() if tty is None else tty
        self.step: int | None = None
        self.text: str | None = None
        self.at: float | None = None

    def show(self, step: int, text: str) -> None:
        if self.tty:
            print("\r" + self.indent + text + "\x1b[K", end="", flush=True)
        elif step != self.step and (self.at is None or time.monotonic() - self.at >= self.every):
            self.console.say(self.indent + text)
            self.step, self.text, self.at = step, text, time.monotonic()

    def end(self, text: str) -> None:
        if self.tty:
            self.console.say("\r" + self.indent + text + "\x1b[K")
        elif text != self.text:
            self.console.say(self.indent + text)


class Pace:
    """A long phase's steps on a ProgressLine (the check's reference trainer: about as long as the
    training it checks): called with the steps done; end() says how long the whole took."""

    def __init__(self, console: Console, what: str, total: int, indent: str = "    ", header: str = ""):
        self.bar = ProgressLine(console, indent=indent)
        self.console, self.what, self.total, self.header = console, what, total, header
        self.done, self.t0 = 0, time.monotonic()

    def __call__(self, done: int) -> None:
        if self.header and not self.done:  # (said once the phase is known to run)
            self.console.say(self.header)
        self.done = done
        self.bar.show(done, f"{self.what} {pace(done, self.total, time.monotonic() - self.t0)}")

    def end(self) -> None:
        self.bar.end(f"{self.what}: {self.done} step(s) in {duration(time.monotonic() - self.t0)}")
