"""An agent (mindp-worker or mindp-optimizer) with small socket buffers, for make stress:

    python -m tools.stress_sockbuf BYTES host_agent.worker ARGS...

The agents ask 16 MiB of receive buffer (root's SO_RCVBUFFORCE) and receive through a PACKET_MMAP
ring that has its own; a network namespace cannot lower net.core.rmem_max/wmem_max (the kernel
keeps them global). So this runs the agent's module with its raw sockets' SO_RCVBUF and SO_SNDBUF
set to BYTES once rawsock has prepared them, and no receive ring: bursts beyond a few frames are
dropped by the kernel on receive and refused (EAGAIN, counted as lost) on send, as on a host
whose buffers are small.
"""
from __future__ import annotations

import runpy
import socket
import sys


def shrink(size: int) -> None:
    """Every raw socket rawsock prepares from now on gets `size` bytes of buffers and no ring."""
    from host_agent import rawsock

    prepare = rawsock.prepare

    def small(s: socket.socket) -> None:
        prepare(s)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)

    rawsock.RING = False
    rawsock.prepare = small


def main() -> None:
    if len(sys.argv) < 3 or not sys.argv[1].isdigit():
        sys.exit("usage: python -m tools.stress_sockbuf BYTES MODULE [ARGS...]")
    shrink(int(sys.argv[1]))
    module = sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
