"""Batched port I/O on veth pairs into network namespaces: a port's receive ring into a Batch's
slots and sendmmsg from them (and the per-frame sends that stand in where libc lacks it) keep every
byte, the order, the VLAN tag the kernel strips, the pcaps and the error counts; the Python and C
packet loops read the same rings; the packet loop sends a batch's outputs grouped by egress port."""
import select
import signal
import struct
import threading
import time

import numpy as np
import pytest

from host_agent import rawsock
from mindp import mmsg, progress, protocol, targets
from mindp.harness import testbed
from mindp.topology import Host
from softswitch.batch import SLOT, Batch
from softswitch.dataplane import DataPlane
from softswitch.engine import Engine
from softswitch.ports import TAG, Port

from . import compiled
from .payloads import body

pytestmark = pytest.mark.net

H1 = Host("h1", "02:00:00:00:00:01", "10.9.0.1", 1)
H2 = Host("h2", "02:00:00:00:00:02", "10.9.0.2", 2)
MACS = bytes.fromhex("020000000002" "020000000001")


@pytest.fixture(params=["mmsg", "plain"])
def io_path(request, monkeypatch):
    """Each test on both send paths: sendmmsg and the per-frame loop."""
    if request.param == "mmsg" and mmsg.CALLS is None:
        pytest.skip("no sendmmsg on this platform")
    if request.param == "plain":
        monkeypatch.setattr(mmsg, "CALLS", None)
    return request.param


def pcap_frames(path) -> list[bytes]:
    """The frames of a classic pcap file, whole (scapy's reader cuts them at 65,535 bytes)."""
    data = path.read_bytes()
    magic, _, _, _, _, snaplen, _ = struct.unpack_from("<IHHiIII", data)
    assert magic == 0xA1B2C3D4 and snaplen >= SLOT
    frames, off = [], 24
    while off < len(data):
        _, _, caplen, length = struct.unpack_from("<IIII", data, off)
        assert caplen == length
        frames.append(data[off + 16:off + 16 + caplen])
        off += 16 + caplen
    return frames


def receive_all(port: Port, n: int, capacity: int = 5) -> list[bytes]:
    """Frames from `port` in batches of `capacity` until `n` came (or progress.STALL s without one)."""
    got, rx = [], Batch.empty(capacity, SLOT)
    idle = time.monotonic()
    while len(got) < n and time.monotonic() - idle < progress.STALL:
        rx.n = 0
        if port.receive(rx, capacity):
            idle = time.monotonic()
        got += [rx.frame(i) for i in range(rx.n)]
        assert all(p == port.number for p in rx.ports[:rx.n])
        time.sleep(0.002)
    return got


def drain(sock, n: int, idle_limit: float = progress.STALL) -> list[bytes]:
    """Frames from sock until `n` came or none came for `idle_limit` s (a short one to see that
    nothing comes)."""
    got, idle = [], time.monotonic()
    while len(got) < n and time.monotonic() - idle < idle_limit:
        try:
            got.append(sock.recv(1 << 17))
            idle = time.monotonic()
        except BlockingIOError:
            time.sleep(0.002)
    return got


def test_batched_receive_keeps_bytes_order_and_vlan_tags_up_to_the_slot(tmp_path):
    """Untagged frames of every size up to a slot less a tag's room (those over a ring slot's
    1,982 bytes read from the socket's queue); 802.1Q, priority-tagged (VID 0) and 802.1ad frames
    with their tag back in place, up to a full slot; a frame too long for a slot counted and left
    out, not cut short."""
    q = MACS + b"\x81\x00\x20\x07" + b"\x88\xb5"
    prio = MACS + b"\x81\x00\x00\x00" + b"\x88\xb5"
    qinq = MACS + b"\x88\xa8\x00\x64\x81\x00\x00\x07" + b"\x88\xb5"
    plain = MACS + b"\x88\xb5"
    sent = [plain + body(46, 1), q + body(100, 2), prio + body(50, 3), qinq + body(1500, 4),
            plain + body(9000, 5), plain + body(SLOT - TAG - len(plain), 6),
            q + body(SLOT - len(q), 7), plain + body(60, 8)]
    too_long = plain + body(SLOT - TAG + 1 - len(plain), 9)
    with testbed.Testbed("bio") as bed:
        h = bed.add(H1)
        testbed.sh("ip", "link", "set", h.switch_iface, "mtu", "65535")
        testbed.sh("ip", "-n", h.netns, "link", "set", "eth0", "mtu", "65535")
        port = Port(1, h.switch_iface, str(tmp_path))
        s = h.socket()
        try:
            for fr in sent[:4] + [too_long] + sent[4:]:
                s.send(fr)
            got = receive_all(port, len(sent))
            time.sleep(0.3)
            assert port.receive(Batch.empty(2, SLOT), 2) == 0, "nothing else waits"
            assert drain(port.sock, 1, idle_limit=0.1) == [], "nor in the socket's queue"
        finally:
            s.close()
            port.close()
    assert [len(g) for g in got] == [len(f) for f in sent]
    assert got == sent
    assert (port.rx, port.rx_truncated) == (len(sent), 1)
    assert pcap_frames(tmp_path / f"{h.switch_iface}_in.pcap") == sent


def test_batched_send_keeps_order_and_counts_refused_frames(io_path, tmp_path):
    """The rows asked, in that order, each with its own length; a frame over the link's MTU is
    refused by the kernel, counted in tx_errors and missing from the pcap; the rest go."""
    over = protocol.link_mtu() + 14 + 86  # over what the testbed's links take (1,500 or a jumbo MTU)
    tx = Batch.empty(12, over)
    for i in range(12):
        assert tx.append(MACS + b"\x88\xb5" + body(46 + 97 * i, i), 1)
    too_big = 11
    tx.lens[too_big] = over
    rows = np.array([3, 0, 7, too_big, 7, 10, 5])
    with testbed.Testbed("bio") as bed:
        h = bed.add(H1)
        port = Port(1, h.switch_iface, str(tmp_path))
        s = h.socket()
        try:
            assert port.send_batch(tx, rows) == len(rows) - 1
            assert port.send_batch(tx, np.array([], np.int64)) == 0
            got = drain(s, len(rows) - 1)
            assert drain(s, 1, idle_limit=0.5) == []
        finally:
            s.close()
            port.close()
    want = [tx.frame(i) for i in rows if i != too_big]
    assert got == want
    assert (port.tx, port.tx_errors) == (len(want), 1)
    assert pcap_frames(tmp_path / f"{h.switch_iface}_out.pcap") == want


def test_a_batch_leaves_grouped_by_egress_port_in_order(io_path):
    """The loop's send step: each port's frames in one send, in batch order; the CPU port's to
    packet-in; a port the switch lacks counted."""
    with testbed.Testbed("bio") as bed:
        hosts = [bed.add(H1), bed.add(H2)]
        ports = {n: Port(n, h.switch_iface) for n, h in zip((1, 2), hosts)}
        socks = [h.socket() for h in hosts]
        packet_in = []
        dp = DataPlane(Engine(), ports, cpu_port=3, packet_in=packet_in.append)
        tx = Batch.empty(16, 2048)
        egress = [1, 2, 2, 3, 1, 9, 2, 1, 3, 1]
        for i, p in enumerate(egress):
            tx.append(MACS + b"\x88\xb5" + body(50 + i, i), p)
        try:
            dp._send_batch(tx)
            got = [drain(s, egress.count(n)) for s, n in zip(socks, (1, 2))]
        finally:
            for s in socks:
                s.close()
            dp.close()
    frames = [tx.frame(i) for i in range(tx.n)]
    for n, g in zip((1, 2), got):
        assert g == [f for f, p in zip(frames, egress) if p == n]
    assert packet_in == [f for f, p in zip(frames, egress) if p == 3]
    assert (dp.no_port, dp.engine.stats.tx) == (1, 7)


def test_a_burst_through_the_switch_is_forwarded_and_captured_as_by_the_per_frame_loop(tmp_path, monkeypatch):
    """500 frames sent in one sendmmsg burst through the switch (the exprs program reflects each
    with its first field + 1): all back, in order; the pcaps hold the same frames whether the
    switch's ports send with sendmmsg or frame by frame (MINDP_NO_MMSG=1)."""
    n = 500
    frames = np.zeros((n, 24), np.uint8)
    frames[:, :14] = np.frombuffer(MACS + b"\x88\xb5", np.uint8)
    frames[:, 14:16] = np.stack([np.arange(n) >> 8, np.arange(n) & 255], 1)
    frames[:, 17] = 1
    captures = {}
    with testbed.Testbed("bio") as bed:
        hosts = [bed.add(H1), bed.add(H2)]
        for mode in ("mmsg", "plain"):
            monkeypatch.setenv("MINDP_NO_MMSG", "1" if mode == "plain" else "0")
            out = tmp_path / mode
            out.mkdir()
            cfg = targets.SwitchConfig(ports=bed.ports(), grpc_addr=f"127.0.0.1:{targets.free_port()}",
                                       thrift_port=targets.free_port(), json_path=str(compiled.json_path("exprs")),
                                       log_file=str(out / "switch.log"), pcap_dir=str(out))
            sw = targets.SwitchProcess("embedded", cfg).start()
            s = hosts[0].socket()
            try:
                assert rawsock.send_rows(s, frames, range(n)) == (n, 0)
                got = drain(s, n)
            finally:
                s.close()
                sw.proc.send_signal(signal.SIGTERM)
                assert progress.wait_process(sw.proc) == 0
            assert len(got) == n
            assert [int.from_bytes(g[14:16], "big") for g in got] == list(range(n))
            assert [int.from_bytes(g[24:26], "big") for g in got] == [i + 1 for i in range(n)]
            captures[mode] = [pcap_frames(out / f"{h.switch_iface}_{d}.pcap")
                              for h in hosts for d in ("in", "out")]
            assert captures[mode][0] == [f.tobytes() for f in frames] and captures[mode][1] == got
            assert "Traceback" not in (out / "switch.log").read_text()
    assert captures["mmsg"] == captures["plain"]


@pytest.mark.parametrize("io_path,loop", [("mmsg", "python"), ("plain", "python"), ("mmsg", "c")],
                         indirect=["io_path"])
def test_the_batched_loop_sends_what_the_per_frame_path_sends(io_path, loop):
    """Frames received on port 3 in one batch through the features program (routes to ports 5
    and 6, multicast to 1, 2 and 4 with one replica dropped in egress), with an output batch too
    small for all of them (the loop sends it and calls run_batch again): each host gets exactly
    the frames, in the order, that engine.process gives frame by frame; registers and counters
    agree; outputs to ports the switch lacks (4, 6) are counted. By the Python loop and by the C
    loop (softswitch/native/serve.py), which needs sendmmsg."""
    from .engines import feat_engine, feat_frame

    sent = []
    for i in range(12):
        if i % 3 == 0:
            sent.append(feat_frame(src=0x0A000001, dst=0x0A010300 + i, ttl=30))  # flood
        elif i % 3 == 1:
            sent.append(feat_frame(src=0x0B000001, dst=0x0A010200 + i, tos=i & 7))  # to 6: no such port
        else:
            sent.append(feat_frame(src=0x0B000001, dst=0x0A01FF00 + i, tos=i & 7))  # to 5
    ref = feat_engine()
    want = {1: [], 2: [], 5: []}
    missing = 0
    for fr in sent:
        for p, out in ref.process(fr, 3):
            if p in want:
                want[p].append(out)
            else:
                missing += 1
    hosts = {n: Host(f"h{n}", f"02:00:00:00:00:{n:02x}", f"10.9.0.{n}", n) for n in (1, 2, 3, 5)}
    with testbed.Testbed("bio") as bed:
        nets = {n: bed.add(h) for n, h in hosts.items()}
        ports = {n: Port(n, nh.switch_iface) for n, nh in nets.items()}
        socks = {n: nets[n].socket() for n in (1, 2, 3, 5)}
        eng = feat_engine()
        dp = DataPlane(eng, ports)
        dp.rx, dp.tx = Batch.empty(64, 2048), Batch.empty(4, 2048)
        try:
            for fr in sent:
                socks[3].send(fr)

            def all_in() -> bool:
                if loop == "c":
                    assert dp.serve() is not None
                else:
                    dp._port_ready(ports[3])
                return eng.stats.rx >= len(sent)

            progress.wait(all_in, lambda: eng.stats.rx, stall=progress.STALL, what="the switch reading", poll=0)
            got = {n: drain(socks[n], len(want[n])) for n in want}
        finally:
            for s in socks.values():
                s.close()
            dp.close()
    assert eng.stats.rx == len(sent)
    assert got == want and all(want.values())
    assert dp.no_port == missing > 0
    assert eng.program.registers == ref.program.registers
    assert eng.program.counters == ref.program.counters


@pytest.mark.skipif(mmsg.CALLS is None, reason="no sendmmsg on this platform")
def test_the_c_packet_loop_serves_as_the_python_loop():
    """The same frames through the exprs program (each reflected to its port, results appended)
    by the Python loop (`_port_ready`) and by the C loop (`serve`, softswitch/native/serve.py):
    the same frames back on each port, in order; the same counts; a frame too long for a slot
    counted and left out, a jumbo frame (read from the socket's queue) kept; an 802.1Q-tagged
    frame reaches the program with its tag back in place, so the program does not parse it as
    the protocol and reflects it unchanged."""
    from .engines import engine

    tagged = MACS + b"\x81\x00\x20\x07" + b"\x88\xb5" + body(20, 1)
    too_long = MACS + b"\x88\xb5" + body(SLOT - TAG + 1 - 14, 2)

    def plain(port: int, i: int) -> bytes:
        return MACS + b"\x88\xb5" + struct.pack("!HHhhBB", i, port, -i, i, i % 17, 0)

    jumbo = plain(1, 300) + body(9000, 3)
    sends = {1: [plain(1, i) for i in range(150)] + [tagged, too_long] + [plain(1, i) for i in range(150, 300)]
             + [jumbo],
             2: [plain(2, i) for i in range(200)] + [tagged]}
    results = {}
    with testbed.Testbed("bio") as bed:
        nets = {1: bed.add(H1), 2: bed.add(H2)}
        for h in nets.values():
            testbed.sh("ip", "link", "set", h.switch_iface, "mtu", "65535")
            testbed.sh("ip", "-n", h.netns, "link", "set", "eth0", "mtu", "65535")
        for loop in ("python", "c"):
            ports = {n: Port(n, h.switch_iface) for n, h in nets.items()}
            socks = {n: h.socket() for n, h in nets.items()}
            eng = engine("exprs", "compiled")
            dp = DataPlane(eng, ports)
            served = []
            try:
                for n, frames in sends.items():
                    for fr in frames:
                        socks[n].send(fr)
                expected = sum(map(len, sends.values())) - 1

                def all_in() -> bool:
                    if loop == "c":
                        served.append(dp.serve())
                    else:
                        for p in ports.values():
                            dp._port_ready(p)
                    return eng.stats.rx >= expected

                progress.wait(all_in, lambda: eng.stats.rx, stall=progress.STALL, what="the switch reading", poll=0)
                got = {n: drain(socks[n], len(sends[n]) - (n == 1)) for n in sends}
                assert drain(socks[1], 1, idle_limit=0.3) == []
            finally:
                for s in socks.values():
                    s.close()
                dp.close()
            if loop == "c":
                assert None not in served and sum(served) > 0
            results[loop] = (got, eng.stats.rx, eng.stats.tx, dp.no_port, eng.stats.errors,
                             {n: (p.rx, p.tx, p.tx_errors, p.rx_truncated) for n, p in ports.items()})
    assert results["c"] == results["python"]
    got = results["c"][0]
    assert results["c"][5] == {1: (302, 302, 0, 1), 2: (201, 201, 0, 0)}
    untagged = MACS + b"\x88\xb5" + body(20, 1)  # the receiving host's kernel strips the tag again
    assert got[1][150] == untagged and got[2][200] == untagged
    assert [g[14:18] for g in got[1][:150] + got[1][151:]] == [f[14:18] for f in sends[1][:150] + sends[1][152:]]
    assert all(len(g) > len(f) for g, f in zip(got[2][:200], sends[2][:200]))


@pytest.mark.skipif(mmsg.CALLS is None, reason="no sendmmsg on this platform")
@pytest.mark.parametrize("ring", ["default", "odd"])
def test_the_python_and_c_loops_take_turns_on_one_ring_as_it_wraps(monkeypatch, ring):
    """13,000 numbered frames in bursts of 1,000 through the exprs program (each reflected to its
    port), the bursts read by the Python loop and the C loop in turn: every frame back once, in
    order, while the ring wraps three times or more; the port's count and the ring's read position
    agree. 'odd': 12 KiB slots, 10 a block (K = 1,024's), 1,010 of them: the C loop stepped through
    the rings by the module's default geometry and fell out of step with them (a K = 1,024 run
    stalled at its second wrap)."""
    from functools import partial

    from mindp import rxring
    from softswitch import ports

    from .engines import engine

    if ring == "odd":
        monkeypatch.setattr(ports, "RxRing", partial(rxring.RxRing, frame=12288, frames=1003))

    bursts, each = 13, 1000
    frames = np.zeros((bursts * each, 24), np.uint8)
    frames[:, :14] = np.frombuffer(MACS + b"\x88\xb5", np.uint8)
    frames[:, 14:18] = np.arange(bursts * each, dtype=">u4").view(np.uint8).reshape(-1, 4)
    got = []
    with testbed.Testbed("bio") as bed:
        h = bed.add(H1)
        port = Port(1, h.switch_iface)
        s = h.socket()
        eng = engine("exprs", "compiled")
        dp = DataPlane(eng, {1: port})
        try:
            for b in range(bursts):
                assert rawsock.send_rows(s, frames, range(b * each, (b + 1) * each)) == (each, 0)
                target = (b + 1) * each

                def all_in() -> bool:
                    if b % 2:
                        assert dp.serve() is not None
                    else:
                        dp._port_ready(port)
                    return eng.stats.rx >= target

                progress.wait(all_in, lambda: eng.stats.rx, stall=progress.STALL, what="the switch reading", poll=0)
                got += drain(s, each)
        finally:
            s.close()
            dp.close()
    assert len(frames) > 3 * port.ring.frames and port.ring.frames == (rxring.FRAMES if ring == "default" else 1010)
    assert [g[14:18] for g in got] == [f.tobytes()[14:18] for f in frames]
    assert port.rx == eng.stats.rx == len(frames) == int(port.ring.head[0])


def test_a_port_leaves_out_frames_sent_on_its_interface_where_the_kernel_hands_them_back():
    """Before Linux 4.20 (no PACKET_IGNORE_OUTGOING) a packet socket's ring also gets the frames
    other sockets send on its interface (PACKET_OUTGOING); the port drops them by the slot's packet
    type, and only then: with the filter off they would be taken for received frames."""
    from softswitch.ports import PACKET_IGNORE_OUTGOING, SOL_PACKET

    out, came = MACS + b"\x88\xb5" + body(50, 1), MACS + b"\x88\xb5" + body(60, 2)
    with testbed.Testbed("bio") as bed:
        h = bed.add(H1)
        port = Port(1, h.switch_iface)
        other, s = testbed.raw_socket(h.switch_iface), h.socket()
        try:
            port.sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 0)
            results = {}
            for filtered in (True, False):
                port.filter_outgoing = filtered
                other.send(out)
                assert drain(s, 1) == [out]
                s.send(came)
                results[filtered] = receive_all(port, 1 if filtered else 2)
        finally:
            other.close()
            s.close()
            port.close()
    assert results == {True: [came], False: [out, came]}


def test_frames_past_a_full_ring_are_counted_as_the_kernels_drops():
    """A port that does not read while 5,000 frames arrive keeps what its ring holds (4,096 slots)
    and the kernel counts the rest (`RxRing.dropped`, reported when the switch stops): every
    frame is either received, in order, or counted."""
    from mindp import rxring

    n = rxring.FRAMES + 904
    frames = np.zeros((n, 64), np.uint8)
    frames[:, :14] = np.frombuffer(MACS + b"\x88\xb5", np.uint8)
    frames[:, 14:18] = np.arange(n, dtype=">u4").view(np.uint8).reshape(-1, 4)
    with testbed.Testbed("bio") as bed:
        h = bed.add(H1)
        port = Port(1, h.switch_iface)
        s = h.socket()
        try:
            for i in range(0, n, 1000):
                assert rawsock.send_rows(s, frames, range(i, min(i + 1000, n)))[1] == 0
            got = receive_all(port, rxring.FRAMES, capacity=64)
            dropped = port.ring.dropped()
            assert port.ring.dropped() == 0, "reading resets the count"
        finally:
            s.close()
            port.close()
    assert len(got) == rxring.FRAMES and dropped == n - rxring.FRAMES
    assert [g[14:18] for g in got] == [f.tobytes()[14:18] for f in frames[:rxring.FRAMES]]


def test_after_a_link_goes_down_and_up_the_packet_loop_waits_and_forwards_again():
    """A port's link goes down: its socket reports ENETDOWN (epoll: an error) until the error is
    read, which a ring receive never does; the running packet loop reads it, so epoll stops
    reporting the port (the loop would spin otherwise), and a frame sent once the link is back is
    forwarded (the exprs program reflects it)."""
    from .engines import engine

    sent = MACS + b"\x88\xb5" + struct.pack("!HHhhBB", 7, 1, -7, 7, 7, 0)
    with testbed.Testbed("bio") as bed:
        h = bed.add(H1)
        port = Port(1, h.switch_iface)
        s = h.socket()
        dp = DataPlane(engine("exprs", "compiled"), {1: port})
        loop = threading.Thread(target=dp.run, daemon=True)
        loop.start()
        watch = select.epoll()
        watch.register(port.fileno(), select.EPOLLIN)
        try:
            testbed.sh("ip", "link", "set", h.switch_iface, "down")  # the error is set before this returns
            progress.wait(lambda: not watch.poll(0), lambda: 0, stall=progress.STALL, what="the error read")
            testbed.quiet_veths((h.switch_iface, None))
            s.send(sent)
            got = drain(s, 1)
        finally:
            dp.stop()
            loop.join()
            watch.close()
            s.close()
            dp.close()
    assert len(got) == 1 and got[0][14:18] == sent[14:18]


@pytest.mark.skipif(mmsg.CALLS is None, reason="no sendmmsg on this platform")
def test_the_running_loop_with_receive_coalescing_forwards_every_frame():
    """The packet loop running with receive coalescing on, its hold (20 ms) far longer than a
    burst takes to come, so bursts wait in the rings between serves: 4,000 numbered frames in
    bursts of 1,000 from two hosts at once, then a lone frame, each reflected by the exprs program:
    every frame back once, in order, on its own port."""
    from softswitch.dataplane import RxCoalesce

    from .engines import engine

    bursts, each = 4, 1000
    frames = np.zeros((bursts * each + 1, 24), np.uint8)
    frames[:, :14] = np.frombuffer(MACS + b"\x88\xb5", np.uint8)
    frames[:, 14:18] = np.arange(len(frames), dtype=">u4").view(np.uint8).reshape(-1, 4)
    got = {1: [], 2: []}
    with testbed.Testbed("bio") as bed:
        nets = {1: bed.add(H1), 2: bed.add(H2)}
        ports = {n: Port(n, h.switch_iface) for n, h in nets.items()}
        socks = {n: h.socket() for n, h in nets.items()}
        dp = DataPlane(engine("exprs", "compiled"), ports, coalesce=RxCoalesce(usecs=20_000, frames=1))
        loop = threading.Thread(target=dp.run, daemon=True)
        loop.start()
        try:
            for b in range(bursts + 1):
                rows = range(b * each, min((b + 1) * each, len(frames)))
                for s in socks.values():
                    assert rawsock.send_rows(s, frames, rows) == (len(rows), 0)
                for n, s in socks.items():
                    got[n] += drain(s, len(rows))
        finally:
            dp.stop()
            loop.join()
            for s in socks.values():
                s.close()
            dp.close()
    assert dp.engine.stats.rx == 2 * len(frames)
    for n in got:
        assert [g[14:18] for g in got[n]] == [f.tobytes()[14:18] for f in frames]
        assert ports[n].rx == ports[n].tx == len(frames)
