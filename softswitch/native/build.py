"""Build generated C into a shared object with the system C compiler, cached on disk by the hash of
the source (which holds the generator version), and load it. The cache (softswitch.diskcache) holds
<sha256>.so and the <sha256>.c it came from, and <sha256>.program: the object a program's JSON
built, so that a later start of the same program generates no C at all."""
from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile

from .. import diskcache
from .cprogram import GENERATOR_VERSION

# -O3: its loop unswitching takes a per-element loop's register bound check (the same cell every time
# round) out of the loop, which vectorises it (the pipeline alone at K = 512: 1.14x -O2's packets/s, at
# K = 32 no change; the rolled code builds in half a second either way). The per-element loops (croll)
# are vectorised for this machine's CPU (-march=native, and the cost model that weighs a loop's
# remainder instead of refusing it): the cache key names the CPU, so a cache shared with another
# machine never hands it code for instructions it lacks.
CFLAGS = ("-O3", "-march=native", "-fvect-cost-model=dynamic", "-shared", "-fPIC", "-fno-strict-aliasing", "-w")
COMPILE_TIMEOUT = 300  # seconds


class BuildError(Exception):
    """No compiler, or the compiler failed: one line saying which."""


def cpu() -> str:
    """What -march=native builds for: the CPU's model and feature flags (Linux), else nothing."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line.strip() for line in f if line.startswith(("model name", "flags"))]
    except OSError:
        return ""
    return "\n".join(dict.fromkeys(lines))


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def build(source: str) -> pathlib.Path:
    """The shared object of `source`, compiled now or found in the cache."""
    key = hashlib.sha256(f"{GENERATOR_VERSION}\0{' '.join(CFLAGS)}\0{cpu()}\0".encode() + source.encode()).hexdigest()
    directory = diskcache.cache_dir()
    target = directory / f"{key}.so"
    if target.exists():
        diskcache.used(target)
        return target
    cc = compiler()
    if cc is None:
        raise BuildError("no C compiler (cc) found")
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        src = pathlib.Path(tmp) / "program.c"
        src.write_text(source)
        out = pathlib.Path(tmp) / "program.so"
        try:
            done = subprocess.run([cc, *CFLAGS, "-o", str(out), str(src)], capture_output=True, text=True,
                                  timeout=COMPILE_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BuildError(f"{cc}: {exc}") from None
        if done.returncode != 0:
            first = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr.strip()[:200])
            raise BuildError(f"{cc} failed: {first}")
        os.replace(src, target.with_suffix(".c"))  # kept beside it, to read when debugging
        os.replace(out, target)  # atomic: a concurrent start sees the whole file or none
    return target


def _program_entry(digest: str, drop_port: int) -> str:
    """The index entry of a program: its JSON, drop port, this code, the flags and the CPU."""
    key = f"{diskcache.code_version()}\0{' '.join(CFLAGS)}\0{cpu()}\0{drop_port}\0{digest}"
    return hashlib.sha256(key.encode()).hexdigest() + ".program"


def built_for(digest: str | None, drop_port: int) -> pathlib.Path | None:
    """The shared object an earlier start built from the program of JSON `digest`, if still cached."""
    if digest is None:
        return None
    name = (diskcache.read(_program_entry(digest, drop_port)) or b"").decode("ascii", "replace")
    if not name.endswith(".so") or "/" in name:
        return None
    target = diskcache.cache_dir() / name
    if not target.exists():
        return None
    diskcache.used(target)
    return target


def remember(digest: str | None, drop_port: int, target: pathlib.Path) -> None:
    if digest is not None:
        diskcache.write(_program_entry(digest, drop_port), target.name.encode("ascii"))


def load(path: pathlib.Path):
    """The library and its batch entry point (its packet loop: `lib.mindp_serve`). PyDLL keeps the
    GIL during a call, so no control-plane write made in Python runs while a batch is being
    processed: writes land between batches."""
    lib = ctypes.PyDLL(str(path))
    fn = lib.mindp_run_batch
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 3 + [ctypes.c_int64] + \
        [ctypes.c_void_p] * 2
    lib.mindp_serve.restype = ctypes.c_int64
    lib.mindp_serve.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return lib, fn
