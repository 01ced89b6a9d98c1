"""The switch as a process on real interfaces: simple_switch_grpc command line,
AF_PACKET ports on veth pairs, pcap files, seeded fault injection, SIGTERM."""
import signal
import struct
import subprocess
import time

import pytest
from scapy.utils import rdpcap

from mindp import progress, targets
from mindp.harness import testbed
from mindp.harness.testbed import quiet_veths, raw_socket, sh
from mindp.topology import Host
from softswitch.batch import Batch
from softswitch.ports import Pcap, Port

from . import compiled

pytestmark = pytest.mark.net

PORTS = (1, 2)


SS = testbed.tagged("ss-")  # the interfaces' prefix, apart from concurrent test workers'


def sp(n: int) -> str:
    """The switch's port n."""
    return f"{SS}p{n}"


@pytest.fixture
def veths():
    """<SS>p<N> (the switch's port N) paired with <SS>h<N> (our end), root namespace."""
    for n in PORTS:
        sh("ip", "link", "del", sp(n), check=False)
        sh("ip", "link", "add", sp(n), "type", "veth", "peer", "name", f"{SS}h{n}")
    quiet_veths(*[(i, None) for n in PORTS for i in (sp(n), f"{SS}h{n}")])
    socks = {n: raw_socket(f"{SS}h{n}") for n in PORTS}
    yield socks
    for s in socks.values():
        s.close()
    for n in PORTS:
        sh("ip", "link", "del", sp(n), check=False)


def start(tmp_path, *extra, ports=None, program="exprs"):
    ports = ports or {n: sp(n) for n in PORTS}
    cfg = targets.SwitchConfig(ports=ports, grpc_addr=f"127.0.0.1:{targets.free_port()}",
                               json_path=str(compiled.json_path(program)), log_file=str(tmp_path / "switch.log"),
                               pcap_dir=str(tmp_path), fault_args=list(extra))
    return targets.SwitchProcess("embedded", cfg).start()


def frame(i: int) -> bytes:
    payload = struct.pack("!HHhhBB", i, 1, 0, 0, 0, 0)
    return b"\x02\x00\x00\x00\x00\x01\x02\x00\x00\x00\x00\x02\x88\xb5" + payload


def recv_all(sock, n: int | None = None, quiet: float = 0.3):
    """Frames arriving on sock: until `n` arrived (however slowly: it gives up only after
    progress.STALL s without a frame), then `quiet` s more for extras; without `n`, until none
    came for `quiet` s."""
    got, last = [], time.monotonic()
    while True:
        try:
            got.append(sock.recv(4096))
            last = time.monotonic()
            continue
        except BlockingIOError:
            pass
        if time.monotonic() - last > (progress.STALL if n is not None and len(got) < n else quiet):
            return got
        time.sleep(0.005)


def test_reflects_frames_writes_pcaps_and_stops_cleanly_on_sigterm(veths, tmp_path):
    sw = start(tmp_path)
    try:
        for i in range(20):
            veths[1].send(frame(i))
        got = recv_all(veths[1], 20)
        assert len(got) == 20 and not recv_all(veths[2], quiet=0.1)
        assert [struct.unpack("!H", g[24:26])[0] for g in got] == [(i + 1) & 0xFFFF for i in range(20)]
    finally:
        sw.proc.send_signal(signal.SIGTERM)
        assert progress.wait_process(sw.proc) == 0
    pin = rdpcap(str(tmp_path / f"{sp(1)}_in.pcap"))
    pout = rdpcap(str(tmp_path / f"{sp(1)}_out.pcap"))
    assert [bytes(p) for p in pin] == [frame(i) for i in range(20)]
    assert [bytes(p) for p in pout] == got
    assert len(rdpcap(str(tmp_path / f"{sp(2)}_in.pcap"))) == 0
    log = (tmp_path / "switch.log").read_text()
    assert "Traceback" not in log


@pytest.mark.parametrize("args,expect,check", [
    (["--drop-prob", "1"], None, lambda got: got == []),
    (["--dup-prob", "1"], 4 * 20, lambda got: len(got) == 4 * 20),  # duplicated on the way in and on the way out
    (["--reorder-prob", "0.5", "--seed", "3"], 20,
     lambda got: len(got) == 20 and [struct.unpack("!H", g[14:16])[0] for g in got] != list(range(20))),
])
def test_fault_injection(veths, tmp_path, args, expect, check):
    sw = start(tmp_path, *args)
    try:
        for i in range(20):
            veths[1].send(frame(i))
        got = recv_all(veths[1], expect, quiet=0.8)
        assert check(got), [g[14:16].hex() for g in got]
    finally:
        sw.stop()


def test_seeded_faults_are_reproducible(veths, tmp_path):
    runs = []
    for _ in range(2):
        sw = start(tmp_path, "--drop-prob", "0.3", "--seed", "11")
        try:
            for i in range(40):
                veths[1].send(frame(i))
                time.sleep(0.002)
            # Until it read all 40 (its capture of port 1's input, faults come after), then none for a while.
            pcap_in = tmp_path / f"{sp(1)}_in.pcap"
            full = len(Pcap.HEADER) + 40 * (16 + len(frame(0)))
            progress.wait(lambda: pcap_in.stat().st_size >= full, progress.file_sizes(pcap_in),
                          stall=progress.STALL, what="the switch reading 40 frames")
            runs.append([g[14:16] for g in recv_all(veths[1], quiet=0.5)])
            pcap_in.unlink()
        finally:
            sw.stop()
    assert runs[0] == runs[1] and 0 < len(runs[0]) < 40


def test_missing_interface_and_bad_arguments(veths, tmp_path):
    sw = start(tmp_path, ports={1: sp(1), 3: f"{SS}nonexist"})
    try:
        veths[1].send(frame(1))
        assert len(recv_all(veths[1], 1)) == 1, "the other ports keep working"
    finally:
        sw.stop()
    assert f"{SS}nonexist" in (tmp_path / "switch.log").read_text()
    py = targets.command("embedded", targets.SwitchConfig(ports={}))[:3]
    for bad in (["-i", "x@y", "--no-p4"], ["-i", "1@a", "-i", "1@b", "--no-p4"], ["--drop-prob", "2", "--no-p4"],
                [str(tmp_path / "missing.json")], []):
        r = progress.run(py + bad, capture_output=True, text=True)
        assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, (bad, r.stderr)
        assert "Traceback" not in r.stderr


def test_a_vlan_tag_reaches_the_program_as_it_was_on_the_wire(tmp_path):
    """The kernel strips the outer tag of a received frame; the port restores it from PACKET_AUXDATA,
    so the switch sees (and captures) the sender's bytes: 802.1Q, priority tag (VID 0) and QinQ."""
    macs = b"\x02\x00\x00\x00\x00\x02\x02\x00\x00\x00\x00\x01"
    body = b"\x88\xb5" + bytes(range(40))
    sent = [macs + b"\x81\x00\x20\x07" + body,                      # 802.1Q, PCP 1, VID 7
            macs + b"\x81\x00\x00\x00" + body,                      # priority tag, VID 0
            macs + b"\x88\xa8\x00\x64\x81\x00\x00\x07" + body,      # 802.1ad outer 100, inner 7
            macs + body]                                            # untagged: unchanged
    with testbed.Testbed("vt") as bed:
        h = bed.add(Host("h1", "02:00:00:00:00:01", "10.9.0.1", 1))
        port = Port(1, h.switch_iface, str(tmp_path))
        s = h.socket()
        try:
            for fr in sent:
                s.send(fr)
            got, rx = [], Batch.empty(8)

            def all_in() -> bool:
                rx.n = 0
                port.receive(rx, 8)
                got.extend(rx.frame(i) for i in range(rx.n))
                return len(got) >= len(sent)

            progress.wait(all_in, lambda: len(got), stall=progress.STALL, what="frames on the port", poll=0.01)
        finally:
            s.close()
            port.close()
    assert got == sent
    assert [bytes(p) for p in rdpcap(str(tmp_path / f"{h.switch_iface}_in.pcap"))] == sent


@pytest.mark.parametrize("flags,where", [(["-L", "debug", "--log-console"], "console"),
                                         (["--log-level", "trace"], "file"),
                                         ([], "file")])
def test_log_flags_give_the_per_packet_trace_as_bmv2s_do(veths, tmp_path, flags, where):
    """BMv2's -L/--log-level, --log-console and --log-file: at debug/trace each packet's path is logged
    (nothing per packet at the default level)."""
    logfile = tmp_path / "switch.log"
    console = tmp_path / "stderr.txt"
    cfg = targets.SwitchConfig(ports={n: sp(n) for n in PORTS}, grpc_addr=f"127.0.0.1:{targets.free_port()}",
                               thrift_port=targets.free_port(), json_path=str(compiled.json_path("exprs")),
                               log_file=str(logfile) if where == "file" else None)
    with open(console, "wb") as err:
        proc = subprocess.Popen([*targets.command("embedded", cfg)[:3], *flags, *cfg.args()], stderr=err,
                                stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        progress.wait(lambda: targets.grpc_port_open(cfg.grpc_addr), progress.activity(proc.pid),
                      stall=progress.STALL, what="switch start")
        veths[1].send(frame(7))
        # Ours only: once (CI) 16 late frames of an earlier test on these port names came too.
        got = []

        def ours() -> list:
            got.extend(recv_all(veths[1], quiet=0.05))
            return [f for f in got if f[14:16] == frame(7)[14:16]]

        progress.wait(ours, lambda: len(got), stall=progress.STALL, what="the frame back")
        got += recv_all(veths[1], quiet=0.3)
        assert len(ours()) == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert progress.wait_process(proc) == 0
    text = (logfile if where == "file" else console).read_text()
    packet_lines = [x for x in text.splitlines() if "pkt 1: " in x]
    if flags:
        assert any("pkt 1: 24 bytes in on port 1" in x for x in packet_lines), text
        assert any("parser state" in x for x in packet_lines) and "out on port 1" in packet_lines[-1], text
    else:
        assert packet_lines == [], "no per-packet lines at the default level"
    assert "Traceback" not in text


@pytest.fixture
def small_fs(tmp_path):
    """A 64 KiB tmpfs: the disk fills up after a few dozen frames."""
    d = tmp_path / "small"
    d.mkdir()
    sh("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(d))
    yield d
    sh("umount", "-l", str(d), check=False)


def test_a_full_disk_ends_the_capture_not_the_switch(veths, tmp_path, small_fs):
    cfg = targets.SwitchConfig(ports={n: sp(n) for n in PORTS}, grpc_addr=f"127.0.0.1:{targets.free_port()}",
                               thrift_port=targets.free_port(), json_path=str(compiled.json_path("exprs")),
                               log_file=str(tmp_path / "switch.log"), pcap_dir=str(small_fs))
    sw = targets.SwitchProcess("embedded", cfg).start()
    got = []
    try:
        for i in range(300):
            veths[1].send(frame(i) + bytes(1000))
            if i % 50 == 49:
                got += recv_all(veths[1], quiet=0.3)
        got += recv_all(veths[1], 300 - len(got))
        assert len(got) == 300, "every frame forwarded while and after the capture failed"
    finally:
        sw.proc.send_signal(signal.SIGTERM)
        assert progress.wait_process(sw.proc) == 0
    log = (tmp_path / "switch.log").read_text()
    errors = [x for x in log.splitlines() if "pcap" in x and "capture of this port stopped" in x]
    assert len(errors) == 1 and f"port 1 ({sp(1)})" in errors[0] and "No space left on device" in errors[0], log
    assert "pcap errors on port 1" in log and "Traceback" not in log


def test_pcap_into_a_directory_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("")
    cmd = targets.command("embedded", targets.SwitchConfig(ports={}, grpc_addr=f"127.0.0.1:{targets.free_port()}",
                                                           pcap_dir=str(tmp_path / "afile" / "pcaps")))
    r = progress.run(cmd, capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip() == f"mindp-softswitch: --pcap {tmp_path}/afile/pcaps: cannot create the directory: Not a directory"
    missing = tmp_path / "new" / "pcaps"
    sw = targets.SwitchProcess("embedded", targets.SwitchConfig(
        ports={}, grpc_addr=f"127.0.0.1:{targets.free_port()}", thrift_port=targets.free_port(),
        pcap_dir=str(missing))).start()
    sw.stop()
    assert missing.is_dir(), "a missing directory is created, as for a run's logs"
