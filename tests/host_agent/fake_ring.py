"""An agent socket's receive ring (mindp.rxring) over plain memory, its slots' states scripted by a
test instead of filled by the kernel."""
import numpy as np

from mindp import rxring


class FakeRing(rxring.RxRing):
    """An RxRing over plain memory: slot states scripted by the test, no socket."""

    def __init__(self, frames: int, frame: int = 128):
        self.frame, self.frames = frame, frames
        self._map(np.zeros(frames * frame, np.uint8))
        self.head = np.zeros(1, np.int64)
        self.common = []  # what each _take_run said: True, the common path took the run

    def put(self, k: int, frame: bytes, status: int = rxring.TP_STATUS_USER, tci: int = 0,
            mac: int = rxring.MAC_OFFSET) -> None:
        self.slots[k, mac : mac + len(frame)] = np.frombuffer(frame, np.uint8)
        self.lens[k] = self.snaplens[k] = len(frame)
        self.macs[k], self.tcis[k], self.status[k] = mac, tci, status

    def _take_run(self, *args) -> bool:
        self.common.append(super()._take_run(*args))
        return self.common[-1]
