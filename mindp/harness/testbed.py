"""Hosts in network namespaces on veth pairs, for tests and benches.

Each host gets a namespace `<prefix><name>` holding `eth0`; the switch-side end
`<prefix>p<port>` stays in the root namespace, where the switch runs. Offloads
and IPv6 are off on both ends (as BMv2's veth_setup.sh does), so only the
frames a test sends cross the link. Everything is removed on close, by name.
"""
from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import time
from collections import deque
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable

from mindp import progress
from mindp.netutil import IFF_RUNNING, claim, drop_at_ingress, hold_udp_port, interface_flags, packet_socket
from mindp.protocol import link_mtu
from mindp.readable import readable
from mindp.topology import Host

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


#: Appended to every bed's prefix; a parallel test runner sets one per worker (1-2 characters),
#: so beds of concurrent workers never share a namespace or interface name.
TAG_ENV = "MINDP_NET_TAG"


def tagged(prefix: str) -> str:
    """`prefix` with this process's tag ($MINDP_NET_TAG), for any name a bed or test makes."""
    return prefix + os.environ.get(TAG_ENV, "")


TAG_CHARS = "0123456789abcdefghijklmnopqrstuvwxyz"


def claim_tag() -> str:
    """A one-character name tag that no other live process of this network namespace holds,
    claimed (netutil.claim: `\\0mindp-tag-X`) for as long as this process lives: the interface and
    namespace names the tag guards belong to the network namespace too, so test runs that share
    the network but not a file system (a container on the host's network) never share a name."""
    for ch in TAG_CHARS:
        if claim(f"tag-{ch}"):
            return ch
    raise TestbedError(f"all {len(TAG_CHARS)} name tags are held by other processes of this network namespace")


class TestbedError(RuntimeError):
    pass


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise TestbedError(f"{' '.join(args)}: {proc.stderr.strip()}")
    return proc


OFFLOADS = ("rx", "tx", "sg", "tso", "ufo", "gso", "gro", "lro", "rxvlan", "txvlan", "rxhash")


def quiet_link(iface: str, netns: str | None = None) -> None:
    """Offloads off, IPv6 off, an MTU that fits K's frames, link up: no frames but the ones we send."""
    pre = ["ip", "netns", "exec", netns] if netns else []
    for feature in OFFLOADS:
        sh(*pre, "ethtool", "-K", iface, feature, "off", check=False)
    sh(*pre, "sysctl", "-qw", f"net.ipv6.conf.{iface}.disable_ipv6=1", check=False)
    sh(*pre, "ip", "link", "set", iface, "mtu", str(link_mtu()))
    sh(*pre, "ip", "link", "set", iface, "up")


def running(iface: str, netns: str | None = None) -> bool:
    """The link is operationally up. A veth end brought up before its peer gets its carrier later,
    from the kernel's link watch work, and until then drops what is sent on it without an error (a
    busy machine runs that work late: a test's first frames were lost so)."""
    with in_netns(netns) if netns else nullcontext():
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with s:
        return bool(interface_flags(s, iface) & IFF_RUNNING)


def quiet_veths(*ends: tuple[str, str | None]) -> None:
    """quiet_link for every (interface, namespace) in `ends` (both ends of each veth pair), then
    wait until all of them run (see `running`): only then is a frame sent on one sure to leave."""
    for iface, netns in ends:
        quiet_link(iface, netns)
    progress.wait(lambda: all(running(i, ns) for i, ns in ends), lambda: 0, stall=progress.STALL,
                  what="links up: " + ", ".join(i for i, _ in ends))


@contextmanager
def veth_pair(a: str, b: str):
    """A veth pair a <-> b in this namespace, quiet and running for the body, removed after it."""
    sh("ip", "link", "del", a, check=False)
    sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
    try:
        quiet_veths((a, None), (b, None))
        yield a, b
    finally:
        sh("ip", "link", "del", a, check=False)


@contextmanager
def in_netns(netns: str):
    """Run the body with this thread in `netns` (for opening sockets there)."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/var/run/netns/{netns}", os.O_RDONLY)
    try:
        if _libc.setns(target, CLONE_NEWNET) != 0:
            raise TestbedError(f"setns({netns}): {os.strerror(ctypes.get_errno())}")
        yield
    finally:
        _libc.setns(own, CLONE_NEWNET)
        os.close(own)
        os.close(target)


def raw_socket(iface: str, netns: str | None = None) -> socket.socket:
    """A non-blocking AF_PACKET socket bound to `iface`, receiving every frame."""
    def make() -> socket.socket:
        s = packet_socket(iface)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        s.setblocking(False)
        return s

    if netns is None:
        return make()
    with in_netns(netns):
        return make()


@dataclass
class NetHost:
    host: Host
    netns: str
    switch_iface: str  # the root-namespace end, given to the switch as port `host.port`
    udp_guard: socket.socket | None = None

    def exec(self, *cmd: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.netns, *cmd], **kw)

    def popen(self, *cmd: str, **kw) -> subprocess.Popen:
        return subprocess.Popen(["ip", "netns", "exec", self.netns, *cmd], **kw)

    def socket(self) -> socket.socket:
        return raw_socket("eth0", self.netns)


class Testbed:
    """Namespaces and veths for a set of hosts; a context manager that cleans up."""

    def __init__(self, prefix: str):
        if not 1 <= len(prefix) <= 6:
            raise ValueError("prefix must be 1..6 characters (interface names are short)")
        self.prefix = tagged(prefix)
        self.hosts: dict[str, NetHost] = {}

    def add(self, host: Host) -> NetHost:
        netns = f"{self.prefix}{host.name}"
        outer = f"{self.prefix}p{host.port}"
        inner = f"{self.prefix}h{host.port}"
        self._remove(netns, outer)
        sh("ip", "netns", "add", netns)
        nh = NetHost(host, netns, outer)
        self.hosts[host.name] = nh
        sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        sh("ip", "link", "set", inner, "netns", netns)
        sh("ip", "-n", netns, "link", "set", inner, "name", "eth0")
        sh("ip", "-n", netns, "link", "set", "eth0", "address", host.mac)
        sh("ip", "-n", netns, "addr", "add", f"{host.ip}/16", "dev", "eth0")
        sh("ip", "-n", netns, "link", "set", "lo", "up")
        quiet_veths(("eth0", netns), (outer, None))
        drop_at_ingress("eth0", f"/run/netns/{netns}")
        with in_netns(netns):
            nh.udp_guard = hold_udp_port()
        return nh

    def ports(self) -> dict[int, str]:
        return {nh.host.port: nh.switch_iface for nh in self.hosts.values()}

    @staticmethod
    def _remove(netns: str, outer: str) -> None:
        sh("ip", "netns", "del", netns, check=False)
        sh("ip", "link", "del", outer, check=False)

    def close(self) -> None:
        for nh in self.hosts.values():
            if nh.udp_guard:
                nh.udp_guard.close()
            self._remove(nh.netns, nh.switch_iface)
        self.hosts.clear()

    def __enter__(self) -> Testbed:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class FrameTap:
    """Raw sockets on hosts of a testbed (PTF style): send frames, collect what arrives.

    `accept` filters what counts (default: every frame, so a test can assert
    that nothing else arrived).

    The quiet period after the frames a collect expects follows this machine's pace: a switch makes
    any extra frame in the same processing as the expected ones, so it comes out within about the
    time the tap's recent exchanges took (last send to the frame that completed a collect). The
    period is GRACE_FACTOR times the slowest of the last few, at least MIN_GRACE and at most the
    caller's `grace` (which alone applies before the first exchange). A collect that expects no
    frame waits the whole `grace`: nothing arriving does not show that the switch has processed
    what was sent, and tests read its counters next.
    """

    GRACE_FACTOR = 10
    MIN_GRACE = 0.03

    def __init__(self, bed: Testbed, names: list[str] | None = None,
                 accept: Callable[[bytes], bool] | None = None):
        self.socks = {name: bed.hosts[name].socket() for name in (names or list(bed.hosts))}
        self.by_fd = {s.fileno(): name for name, s in self.socks.items()}
        self.accept = accept
        self._sent_at: float | None = None
        self._exchanges: deque[float] = deque(maxlen=16)

    def send(self, host: str, frame: bytes) -> None:
        self.socks[host].send(frame)
        self._sent_at = time.monotonic()

    def quiet_period(self, grace: float) -> float:
        if not self._exchanges:
            return grace
        return min(grace, max(self.MIN_GRACE, self.GRACE_FACTOR * max(self._exchanges)))

    def collect(self, n: int = 0, timeout: float = 10.0, grace: float = 0.25) -> dict[str, list[bytes]]:
        """Frames per host: wait until `n` arrived, then a quiet period (`grace` at most) for extras.
        Gives up waiting once `timeout` s pass without a new frame (a slow machine's frames come
        late, not never)."""
        got: dict[str, list[bytes]] = {name: [] for name in self.socks}
        total = 0
        deadline = time.monotonic() + timeout
        quiet_until = None
        while True:
            now = time.monotonic()
            if total >= n and quiet_until is None:
                if n and self._sent_at is not None:
                    self._exchanges.append(now - self._sent_at)
                quiet_until = now + (self.quiet_period(grace) if n else grace)
            end = quiet_until if quiet_until is not None else deadline
            if now >= end:
                return got
            ready = readable(list(self.socks.values()), end - now)
            for s in ready:
                while True:
                    try:
                        frame = s.recv(65536)  # any frame a link carries (K = 512 sums: 4,170 bytes)
                    except BlockingIOError:
                        break
                    if self.accept is None or self.accept(frame):
                        got[self.by_fd[s.fileno()]].append(frame)
                        total += 1
                        deadline = time.monotonic() + timeout

    def drain(self) -> None:
        self.collect(0, grace=0.05)

    def close(self) -> None:
        for s in self.socks.values():
            s.close()
