"""Host-side socket helpers shared by the agents and the testbed."""
from __future__ import annotations

import fcntl
import re
import shutil
import socket
import struct
import subprocess

from .protocol import K, K_ENV, UDP_PORT, required_mtu

ETH_P_ALL = 0x0003
SIOCGIFFLAGS = 0x8913
IFF_UP, IFF_RUNNING = 0x1, 0x40

_claims: list[socket.socket] = []  # the names this process claimed, bound while it lives


def claim(name: str) -> bool:
    """Claim `name` for this process's life: a Unix socket bound to the abstract name `\\0mindp-<name>`;
    False where another live process of this network namespace holds it (or this one already
    does). Abstract names belong to the network namespace, as interface names and ports do, so
    processes that share the network but not a file system (a container on the host's network)
    see each other's claims; the kernel drops a claim with the process that held it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(f"\0mindp-{name}")
    except OSError:
        sock.close()
        return False
    _claims.append(sock)
    return True


def interface_holding(ip: str) -> str | None:
    """The interface of this network namespace that holds IPv4 address `ip`, or None."""
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    for f in (line.split() for line in out.splitlines()):
        if len(f) > 3 and f[3].split("/")[0] == ip:
            return f[1].split("@")[0]
    return None


def packet_socket(iface: str) -> socket.socket:
    """An AF_PACKET raw socket receiving every frame of `iface` and of no other interface.

    It is created deaf (protocol 0) and given ETH_P_ALL only by bind(): a socket created with
    ETH_P_ALL receives the frames of every interface of the namespace until it is bound, and on a
    machine where other switches or jobs are busy those strays would be read as its own (libpcap
    opens its sockets the same way). Raises OSError (PermissionError without CAP_NET_RAW).
    """
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    try:
        s.bind((iface, ETH_P_ALL))  # Python puts the protocol in network order itself
    except OSError:
        s.close()
        raise
    return s


def interface_flags(sock: socket.socket, iface: str) -> int:
    """`iface`'s flags (IFF_UP, IFF_RUNNING, ...) in the network namespace `sock` was made in; OSError
    (ENODEV) where it does not exist."""
    ifreq = fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, struct.pack("16sH22x", iface.encode()[:15], 0))
    return struct.unpack_from("16sH", ifreq)[1]


def interface_mtu(iface: str) -> int | None:
    """The MTU of `iface` in this namespace, None if it cannot be read."""
    try:
        with open(f"/sys/class/net/{iface}/mtu") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def mtu_problem(iface: str, k: int = K) -> str | None:
    """One line saying why `iface` cannot carry k's frames (its MTU is below the largest), or None.
    A frame over the MTU is dropped by the kernel without a word to the sender: refuse up front."""
    mtu, need = interface_mtu(iface), required_mtu(k)
    if mtu is None or mtu >= need:
        return None
    return (f"{iface}: MTU {mtu} is below the {need} bytes a K = {k} frame needs: raise it "
            f"(ip link set {iface} mtu {max(need, 9000) if need <= 9000 else need}) or run a smaller K "
            f"({K_ENV}, make run K=...)")


def bound_udp(bind: str, port: int) -> socket.socket:
    """A non-blocking UDP socket bound to (bind, port), SO_REUSEADDR: the agents' side channels
    (shard notices, step digests) beside the raw data plane."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bind, port))
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def ephemeral_udp(avoid: tuple[int, ...] = (UDP_PORT,)) -> socket.socket:
    """A UDP socket bound to a port of the kernel's choosing, never one in `avoid`.

    The switch's parser takes every UDP datagram to UDP_PORT for a mindp frame, whatever its
    source: a side channel's answers to a socket the kernel happened to put on that port (its
    ephemeral range holds it) would be dropped there as malformed frames, every one of them."""
    held = []
    try:
        while True:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            held.append(s)
            s.bind(("0.0.0.0", 0))
            if s.getsockname()[1] not in avoid:
                return held.pop()
    finally:
        for s in held:  # the refused ports stay taken until here, so the kernel offers others
            s.close()


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


def ingress_drop_ruleset(iface: str, port: int = UDP_PORT) -> str:
    """The nftables ruleset (`nft -f -`) dropping mindp's UDP frames that arrive on `iface` at the
    netdev ingress hook: after the packet sockets (the agents' raw sockets, tcpdump) took their
    copies, before the kernel's IP and UDP code, which has nothing to do with them but hand them
    to the idle guard socket. Applied again, it replaces itself (in one transaction)."""
    table = "mindp_" + re.sub(r"[^A-Za-z0-9_]", "_", iface)
    return (f"add table netdev {table}\ndelete table netdev {table}\n"
            f"table netdev {table} {{\n  chain ingress {{\n"
            f"    type filter hook ingress device \"{iface}\" priority 0; policy accept;\n"
            f"    udp dport {port} drop\n  }}\n}}\n")


def drop_at_ingress(iface: str, netns_path: str | None = None) -> bool:
    """Install `ingress_drop_ruleset(iface)` in the network namespace at `netns_path` (this one
    when None); False where nft is missing or refuses (the kernel then runs the frames through IP
    and UDP to the guard socket, as without it: slower, not wrong)."""
    nft = shutil.which("nft")
    if nft is None:
        return False
    cmd = [nft, "-f", "-"] if netns_path is None else ["nsenter", f"--net={netns_path}", nft, "-f", "-"]
    try:
        return subprocess.run(cmd, input=ingress_drop_ruleset(iface), capture_output=True, text=True).returncode == 0
    except OSError:
        return False
