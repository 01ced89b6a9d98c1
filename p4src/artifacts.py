"""The committed compiled programs, one per K: paths, source hash, and the p4c call.

    python -m p4src.artifacts compile [--k K] [--p4c PATH]   # generate, compile, record hash
    python -m p4src.artifacts check [--k K]                  # exit 1 if sources changed since

K (elements per frame) is a parameter of a switch build (docs/PROTOCOL.md, "Choosing K"). The
BMv2 JSON and P4Info of each committed K live in p4src/compiled/k<K>/ with the SHA-256 of the
sources that produced them (the hand-written .p4 files and the text gen_p4 makes for that K), so
machines without p4c run the real program. A stale artifact is refused, not silently used: by
`make p4` without p4c, by `make run` before it loads the committed program, and by the tests.
The generated files are written to p4src/build/k<K>/generated/ for p4c (and for reading).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from mindp import protocol as P
from mindp.targets import find_tool

HERE = pathlib.Path(__file__).resolve().parent
COMPILED = HERE / "compiled"
MAIN = HERE / "mindp.p4"
#: The K of every committed program: the hardware-faithful size (BMv2's default) and the
#: embedded switch's default.
COMMITTED_K = tuple(sorted({P.HARDWARE_K, P.DEFAULT_K}))


@dataclass(frozen=True)
class Program:
    """Where the compiled program for one K lives under a p4src/ tree."""

    k: int
    root: pathlib.Path = HERE

    @property
    def dir(self) -> pathlib.Path:
        return self.root / "compiled" / f"k{self.k}"

    @property
    def json(self) -> pathlib.Path:
        return self.dir / "mindp.json"

    @property
    def p4info(self) -> pathlib.Path:
        return self.dir / "mindp.p4info.txtpb"

    @property
    def hash_file(self) -> pathlib.Path:
        return self.dir / "mindp.sources.sha256"

    def exists(self) -> bool:
        return self.json.exists() and self.p4info.exists()


def program(k: int | None = None) -> Program:
    return Program(P.K if k is None else k, HERE)


# The program of this process's K (mindp.protocol.K, from MINDP_K).
BMV2_JSON = program().json
P4INFO = program().p4info
HASH_FILE = program().hash_file


def hand_written(root: pathlib.Path = HERE) -> list[pathlib.Path]:
    return sorted(root.glob("*.p4"))


def source_hash(root: pathlib.Path | None = None, k: int | None = None) -> str:
    """SHA-256 over the hand-written sources, the generated text for k (so a change to
    mindp/protocol.py, switch_constants.py or gen_p4.py changes it too) and p4c's options."""
    from . import gen_p4

    root, k = root or HERE, P.K if k is None else k
    digest = hashlib.sha256()
    digest.update(f"K={k}\0".encode())
    digest.update(" ".join(p4c_flags(k)).encode() + b"\0")
    for path in hand_written(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    for name, text in sorted(gen_p4.render(k).items()):
        digest.update(f"generated/{name}\0".encode() + text.encode() + b"\0")
    return digest.hexdigest()


def recorded_hash(root: pathlib.Path | None = None, k: int | None = None) -> str | None:
    try:
        return Program(P.K if k is None else k, root or HERE).hash_file.read_text().split()[0]
    except (OSError, IndexError):
        return None


def staleness(root: pathlib.Path | None = None, k: int | None = None) -> str | None:
    """Why p4src/compiled/k<K>/ is not the program of the sources in `root` (default p4src/), or None."""
    k = P.K if k is None else k
    if not Program(k, root or HERE).exists():
        return f"p4src/compiled/k{k}/ holds no program (committed: K = {', '.join(map(str, COMMITTED_K))})"
    recorded = recorded_hash(root, k)
    if recorded is None:
        return f"p4src/compiled/k{k}/ has no recorded source hash"
    if recorded != source_hash(root, k):
        return f"the P4 sources in p4src/ changed since p4src/compiled/k{k}/ was compiled"
    return None


def program_k(bmv2_json: dict) -> int | None:
    """The K a compiled program was built for (its fp16 chunk's field count), None if not mindp's."""
    for t in bmv2_json.get("header_types", ()):
        if isinstance(t, dict) and t.get("name") == "fp16_chunk_t":
            return len(t.get("fields", ()))
    return None


P4C_HINT = "install p4c (p4c-bm2-ss on PATH or in /opt/p4tools/bin; README.md, 'BMv2 and p4c')"


def find_p4c() -> str | None:
    return find_tool("p4c-bm2-ss")


def generate(root: pathlib.Path, k: int) -> pathlib.Path:
    """Write gen_p4's files for k under root/build/k<K>/generated/; returns the include directory."""
    from . import gen_p4

    include = root / "build" / f"k{k}"
    gen_p4.main(["--k", str(k), "--out", str(include / "generated")])
    return include


#: p4c-bm2-ss's options. The frontend's SimplifyDefUse keeps the definitions of every storage location
#: at every statement of a control (K fields by 8 K statements): it was p4c's peak memory (5.6 GB at
#: K = 512, 18 GB and growing at 1,024), and our program has nothing for it to remove (the JSON is
#: byte-identical without it), so it is always left out (docs/P4.md, "The program at large K").
P4C_FLAGS = ("--std", "p4-16", "--arch", "v1model", "--excludeFrontendPasses", "SimplifyDefUse")
#: The midend's LocalCopyPropagation merges each element's conversion into fewer, larger statements. Its
#: time grows about as K^2.8 (most of p4c's at K = 1,024), so a program BMv2 cannot run (K above
#: BMV2_MAX_K) is compiled without it: the same program with more, smaller statements and a JSON 27 %
#: smaller. Where BMv2 runs the program it stays: BMv2 interprets every statement, 7 % slower without.
LARGE_K_FLAGS = ("--excludeMidendPasses", "P4::LocalCopyPropagation")


def p4c_flags(k: int) -> tuple[str, ...]:
    """p4c-bm2-ss's options for the program of K elements a frame."""
    return P4C_FLAGS + (LARGE_K_FLAGS if k > P.BMV2_MAX_K else ())


def compile_program(p4c: str, main: pathlib.Path, json_out: pathlib.Path, p4info_out: pathlib.Path,
                    k: int | None = None) -> None:
    """Generate for k and run p4c-bm2-ss; raises RuntimeError with p4c's own message on failure.

    p4c runs from the directory above p4src/ with relative paths, so the file names recorded in the
    JSON do not depend on where the clone lives. The JSON is written without indentation (a quarter
    of p4c's pretty-printed size: it grows with K).
    """
    k = P.K if k is None else k
    main = pathlib.Path(main).resolve()
    cwd = main.parent.parent
    include = generate(main.parent, k)
    with tempfile.TemporaryDirectory() as tmp:
        pretty = pathlib.Path(tmp) / "mindp.json"
        cmd = [p4c, *p4c_flags(k), "-I", str(include.relative_to(cwd)),
               "-o", str(pretty), "--p4runtime-files", str(pathlib.Path(p4info_out).resolve()),
               str(main.relative_to(cwd))]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
        if proc.returncode != 0:
            raise RuntimeError(f"p4c failed:\n{proc.stderr.strip()}")
        pathlib.Path(json_out).write_text(json.dumps(json.loads(pretty.read_text()), separators=(",", ":")))
    warnings = proc.stderr.strip()
    if warnings:
        print(warnings, file=sys.stderr)


def compile_and_record(p4c: str, k: int) -> Program:
    prog = program(k)
    prog.dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        json_tmp, info_tmp = pathlib.Path(tmp) / "mindp.json", pathlib.Path(tmp) / "mindp.p4info.txtpb"
        compile_program(p4c, MAIN, json_tmp, info_tmp, k)
        shutil.copyfile(json_tmp, prog.json)
        shutil.copyfile(info_tmp, prog.p4info)
    proc = subprocess.run([p4c, "--version"], capture_output=True, text=True)
    version = next((line for line in (proc.stdout + proc.stderr).splitlines() if "Version" in line), "p4c").strip()
    prog.hash_file.write_text(f"{source_hash(k=k)}  {version}\n")
    return prog


def _k_arg(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= P.MAX_K:
        raise argparse.ArgumentTypeError(f"K must be an integer in 1..{P.MAX_K}, not {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Compile mindp.p4 for a K or check the committed artifacts")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile", help="generate, compile with p4c-bm2-ss and record the source hash")
    c.add_argument("--k", type=_k_arg, action="append",
                   help=f"elements per frame; repeatable (default: every committed K, {COMMITTED_K})")
    c.add_argument("--p4c", default=None, help="path of p4c-bm2-ss (default: PATH, then /opt/p4tools/bin)")
    ch = sub.add_parser("check", help="exit 1 if the P4 sources changed since the artifacts were compiled")
    ch.add_argument("--k", type=_k_arg, action="append", help="default: every committed K")
    args = ap.parse_args(argv)
    ks = args.k or list(COMMITTED_K)
    stale = {k: why for k in ks if (why := staleness(k=k))}
    if args.cmd == "check":
        for why in stale.values():
            print(f"p4src/compiled/ is stale: {why}; run `make p4` with p4c installed", file=sys.stderr)
        if not stale:
            print(f"p4src/compiled/ matches the P4 sources (K = {', '.join(map(str, ks))})")
        return 1 if stale else 0
    p4c = args.p4c or find_p4c()
    if not p4c:
        if stale:
            why = next(iter(stale.values()))
            print(f"make p4: {why}, and p4c-bm2-ss is not installed to recompile it: {P4C_HINT}, "
                  f"then run make p4 (or undo the change: git diff p4src/)", file=sys.stderr)
            return 1
        print("p4c-bm2-ss not found: p4src/compiled/ matches the P4 sources and is kept", file=sys.stderr)
        return 0
    for k in ks:
        try:
            prog = compile_and_record(p4c, k)
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
            return 1
        size = prog.json.stat().st_size / 1e6
        print(f"compiled {MAIN.name} for K = {k} -> {prog.json.relative_to(HERE.parent)} ({size:.1f} MB), "
              f"{prog.p4info.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
