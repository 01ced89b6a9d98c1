"""The embedded switch's cache on disk: $XDG_CACHE_HOME/mindp/softswitch (default ~/.cache/...).
It keeps what a start would otherwise recompute from a program: the shared object of its C, the
index from a program's JSON to that object, and the Python path's bytecode. Entries are named by a
SHA-256 of everything they depend on and written atomically, so concurrent starts never see half
a file and a stale entry is never found, only left behind. Entries read and written here carry the
SHA-256 of their data, so a damaged one reads as absent; the shared objects are build.py's own."""
from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import tempfile


def cache_dir() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "mindp" / "softswitch"


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """SHA-256 of the softswitch package's own sources: an entry derived by this code from a program
    (not from generated text, which names what made it) is keyed by it."""
    root = pathlib.Path(__file__).parent
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".h")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def read(name: str) -> bytes | None:
    """The entry's data, or None if it is absent or damaged (its digest does not match)."""
    try:
        stored = (cache_dir() / name).read_bytes()
    except OSError:
        return None
    digest, data = stored[:32], stored[32:]
    return data if hashlib.sha256(data).digest() == digest else None


def write(name: str, data: bytes) -> None:
    """Best effort: a cache that cannot be written (read-only home, full disk) costs time, not a start."""
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(hashlib.sha256(data).digest() + data)
            os.replace(tmp, directory / name)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass
