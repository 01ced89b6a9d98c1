"""The small P4 programs of the executor tests, compiled with p4c and committed.

    python -m tests.softswitch.compiled      # recompile all and record source hashes

Each programs/<name>.p4 has <name>.json (BMv2), <name>.p4info.txtpb and
<name>.sha256 (SHA-256 of the source that produced them) committed next to it.
"""
from __future__ import annotations

import hashlib
import pathlib
import subprocess
import sys

from mindp.targets import find_tool

DIR = pathlib.Path(__file__).resolve().parent / "programs"
NAMES = sorted(p.stem for p in DIR.glob("*.p4"))


def source_hash(name: str) -> str:
    return hashlib.sha256((DIR / f"{name}.p4").read_bytes()).hexdigest()


def json_path(name: str) -> pathlib.Path:
    return DIR / f"{name}.json"


def p4info_path(name: str) -> pathlib.Path:
    return DIR / f"{name}.p4info.txtpb"


def compile_program(name: str, outdir: pathlib.Path, p4c: str) -> None:
    """p4c-bm2-ss run from programs/ with a relative source path, so output is reproducible."""
    subprocess.run([p4c, "--p4runtime-files", str(outdir / f"{name}.p4info.txtpb"),
                    "-o", str(outdir / f"{name}.json"), f"{name}.p4"],
                   cwd=DIR, check=True, capture_output=True, text=True)


def main() -> int:
    p4c = find_tool("p4c-bm2-ss")
    if not p4c:
        print("p4c-bm2-ss not found (PATH or /opt/p4tools/bin)", file=sys.stderr)
        return 1
    for name in NAMES:
        compile_program(name, DIR, p4c)
        (DIR / f"{name}.sha256").write_text(source_hash(name) + "\n")
        print(f"compiled {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
