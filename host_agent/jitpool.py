"""numba's thread pool for the node's update kernel: a batch too small to be worth waking the
pool's threads runs on the calling thread alone (fused.SERIAL_BELOW), and the pool's size is set
and given back around it.

`swap_threads` does that from compiled code, by the pool's own C entry points as numba's parfors
call them (named symbols, so a caller stays in numba's disk cache; numba.set_num_threads in
compiled code is a ctypes pointer, which keeps it out). From Python, `threads_for` (numba's own
calls, ~10 us a batch, a third of a node batch's overhead before).
"""
from __future__ import annotations

import contextlib

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_started = False


def start() -> None:
    """The pool started, its entry points known to the linker: before a first call of a compiled
    function using swap_threads."""
    global _started
    if not _started:
        numba.get_num_threads()
        _started = True


@intrinsic
def swap_threads(typingctx, n):
    """Set the calling thread's share of the pool to n threads; returns the share before."""
    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        get = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32, []), "get_num_threads")
        put = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i32]),
                                             "set_num_threads")
        was = builder.call(get, [])
        builder.call(put, [builder.trunc(args[0], i32)])
        return builder.sext(was, ir.IntType(64))
    return types.int64(n), codegen


@contextlib.contextmanager
def threads_for(records: int, serial_below: int):
    """The pool's threads for a batch of `records`: all of them, or (below serial_below) the
    calling thread alone."""
    if records >= serial_below:
        yield
        return
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(threads)
