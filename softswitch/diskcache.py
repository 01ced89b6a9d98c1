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
import stat
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


#: Above this many bytes in all, a write removes the entries used longest ago (each start of a
#: program at K = 1,024 keeps ~5 MB here; a new version of the switch's code makes new entries).
BUDGET = 256 << 20


def read(name: str) -> bytes | None:
    """The entry's data, or None if it is absent or damaged (its digest does not match)."""
    path = cache_dir() / name
    try:
        stored = path.read_bytes()
    except OSError:
        return None
    digest, data = stored[:32], stored[32:]
    if hashlib.sha256(data).digest() != digest:
        return None
    used(path)
    return data


def used(path: pathlib.Path) -> None:
    """Mark an entry as just used: the budget removes the entries used longest ago first."""
    try:
        os.utime(path)
    except OSError:
        pass


def write(name: str, data: bytes) -> None:
    """Best effort: a cache that cannot be written (read-only home, full disk) costs time, not a start."""
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(hashlib.sha256(data).digest() + data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, directory / name)
        except BaseException:
            os.unlink(tmp)
            raise
        prune(directory)
    except OSError:
        pass


def prune(directory: pathlib.Path) -> None:
    """Remove the entries used longest ago (build.py's objects too) until the cache fits BUDGET.
    A running switch keeps an object it loaded (the file goes, its mapping stays)."""
    entries = []
    for path in directory.iterdir():
        try:
            st = path.stat()
        except OSError:
            continue  # removed meanwhile by another start
        if stat.S_ISREG(st.st_mode) and not path.name.startswith("."):  # not a write or build under way
            entries.append((st.st_mtime, st.st_size, path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries, key=lambda e: e[0]):
        if total <= BUDGET:
            break
        try:
            path.unlink()
        except OSError:
            continue
        total -= size
