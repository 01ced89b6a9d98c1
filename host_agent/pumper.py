"""A worker's step pumped from a thread of its own while backward runs.

A step's window lets chunk c + S (S the job's slots) leave only once chunk c's parameters came
back, and pumps made only from put() (each backward hook) took answers and sent the next chunks
only between two hooks: when a 25.5M-parameter gpt's backward ended, 83 % of its 49,834 chunks
had not left, and sending them after backward was a seventh of each step. The `Pumper` thread
waits on the socket while the caller computes (poll releases the GIL), takes the answers as
they come and sends each slot's next chunk at once, from StepHandle.start to wait(); wait()
parks it and pumps the rest itself, as before.

One lock orders the thread's pumps and put()'s marking of ready chunks: put() writes a chunk's
gradient into its frame before marking it ready, and the thread sends only ready chunks.
"""
from __future__ import annotations

import os
import threading
import time

from mindp import threadname
from mindp.readable import readable


class Pumper:
    """Pumps the followed StepHandle (its pump(0.0)) whenever frames arrive, put() nudges, or a
    timer of its window is due."""

    def __init__(self, sock, coalesce: float, coalesce_min: int):
        """coalesce / coalesce_min: as WorkerConfig's (coalesce 0: off)."""
        self.sock = sock
        self.coalesce = coalesce
        self.coalesce_min = coalesce_min
        self.lock = threading.RLock()  # held by whoever pumps the step, and by put() marking chunks ready
        self._cv = threading.Condition()
        self._handle = None  # the StepHandle pumped; None: parked
        self._closed = False
        self.error: BaseException | None = None  # raised by a pump in the thread, raised again by park()
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._thread = threadname.Thread(target=self._run, name="mindp-pump", daemon=True)
        self._thread.start()

    def follow(self, handle) -> None:
        """Pump `handle` from now on."""
        with self._cv:
            self._handle = handle
            self._cv.notify()

    def nudge(self) -> None:
        """Chunks became ready: pump now, not at the next frame or timer."""
        try:
            os.write(self._w, b"x")
        except BlockingIOError:  # (nudges already pending)
            pass

    def park(self) -> None:
        """Stop pumping; returns once no pump of the thread runs. A pump's error is raised here."""
        with self._cv:
            self._handle = None
        self.nudge()
        with self.lock:  # a pump under way ends first; the thread then finds no handle
            pass
        if self.error is not None:
            err, self.error = self.error, None
            raise err

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._handle = None
            self._cv.notify()
        self.nudge()
        self._thread.join()
        os.close(self._r)
        os.close(self._w)

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._handle is None and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                h = self._handle
            with self.lock:
                w = h.window
                timeout = max(0.0, min(w.wake_at() - time.monotonic(), 0.05))
                busy = w.n_sent - w.n_done >= self.coalesce_min
            try:
                ready = readable([self.sock, self._r], timeout)
            except (ValueError, OSError) as exc:  # the caller closed the socket under a step it left
                with self._cv:
                    self.error, self._handle = exc, None
                continue
            nudged = self._r in ready
            if nudged:
                try:
                    os.read(self._r, 4096)
                except BlockingIOError:
                    pass
            # Woken by a stream of answers: one pump takes a batch of them. A nudge (chunks ready
            # to leave) or a timer pumps at once.
            if busy and not nudged and ready and self.coalesce > 0:
                time.sleep(self.coalesce)
            with self.lock:
                if self._handle is not h:
                    continue
                try:
                    h.pump(0.0)
                except BaseException as exc:  # told by park(), in the caller's thread
                    self.error = exc
                    with self._cv:
                        self._handle = None
