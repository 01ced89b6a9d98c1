"""A training process keeps the heap memory a step frees for the next step.

A training step frees its activations and gradients and allocates them again the next step. glibc
gives freed memory at the top of its heap back to the kernel once it exceeds M_TRIM_THRESHOLD (128
KiB, rising with the blocks it sees to 64 MiB), and the kernel zeroes every page again on its first
touch: a mindp worker training the 1.3M-parameter gpt took 1,500-2,500 page faults a step (a DDP
rank of the same model about 70), its forward and backward paying for them and for the caches the
zeroing evicts. Trimming only past 2 GiB keeps that memory in the process, as jemalloc or tcmalloc
would; blocks up to 32 MiB come from the heap (glibc's bound: larger ones are still mapped and
unmapped each time).
"""
from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int
MMAP_THRESHOLD = 32 << 20  # the largest glibc accepts (HEAP_MAX_SIZE / 2 on 64-bit)

_MALLOPT = getattr(ctypes.CDLL(None), "mallopt", None)  # None where the C library has none (macOS)


def keep_freed() -> bool:
    """Set this process's malloc to keep freed memory (above); False where the C library has no
    mallopt or refuses it (musl's does nothing): its default stays."""
    if _MALLOPT is None:
        return False
    return bool(_MALLOPT(M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and bool(_MALLOPT(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
