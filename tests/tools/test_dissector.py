"""The Wireshark dissector (tools/mindp.lua): generated from mindp/protocol.py, and tshark
decodes real mindp frames with it (Debian's tshark; the test is skipped where it is missing)."""
from __future__ import annotations

import pathlib
import struct
import subprocess

import numpy as np
import pytest

from mindp import codec, progress
from mindp.protocol import SCALE_BITS, Flag, K, Kind
from tools import gen_dissector

from .dissector import TSHARK, tshark

needs_tshark = pytest.mark.skipif(TSHARK is None, reason="tshark not installed (make setup installs it)")
FIELDS = ("mindp.kind", "mindp.job", "mindp.worker", "mindp.slot", "mindp.ver", "mindp.step", "mindp.chunk",
          "mindp.flags", "mindp.count", "mindp.nworkers", "mindp.value")
REPO = pathlib.Path(__file__).resolve().parents[2]
ADDRS = codec.Addresses("02:00:00:00:00:01", "02:00:00:00:00:03", "10.0.0.1", "10.0.0.3")


def test_committed_dissector_equals_a_fresh_generation():
    assert gen_dissector.OUT.read_text() == gen_dissector.render(), "run python -m tools.gen_dissector"
    assert gen_dissector.main(["--check"]) == 0


def test_check_reports_a_stale_dissector(tmp_path, capsys):
    stale = tmp_path / "mindp.lua"
    stale.write_text(gen_dissector.render().replace("49374", "49375"))
    assert gen_dissector.main(["--check", "--out", str(stale)]) == 1
    assert "stale" in capsys.readouterr().err


def write_pcap(path: pathlib.Path, frames) -> None:
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))  # Ethernet
        for i, fr in enumerate(frames):
            f.write(struct.pack("<IIII", 1_700_000_000 + i, 0, len(fr), len(fr)) + fr.tobytes())


@needs_tshark
def test_tshark_decodes_header_fields_fp16_and_sums(tmp_path):
    grad = np.zeros((1, K), dtype=np.float16)
    grad[0, :3] = [1.5, -2.0 ** -24, np.inf]
    sums = np.zeros((1, K), dtype=np.int64)
    sums[0, :3] = [3 << SCALE_BITS, -(1 << 40), 1]
    grad_hdr = codec.header_array(1, job=7, worker=5, slot=9, ver=1, step=123456, chunk=70000,
                                  flags=Flag.NONFINITE | Flag.RETRANSMIT, count=3)
    sum_hdr = codec.header_array(1, job=7, worker=1, slot=2, ver=0, step=4, chunk=2, nworkers=3, count=K)
    frames = [*codec.encode(Kind.GRAD, grad_hdr, grad, ADDRS), *codec.encode(Kind.SUM, sum_hdr, sums, ADDRS)]
    pcap = tmp_path / "frames.pcap"
    write_pcap(pcap, frames)
    g, s = tshark(pcap, *FIELDS)
    assert g[:10] == ["1", "7", "5", "9", "1", "123456", "70000", "0x03", "3", "0"]
    grad_values = [float(v) for v in g[10].split(",")]  # count 3: only the valid elements
    assert grad_values == pytest.approx([1.5, -(2.0 ** -24), float("inf")], rel=1e-12)
    assert s[:10] == ["2", "7", "1", "2", "0", "4", "2", "0x00", str(K), "3"]
    values = [float(v) for v in s[10].split(",")]
    assert len(values) == K and values[:3] == pytest.approx([3.0, -(2.0 ** 16), 2.0 ** -24], rel=1e-12)  # sum * 2^-24
    (raw,) = tshark(pcap, "mindp.sum", filt="mindp.kind == 2")
    assert raw[0].split(",")[:3] == [str(3 << SCALE_BITS), str(-(1 << 40)), "1"]
    (flags,) = tshark(pcap, "mindp.flags.nonfinite", "mindp.flags.retransmit", filt="mindp.kind == 1")
    assert flags == ["1", "1"]


@needs_tshark
def test_make_wireshark_installs_the_plugin_tshark_loads_by_itself(tmp_path):
    home = tmp_path / "home"
    proc = subprocess.run(["make", "-s", "wireshark", f"HOME={home}"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    plugin = home / ".local" / "lib" / "wireshark" / "plugins" / "mindp.lua"
    assert plugin.read_text() == gen_dissector.OUT.read_text()
    pcap = tmp_path / "p.pcap"
    hdr = codec.header_array(1, job=3, worker=2, step=9, chunk=4, count=K)
    write_pcap(pcap, codec.encode(Kind.PARAM, hdr, np.ones((1, K), dtype=np.float16), ADDRS))
    out = progress.run([TSHARK, "-r", str(pcap), "-Y", "mindp", "-T", "fields", "-e", "mindp.kind", "-e",
                          "mindp.job", "-e", "mindp.step"], capture_output=True, text=True,
                         env={"HOME": str(home), "PATH": "/usr/bin:/bin"})
    assert out.stdout.split() == ["3", "3", "9"], out.stderr


def test_an_out_that_cannot_be_written_or_read_is_refused_in_one_line(tmp_path, capsys):
    missing = tmp_path / "nonexistent" / "x.lua"
    assert gen_dissector.main(["--out", str(missing)]) == 2
    assert gen_dissector.main(["--check", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"gen_dissector: cannot write {missing}: No such file or directory",
        f"gen_dissector: cannot read {tmp_path}: Is a directory"]
