"""Where numba caches this process's compiled kernels: a directory per K.

numba's on-disk cache keeps the module globals a kernel read at compile time as constants and does
not look at them again when it loads the kernel; K (mindp.protocol.K, from MINDP_K) is one of them.
A kernel compiled for one K and loaded by a process of another would read and write the wrong
number of elements, so each K gets its own cache. Call `use()` after importing numba and before
the first `@numba.njit(cache=True)` of a module runs.
"""
from __future__ import annotations

import os
import pathlib

from mindp.protocol import K


def use() -> None:
    import numba

    base = os.environ.get("NUMBA_CACHE_DIR") or str(pathlib.Path(__file__).resolve().parent / "__pycache__")
    numba.config.CACHE_DIR = os.path.join(base, f"numba-k{K}")
