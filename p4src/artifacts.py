"""The committed compiled program: paths, source hash, and the p4c call.

    python -m p4src.artifacts compile [--p4c PATH]   # regenerate, compile, record hash
    python -m p4src.artifacts check                  # exit 1 if sources changed since

The BMv2 JSON and P4Info in p4src/compiled/ are committed with the SHA-256 of
the P4 sources that produced them, so machines without p4c run the real program.
A stale artifact is refused, not silently used: by `make p4` without p4c, by
`make run` before it loads the committed program, and by the tests.
"""
from __future__ import annotations

import argparse
import hashlib
import pathlib
import shutil
import subprocess
import sys
import tempfile

from mindp.targets import find_tool

HERE = pathlib.Path(__file__).resolve().parent
COMPILED = HERE / "compiled"
BMV2_JSON = COMPILED / "mindp.json"
P4INFO = COMPILED / "mindp.p4info.txtpb"
HASH_FILE = COMPILED / "mindp.sources.sha256"
MAIN = HERE / "mindp.p4"


def sources(root: pathlib.Path = HERE) -> list[pathlib.Path]:
    return sorted(list(root.glob("*.p4")) + list((root / "generated").glob("*.p4")))


def source_hash(root: pathlib.Path = HERE) -> str:
    digest = hashlib.sha256()
    for path in sources(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def recorded_hash(root: pathlib.Path | None = None) -> str | None:
    hash_file = HASH_FILE if root is None else root / "compiled" / HASH_FILE.name
    try:
        return hash_file.read_text().split()[0]
    except (OSError, IndexError):
        return None


def staleness(root: pathlib.Path | None = None) -> str | None:
    """Why p4src/compiled/ is not the program of the sources in `root` (default p4src/), or None.

    The generated files are compared with a fresh generation first, so a change to
    mindp/protocol.py or gen_p4.py is caught as well as an edit of a .p4 file.
    """
    from . import gen_p4

    root = root or HERE
    stale = sorted(name for name, text in gen_p4.render().items()
                   if not (root / "generated" / name).exists() or (root / "generated" / name).read_text() != text)
    if stale:
        return f"p4src/generated/{', '.join(stale)} differ from mindp/protocol.py and p4src/gen_p4.py"
    recorded = recorded_hash(root)
    if recorded is None:
        return "p4src/compiled/ has no recorded source hash"
    if recorded != source_hash(root):
        return "the P4 sources in p4src/ changed since p4src/compiled/ was compiled"
    return None


P4C_HINT = "install p4c (p4c-bm2-ss on PATH or in /opt/p4tools/bin; README.md, 'BMv2 and p4c')"


def find_p4c() -> str | None:
    return find_tool("p4c-bm2-ss")


def compile_program(p4c: str, main: pathlib.Path, json_out: pathlib.Path, p4info_out: pathlib.Path) -> None:
    """Run p4c-bm2-ss; raises RuntimeError with p4c's own message on failure.

    p4c runs from the directory above p4src/ with a relative path, so the source
    file names recorded in the JSON do not depend on where the clone lives.
    """
    main = pathlib.Path(main).resolve()
    cwd = main.parent.parent
    cmd = [p4c, "--std", "p4-16", "--arch", "v1model", "-o", str(pathlib.Path(json_out).resolve()),
           "--p4runtime-files", str(pathlib.Path(p4info_out).resolve()), str(main.relative_to(cwd))]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if proc.returncode != 0:
        raise RuntimeError(f"p4c failed:\n{proc.stderr.strip()}")
    warnings = proc.stderr.strip()
    if warnings:
        print(warnings, file=sys.stderr)


def compile_and_record(p4c: str) -> None:
    from . import gen_p4

    gen_p4.main([])
    COMPILED.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        json_tmp, info_tmp = pathlib.Path(tmp) / "mindp.json", pathlib.Path(tmp) / "mindp.p4info.txtpb"
        compile_program(p4c, MAIN, json_tmp, info_tmp)
        shutil.copyfile(json_tmp, BMV2_JSON)
        shutil.copyfile(info_tmp, P4INFO)
    proc = subprocess.run([p4c, "--version"], capture_output=True, text=True)
    version = next((line for line in (proc.stdout + proc.stderr).splitlines() if "Version" in line), "p4c").strip()
    HASH_FILE.write_text(f"{source_hash()}  {version}\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Compile mindp.p4 or check the committed artifacts")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile", help="regenerate, compile with p4c-bm2-ss and record the source hash")
    c.add_argument("--p4c", default=None, help="path of p4c-bm2-ss (default: PATH, then /opt/p4tools/bin)")
    sub.add_parser("check", help="exit 1 if the P4 sources changed since the artifacts were compiled")
    args = ap.parse_args(argv)
    if args.cmd == "compile":
        p4c = args.p4c or find_p4c()
        if not p4c:
            why = staleness()
            if why:
                print(f"make p4: {why}, and p4c-bm2-ss is not installed to recompile them: {P4C_HINT}, "
                      f"then run make p4 (or undo the change: git diff p4src/)", file=sys.stderr)
                return 1
            print("p4c-bm2-ss not found: p4src/compiled/ matches the P4 sources and is kept", file=sys.stderr)
            return 0
        try:
            compile_and_record(p4c)
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
            return 1
        print(f"compiled {MAIN.name} -> {BMV2_JSON.relative_to(HERE.parent)}, {P4INFO.relative_to(HERE.parent)}")
        return 0
    why = staleness()
    if why:
        print(f"p4src/compiled/ is stale: {why}; run `make p4` with p4c installed", file=sys.stderr)
        return 1
    print("p4src/compiled/ matches the P4 sources")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
