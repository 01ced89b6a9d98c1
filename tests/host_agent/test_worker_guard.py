"""The worker on a real veth: a PARAM frame that carried a VLAN tag (stripped by the kernel,
reported in PACKET_AUXDATA) is refused; the CLI writes no --out after a failed step."""
import json
import signal
import subprocess
import struct
import sys

import numpy as np
import pytest

from host_agent import optim, rawsock
from host_agent.window import RtoConfig
from host_agent.worker import WorkerAgent, WorkerConfig, slot_and_version
from mindp import codec, progress
from mindp.harness import testbed
from mindp.protocol import K, Kind
from mindp.topology import star

pytestmark = pytest.mark.net


@pytest.fixture(scope="module")
def bed():
    topo = star([1], slots=8)
    with testbed.Testbed("hwg-") as b:
        b.add(topo.host("w1_0"))
        yield b, topo


def tagged(frame: bytes, tpid: int, vid: int) -> bytes:
    return frame[:12] + struct.pack("!HH", tpid, vid) + frame[12:]


def test_tagged_parameter_frames_are_refused(bed):
    b, topo = bed
    cfg = WorkerConfig.from_topology(topo, 1, 0, rto=RtoConfig(initial=1.0, deadline=5.0))
    lay = optim.layout_of({"a": np.zeros(3 * K, np.float32)})
    sock = b.hosts["w1_0"].socket()
    rawsock.prepare(sock)
    agent = WorkerAgent(cfg, lay, sock)
    assert agent.auxdata
    switch = testbed.raw_socket(b.hosts["w1_0"].switch_iface)
    try:
        h = agent.start_step()
        h.put("a", np.ones(3 * K, np.float32))
        opt = topo.host("opt1")
        node = codec.Addresses(opt.mac, "ff:ff:ff:ff:ff:ff", opt.ip, "255.255.255.255")

        def param(chunk, value):
            slot, ver = slot_and_version(0, [chunk], lay.n_chunks, cfg.slots)
            hdr = codec.header_array(1, job=1, step=0, chunk=chunk, slot=slot, ver=ver)
            return codec.encode(Kind.PARAM, hdr, np.full((1, K), value, np.float16), node)[0].tobytes()

        for tpid in (0x8100, 0x88A8):
            switch.send(tagged(param(0, -50.0), tpid, 7))  # a forged answer on another VLAN
        h.pump(0.2)
        assert agent.stats["rejected_tagged"] == 2 and not h.window.done[0]
        for c in range(lay.n_chunks):
            switch.send(param(c, 0.5))
        params = h.wait()
        assert (params["a"] == np.float16(0.5)).all()
    finally:
        switch.close()
        sock.close()


def test_worker_cli_writes_no_out_after_a_failed_step(bed, tmp_path):
    b, topo = bed
    topo_path = tmp_path / "topo.json"
    topo.dump(topo_path)
    init = tmp_path / "init.npz"
    np.savez(init, a=np.zeros(K + 8, np.float32))  # 2 chunks
    out = tmp_path / "final.npz"
    stats = tmp_path / "w.json"
    p = progress.run(["ip", "netns", "exec", b.hosts["w1_0"].netns, sys.executable, "-m", "host_agent.worker",
                      "--topology", str(topo_path), "--job", "1", "--worker", "0", "--init", str(init), "--steps", "2",
                      "--deadline", "0.5", "--out", str(out), "--stats", str(stats)], capture_output=True, text=True)
    assert p.returncode == 1, p.stderr
    assert "no parameters for 2 chunk(s)" in p.stderr and "not written" in p.stderr
    assert "Traceback" not in p.stderr
    assert not out.exists()
    assert json.loads(stats.read_text())["failed_steps"] == 1


def test_worker_cli_interrupted_says_where_in_one_line_and_keeps_its_resume_file(bed, tmp_path):
    """Ctrl-C during a step (no switch answers here): one line naming the step, exit 130, the stats
    written, and the resume file left for --resume; no traceback."""
    b, topo = bed
    topo_path = tmp_path / "topo.json"
    topo.dump(topo_path)
    init = tmp_path / "init.npz"
    np.savez(init, a=np.zeros(K + 8, np.float32))
    resume, stats = tmp_path / "w.resume", tmp_path / "w.json"
    p = subprocess.Popen(["ip", "netns", "exec", b.hosts["w1_0"].netns, sys.executable, "-m", "host_agent.worker",
                          "--topology", str(topo_path), "--job", "1", "--worker", "0", "--init", str(init),
                          "--steps", "2", "--resume", str(resume), "--stats", str(stats)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         # as a terminal's foreground job: a suite started in the background by a
                         # shell without job control ignores SIGINT, and so would the worker
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:  # its first line once it is set up (`ip netns exec` execs: p.pid is the worker)
        assert p.stdout.readline().startswith("mindp-worker 0: job 1, 2 chunk(s) in 8 slot(s), from step 0")
        p.send_signal(signal.SIGINT)
        _, err = progress.communicate(p)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130 and err.strip() == "mindp-worker 0: interrupted in step 0", err
    assert json.loads(stats.read_text())["step_times"] == [] and resume.stat().st_size > 0
