"""Host-side socket helpers shared by the agents and the testbed."""
from __future__ import annotations

import socket

from .protocol import UDP_PORT


def hold_udp_port(port: int = UDP_PORT) -> socket.socket:
    """A UDP socket bound to mindp's port in the current network namespace.

    mindp frames are read on raw sockets; without a UDP socket on the port the
    host's kernel answers every one with ICMP port-unreachable (and ARPs for it).
    The socket is never read: a tiny buffer that overflows silently is enough.
    Keep it open as long as the agent runs.
    """
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    return s
