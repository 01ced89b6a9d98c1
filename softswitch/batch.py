"""A batch of frames in flat buffers: what the packet loop hands a pipeline, and what it gets back.

Frames sit in fixed slots of one buffer so that the ports' receive rings fill them, `sendmmsg` and a
compiled pipeline read and write them in place, with no Python object per frame.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Bytes a slot holds: the largest frame a packet socket hands over (65535) plus a restored VLAN
#: tag, rounded up to a multiple of 8.
SLOT = 65544


@dataclass
class Batch:
    buf: np.ndarray  # uint8 [capacity, slot]: frame i is buf[i, :lens[i]]
    lens: np.ndarray  # int32 [capacity]
    ports: np.ndarray  # int32 [capacity]: ingress port (rx) or egress port (tx)
    n: int = 0  # frames held

    @classmethod
    def empty(cls, capacity: int, slot: int = SLOT) -> Batch:
        return cls(np.zeros((capacity, slot), np.uint8), np.zeros(capacity, np.int32),
                   np.zeros(capacity, np.int32))

    @property
    def capacity(self) -> int:
        return len(self.lens)

    @property
    def slot(self) -> int:
        return self.buf.shape[1]

    def frame(self, i: int) -> bytes:
        return self.buf[i, :self.lens[i]].tobytes()

    def append(self, frame: bytes, port: int) -> bool:
        """Add a frame; False (nothing added) when the batch is full or the frame too long."""
        if self.n == self.capacity or len(frame) > self.slot:
            return False
        i = self.n
        self.buf[i, :len(frame)] = np.frombuffer(frame, np.uint8)
        self.lens[i] = len(frame)
        self.ports[i] = port
        self.n = i + 1
        return True
