"""Host-side socket helpers (mindp.netutil) in a network namespace of their own."""
import os
import subprocess
import sys

import pytest

from mindp.protocol import UDP_PORT

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace needs root")

# In a namespace whose ephemeral range is UDP_PORT..UDP_PORT+3 with the odd ports taken (the
# kernel offers odd ones first to bind), the kernel offers UDP_PORT or UDP_PORT+2 in turn.
PORTS = f"""
import socket, sys
from host_agent import digest
open("/proc/sys/net/ipv4/ip_local_port_range", "w").write("{UDP_PORT} {UDP_PORT + 3}")
taken = []
for p in ({UDP_PORT + 1}, {UDP_PORT + 3}):
    taken.append(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    taken[-1].bind(("0.0.0.0", p))
ports = set()
for _ in range(40):
    s = digest.open_socket()
    ports.add(s.getsockname()[1])
    s.close()
print(sorted(ports))
"""


@needs_root
def test_a_digest_socket_never_takes_the_port_the_switch_parses_as_mindp():
    """The switch drops every answer to a socket on UDP_PORT as a malformed mindp frame: a worker
    whose digest socket the kernel put there heard nothing from its node (seen once in CI)."""
    out = subprocess.run(["unshare", "--net", sys.executable, "-c", PORTS], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [f"[{UDP_PORT + 2}]"]
