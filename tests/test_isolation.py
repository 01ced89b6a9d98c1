"""What keeps parallel test workers apart: ports from blocks each claims, and its own name tag."""
import os
import socket
import subprocess
import sys

import pytest

from host_agent import rawsock
from mindp import progress, targets
from mindp.harness import testbed
from mindp.topology import Host


def test_free_port_keeps_to_mindp_ports(monkeypatch):
    p = targets.free_port()
    block = p - p % targets.PORT_BLOCK
    monkeypatch.setattr(targets, "_handed_out", set())  # (other tests of this process may have used the block)
    monkeypatch.setenv(targets.PORTS_ENV, f"{block + 5}-{block + 40}")  # inside a block this process holds
    assert all(block + 5 <= targets.free_port() < block + 40 for _ in range(20))


def test_free_ports_in_a_row_are_all_free_and_never_handed_out_twice(monkeypatch):
    """A tree's switches take the ports after the first: ports drawn one at a time once put a leaf's
    Thrift port on the spine's gRPC port. Blocks are drawn until none is left: none shares a port or
    takes a busy one, and the error comes only when no 8 free ports in a row remain in a block."""
    first = targets.free_port(8)
    assert all(targets.port_free(p) for p in range(first, first + 8))  # real sockets: each binds now
    monkeypatch.setattr(targets, "_handed_out", set())
    monkeypatch.setattr(targets, "_blocks", [])
    monkeypatch.setattr(targets, "_claim_block", lambda first: True)  # (claims across processes: below)
    monkeypatch.setenv(targets.PORTS_ENV, "20000-20100")  # blocks 19968 (from 20000), 20032, 20096 (to 20100)
    busy = {20003, 20030, 20031, 20040}
    monkeypatch.setattr(targets, "port_free", lambda port: port not in busy)  # (what the kernel says)
    blocks = []
    while True:
        try:
            blocks.append(targets.free_port(8))
        except targets.TargetError as exc:
            assert str(exc) == "no 8 free consecutive TCP ports on 127.0.0.1 in 20000-20100"
            break
    handed = [p for b in blocks for p in range(b, b + 8)]
    assert blocks and len(set(handed)) == len(handed) and all(20000 <= p < 20100 for p in handed)
    assert not busy & set(handed)
    assert all(p // 64 == (p + 7) // 64 for p in blocks)  # each run inside one block
    left = [p for p in range(20000, 20100) if p not in handed and p not in busy]
    assert not any(left[i + 7] - left[i] == 7 and left[i] // 64 == left[i + 7] // 64
                   for i in range(len(left) - 7))  # no free run of 8 in a block was missed
    with pytest.raises(targets.TargetError, match="65 ports in a row; 1 to 64"):
        targets.free_port(65)


def test_a_block_of_ports_one_process_holds_is_not_handed_to_another(monkeypatch):
    """Two test runs on one network (a container on the host's) once drew the same port slices:
    a port this process handed out is in a block no other process hands from while it lives."""
    p = targets.free_port()
    block = p - p % targets.PORT_BLOCK
    monkeypatch.setenv(targets.PORTS_ENV, f"{block}-{block + targets.PORT_BLOCK}")
    other = subprocess.run([sys.executable, "-c", "from mindp import targets; print(targets.free_port())"],
                           capture_output=True, text=True, env=os.environ)
    assert other.returncode != 0 and f"no 1 free consecutive TCP ports on 127.0.0.1 in {block}-" in other.stderr


def test_a_forked_child_hands_out_ports_from_blocks_of_its_own():
    mine = targets.free_port()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its port, or 0 where it has none
        try:
            port = targets.free_port()
        except BaseException:
            port = 0
        os.write(w, str(port).encode())
        os._exit(0)
    os.close(w)
    child = int(os.read(r, 16))
    os.close(r)
    os.waitpid(pid, 0)
    ours = targets.free_port()
    assert child and child // targets.PORT_BLOCK not in {p // targets.PORT_BLOCK for p in (mine, ours)}


def test_beds_of_two_workers_never_share_a_name(monkeypatch):
    names = []
    for tag in ("0", "1"):
        monkeypatch.setenv(testbed.TAG_ENV, tag)
        bed = testbed.Testbed("dp")  # names only: no host added
        names.append((bed.prefix, testbed.tagged("ss-")))
    assert names == [("dp0", "ss-0"), ("dp1", "ss-1")]
    monkeypatch.delenv(testbed.TAG_ENV)
    assert testbed.Testbed("dp").prefix == "dp"  # outside a parallel run: the names as given


def test_a_claimed_tag_is_not_handed_to_another_process():
    mine = testbed.claim_tag()
    other = subprocess.run([sys.executable, "-c", "from mindp.harness import testbed; print(testbed.claim_tag())"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert len(mine) == len(other) == 1 and other != mine and mine != testbed.claim_tag()


def test_a_tag_is_held_across_file_systems_that_share_the_network():
    """A run in a container on the host's network (its own /run, where root's lock files were) meets
    this run's interface names, so it must not get this process's tag: the claim lives in the network
    namespace. (/tmp stays: this checkout and its venv may be there.)"""
    mine = testbed.claim_tag()
    claim = "from mindp.harness import testbed; print(testbed.claim_tag())"
    other = subprocess.run(["unshare", "--mount", "sh", "-c", "mount -t tmpfs none /run"
                            f" && exec {sys.executable} -c '{claim}'"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert len(other) == 1 and other not in (mine, os.environ[testbed.TAG_ENV])  # the latter: conftest's claim


@pytest.fixture
def two_hosts():
    with testbed.Testbed("iso") as bed:
        for port in (1, 2):
            bed.add(Host(f"h{port}", f"02:00:00:00:01:0{port}", f"10.9.0.{port}", port))
        yield bed


def _port(iface):
    from softswitch.ports import Port
    return Port(1, iface).sock


@pytest.mark.net
@pytest.mark.parametrize("opener", [testbed.raw_socket, rawsock.open_raw, _port], ids=["testbed", "agent", "switch"])
def test_a_raw_socket_never_holds_another_interfaces_frames(two_hosts, monkeypatch, opener):
    """A frame that crosses another interface while a socket is being opened on port 1 (sent just
    before its bind) is not read on port 1: a socket created with ETH_P_ALL would hold it, and a
    switch or test aggregator would take another job's frames for its own."""
    mine, other = two_hosts.hosts["h1"].switch_iface, two_hosts.hosts["h2"]
    marker = b"stray-" + other.switch_iface.encode()
    frame = b"\xff" * 6 + bytes.fromhex("020000000102") + b"\x88\xb5" + marker.ljust(50, b"\0")
    sender, sniffer = other.socket(), testbed.raw_socket(other.switch_iface)
    sniffer.settimeout(progress.STALL)  # a hang guard: the frame crosses a local veth

    class FrameBeforeBind(socket.socket):
        def bind(self, address):
            sender.send(frame)
            while marker not in sniffer.recv(2048):  # it has passed every tap of the namespace
                pass
            super().bind(address)

    monkeypatch.setattr(socket, "socket", FrameBeforeBind)
    s = opener(mine)
    monkeypatch.undo()
    held = []
    try:
        while True:
            held.append(s.recv(2048))
    except BlockingIOError:
        pass
    finally:
        for x in (s, sender, sniffer):
            x.close()
    assert not [f for f in held if marker in f]



def test_a_testbed_host_can_send_at_once_and_running_follows_the_link():
    """Testbed.add returns once both veth ends run, so a frame sent at once arrives (on a busy
    machine first frames were lost while the host's end still waited for its carrier); `running`
    follows the link down."""
    frame = b"\x02\x00\x00\x00\x00\x02\x02\x00\x00\x00\x00\x01\x88\xb5" + bytes(46)
    with testbed.Testbed("ru") as bed:
        nh = bed.add(Host("h1", "02:00:00:00:00:01", "10.9.0.1", 1))
        assert testbed.running("eth0", nh.netns) and testbed.running(nh.switch_iface)
        rx, tx = testbed.raw_socket(nh.switch_iface), nh.socket()
        got = []

        def arrived() -> bool:
            try:
                got.append(rx.recv(2048))
            except BlockingIOError:
                pass
            return bool(got)

        try:
            tx.send(frame)
            progress.wait(arrived, lambda: len(got), stall=progress.STALL, what="the frame")
        finally:
            rx.close()
            tx.close()
        assert got == [frame]
        testbed.sh("ip", "link", "set", nh.switch_iface, "down")
        assert not testbed.running(nh.switch_iface)
        progress.wait(lambda: not testbed.running("eth0", nh.netns), lambda: 0, stall=progress.STALL,
                      what="the host's end losing its carrier")


def udp_counters(netns: str) -> dict[str, int]:
    """The namespace's Udp: line of /proc/net/snmp."""
    lines = [ln.split() for ln in testbed.sh("ip", "netns", "exec", netns, "cat", "/proc/net/snmp").stdout.splitlines()
             if ln.startswith("Udp:")]
    return dict(zip(lines[0][1:], map(int, lines[1][1:])))


def test_a_hosts_kernel_drops_mindp_frames_once_its_raw_sockets_have_them():
    """A testbed host drops mindp's UDP frames at its netdev ingress (netutil.drop_at_ingress, as
    make run's hosts do): the raw socket gets every frame, the kernel's UDP never sees one; frames
    to another UDP port still reach it. Installing the rules again replaces them."""
    from mindp import netutil
    from mindp.harness.loadgen import gradient_frames

    peer = Host("w", "02:00:00:00:00:09", "10.9.0.9", 9)
    with testbed.Testbed("ing") as bed:
        nh = bed.add(Host("h1", "02:00:00:00:00:01", "10.9.0.1", 1))
        assert netutil.drop_at_ingress("eth0", f"/run/netns/{nh.netns}")
        rules = testbed.sh("ip", "netns", "exec", nh.netns, "nft", "list", "ruleset").stdout
        assert rules.count("drop") == 1 and f"dport {netutil.UDP_PORT}" in rules
        mindp = gradient_frames(peer, nh.host, 50)
        other = [bytearray(f) for f in mindp[:20]]
        for f in other:
            f[36:38] = (netutil.UDP_PORT + 1).to_bytes(2, "big")
        tx, rx = testbed.raw_socket(nh.switch_iface), nh.socket()
        before = udp_counters(nh.netns)
        got = []

        def drained(n: int):
            def done() -> bool:
                while True:
                    try:
                        got.append(rx.recv(2048))
                    except BlockingIOError:
                        return len(got) >= n
            return done

        try:
            for f in mindp:
                tx.send(f)
            progress.wait(drained(len(mindp)), lambda: len(got), stall=progress.STALL, what="the mindp frames")
            dropped = udp_counters(nh.netns)
            for f in other:
                tx.send(bytes(f))
            progress.wait(drained(len(mindp) + len(other)), lambda: len(got), stall=progress.STALL,
                          what="the other frames")
            progress.wait(lambda: udp_counters(nh.netns)["NoPorts"] >= before["NoPorts"] + len(other),
                          lambda: udp_counters(nh.netns)["NoPorts"], stall=progress.STALL, what="UDP's count")
        finally:
            tx.close()
            rx.close()
    assert got[:len(mindp)] == mindp
    assert {k: dropped[k] - before[k] for k in ("InDatagrams", "NoPorts", "InErrors", "RcvbufErrors")} == \
        dict.fromkeys(("InDatagrams", "NoPorts", "InErrors", "RcvbufErrors"), 0)
