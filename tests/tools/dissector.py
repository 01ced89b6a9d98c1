"""tshark with the generated mindp dissector (tools/mindp.lua): where tshark is, and the fields it decodes
from a pcap."""
from __future__ import annotations

import pathlib
import shutil

from mindp import progress
from tools import gen_dissector

TSHARK = shutil.which("tshark")


def tshark(pcap: pathlib.Path, *fields: str, filt: str = "mindp") -> list[list[str]]:
    cmd = [TSHARK, "-X", f"lua_script:{gen_dissector.OUT}", "-r", str(pcap), "-Y", filt, "-T", "fields",
           "-E", "separator=|", *[a for fld in fields for a in ("-e", fld)]]
    proc = progress.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return [line.split("|") for line in proc.stdout.splitlines() if line]
