"""The process's heap, through glibc's malloc: a training process keeps the memory a step frees for
the next step (keep_freed); a long-lived one gives it back after a rare large burst (release_free).

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

_LIBC = ctypes.CDLL(None)
#: None where the C library has none (malloc_trim: musl, macOS; mallopt: macOS): nothing changes there.
_MALLOPT, _MALLOC_TRIM = getattr(_LIBC, "mallopt", None), getattr(_LIBC, "malloc_trim", None)


def keep_freed() -> bool:
    """Set this process's malloc to keep freed memory (above); False where the C library has no
    mallopt or refuses it (musl's does nothing): its default stays."""
    if _MALLOPT is None:
        return False
    return bool(_MALLOPT(M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and bool(_MALLOPT(M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def release_free() -> None:
    """Give the heap's free pages back to the OS (the controller, after a pipeline push). A push
    allocates and frees a few buffers of the program's size (10.7 MB at K = 512: its bytes, the
    request, its serialised copy). The first are mmapped and unmapped, which raises glibc's dynamic
    mmap threshold to their size and its trim threshold to twice that; from then on such buffers come
    from the heap, and the 20 MB they leave free at its top stay below the trim threshold, so they stay
    resident (make soak's controller: +18.6 % after a switch restore). Measured at K = 512: 58 MB, then
    71 and 82 MB after two pushes (10, then 20 MB free at the top); with this trim 60-63 MB. A fixed
    M_MMAP_THRESHOLD does as well, but for the whole process (numpy's arrays too); one call after a
    rare push suffices."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
