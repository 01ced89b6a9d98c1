"""A batch of frames in flat buffers: what the packet loop hands a pipeline, and what it gets back.

Frames sit in fixed slots of one buffer so that the ports' receive rings fill them, `sendmmsg` and a
compiled pipeline read and write them in place, with no Python object per frame.
"""
from __future__ import annotations

import mmap
from dataclasses import dataclass

import numpy as np

#: Bytes a slot holds: the largest frame a packet socket hands over (65535) plus a restored VLAN
#: tag, rounded up to a multiple of 8.
SLOT = 65544
HUGE_PAGE = 2 << 20


def zeroed(shape: tuple[int, ...], dtype) -> np.ndarray:
    """np.zeros(shape, dtype), on transparent huge pages where the buffer spans one or more: an
    anonymous mapping, 2 MiB-aligned, advised (MADV_HUGEPAGE) before its first touch. A batch's
    slots lie 64 KiB apart, each frame in pages of its own; with 4 KiB pages every frame the
    pipeline reads or writes costs TLB misses. Where the kernel ignores the advice (no THP, mode
    `never`), the mapping is ordinary pages."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    if nbytes < HUGE_PAGE:
        return np.zeros(shape, dtype)
    span = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
    area = mmap.mmap(-1, span + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = np.frombuffer(area, np.uint8)
    start = -whole.ctypes.data % HUGE_PAGE
    try:
        area.madvise(mmap.MADV_HUGEPAGE, start, span)
    except (AttributeError, OSError):  # a hint: ordinary pages do
        pass
    return whole[start:start + nbytes].view(dtype).reshape(shape)


@dataclass
class Batch:
    buf: np.ndarray  # uint8 [capacity, slot]: frame i is buf[i, :lens[i]]
    lens: np.ndarray  # int32 [capacity]
    ports: np.ndarray  # int32 [capacity]: ingress port (rx) or egress port (tx)
    n: int = 0  # frames held

    @classmethod
    def empty(cls, capacity: int, slot: int = SLOT) -> Batch:
        return cls(zeroed((capacity, slot), np.uint8), np.zeros(capacity, np.int32),
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
