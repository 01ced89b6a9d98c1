"""The optimizer node's out-of-core state, crash-consistent at every step boundary.

A state directory holds:

  meta.json       layout, optimizer, page geometry, K (written once, at creation)
  state0.bin      records of (master, m, v) x K float32 per chunk (SGD: (master, m)): the state
  state1.bin      after an even number of steps in state0, odd in state1
  commit.json     {"step": s, ...}: the last step whose state is durable (-1: initial), with a
                  crc of its fields, padded to COMMIT_BYTES
  progress.bin    chunks of step s+1 already applied (see below)

Step t reads copy t % 2 and writes copy (t + 1) % 2, so applying a chunk is
idempotent: redoing it after a crash gives the same bits. When the last chunk of
step t is applied, the written pages are made durable (msync + fsync) and only
then is commit.json replaced atomically (write, fsync, rename, fsync of the
directory). With sync="exit" a commit skips the msync and the fsyncs (a killed node loses
nothing: its writes are in the page cache) and rewrites commit.json in place, naming the boot;
the files are made durable when the store closes, and a state committed so on an earlier boot is
refused, its files possibly torn. A chunk is marked in progress.bin after its record is written and
before its parameters leave the node, so a node killed mid-step resumes without
applying any chunk twice and without needing sums that workers will never resend
(workers only retransmit chunks whose parameters they lack). progress.bin is
trusted only on the same boot (it is not fsynced per chunk); after a reboot the
step restarts from the durable commit.
"""
from __future__ import annotations

import functools
import json
import math
import mmap
import os
import pathlib
import zipfile
import zlib
from typing import Iterable

import numpy as np

from mindp.layout import Layout
from mindp.protocol import K

from . import optim, residency
from .optim import ConfigError, OptimizerConfig
from .pager import StorageError
from .pipeline import RECORD, PagedState, record  # RECORD: (master, m, v) x K float32, one chunk

MASTER, M, V = 0, 1, 2
PROGRESS_MAGIC = b"MINDPRG1"
PROGRESS_HEADER = 64  # magic 8, step int64 8, boot id 36, non-finite flag 1, pad
NONFINITE_AT = 52
#: When a commit is made durable: "step", each (survives a machine crash); "exit", when the store
#: closes (survives a killed node; the disk's writes each step cost the 1.3M gpt's step 2-6 %).
SYNC_MODES = ("step", "exit")
#: Elements a state page holds by default, at any K: 192 KiB of AdamW records (128 KiB of SGD's).
PAGE_ELEMENTS = 1 << 14


def page_chunks_for(elements: int, k: int = K) -> int:
    """Chunks of k elements a page of about `elements` holds: a multiple of the least count whose
    records fill whole OS pages (records of 4 * k bytes a lane, any lanes), at least one such."""
    unit = mmap.PAGESIZE // math.gcd(mmap.PAGESIZE, 4 * k)
    return max(1, round(elements / k / unit)) * unit


DEFAULT_PAGE_CHUNKS = page_chunks_for(PAGE_ELEMENTS)  # 512 at K = 32, 32 at K = 512
FORMAT = 2  # 2: meta.json names the record's lanes (format 1: always 3)


def new_state_workload(n_chunks: int, lanes: int) -> residency.Workload:
    """The residency model of a new state of `n_chunks` chunks in records of `lanes` lanes, in
    mindp-optimizer's default pages: what its RAM budget is judged against."""
    return residency.Workload(n_chunks, DEFAULT_PAGE_CHUNKS, record_bytes=record(lanes).itemsize)


def record_lanes(meta: dict) -> int:
    """The lanes of the records of a state whose meta.json is `meta` (format 1 names none: 3)."""
    return int(meta.get("lanes", 3))


def read_meta(state_dir: str | pathlib.Path) -> dict:
    """A state's meta.json, refused (ConfigError) when its chunks are not this process's K: a record
    holds K elements, so another K would read every chunk from the wrong place. (States made before
    meta.json named K, 30 Nov 2026, are taken at this K.)"""
    d = pathlib.Path(state_dir)
    try:
        meta = json.loads((d / "meta.json").read_text())
        k = int(meta.get("k", K))
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise ConfigError(f"state directory {d} is not usable: {exc}") from None
    if k != K:
        raise ConfigError(f"state directory {d} holds chunks of K = {k} elements and this process runs K = {K}: "
                          f"run it at K = {k} (MINDP_K={k}; make run K={k})")
    return meta


@functools.cache  # read once: a process outlives no boot, and each commit asks for it
def boot_id() -> bytes:
    try:
        return pathlib.Path("/proc/sys/kernel/random/boot_id").read_bytes().strip()[:36].ljust(36)
    except OSError:
        return b"?" * 36


def check_boot(d: pathlib.Path, commit: dict) -> None:
    """Refuse a commit made without fsync (sync="exit") on an earlier boot: the machine stopped
    before its files were made durable, so they may hold parts of different steps."""
    if "boot" in commit and str(commit["boot"]).encode().ljust(36) != boot_id():
        raise ConfigError(f"state directory {d}: step {commit['step']} was committed without fsync "
                          f"(mindp-optimizer --sync exit) and the machine has restarted since, so its files "
                          f"may be torn: start a fresh state, or restore a checkpoint into one")


def _write_atomic(path: pathlib.Path, data: bytes, durable: bool = True) -> None:
    """Replace `path` with `data` (durably, or atomically against a killed process only), or raise
    StorageError leaving the old file in place."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if not durable:
            return
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise StorageError(f"writing {path} failed: {exc.strerror} (errno {exc.errno}); "
                           "the last committed step is intact") from None


#: commit.json's size: every record is padded to it, so a commit made without fsync rewrites the file
#: in place (one write, no new file, rename or directory update: 0.05 against 1-3 ms a step on ext4).
COMMIT_BYTES = 256
#: Reads of a commit.json found torn (a write of it under way) before one is called damaged.
COMMIT_READS = 3


def commit_bytes(commit: dict) -> bytes:
    """commit.json's text for `commit`: its fields and their crc32, padded to COMMIT_BYTES. A file
    rewritten in place can be read half old, half new by another process (a save waiting for a
    commit); the crc tells that read from a whole one."""
    body = json.dumps(commit)
    text = json.dumps({**commit, "crc": zlib.crc32(body.encode())}).encode()
    if len(text) >= COMMIT_BYTES:
        raise ValueError(f"commit record of {len(text)} bytes: more than {COMMIT_BYTES - 1}")
    return text.ljust(COMMIT_BYTES - 1) + b"\n"


def read_commit(d: pathlib.Path) -> dict:
    """The fields of d's commit.json, its crc checked where it has one (older states' have none).
    A read that found it torn (no JSON, or a crc that does not match) is made again; ValueError if
    every read did (a damaged file)."""
    for _ in range(COMMIT_READS):
        try:
            commit = json.loads((d / "commit.json").read_bytes())
        except ValueError as exc:
            error = f"commit.json is not JSON: {exc}"
            continue
        if not isinstance(commit, dict):
            raise TypeError("commit.json holds no record")
        crc = commit.pop("crc", None)
        if crc is None or crc == zlib.crc32(json.dumps(commit).encode()):
            return commit
        error = "commit.json's crc does not match its fields"
    raise ValueError(f"{error} ({COMMIT_READS} reads): damaged, or edited without removing its crc")


def _preallocate(f, nbytes: int) -> None:
    """Reserve every block of the file now, so no later write through the mapping can find the disk
    full (a write fault into an unallocated block on a full disk is SIGBUS, not an error)."""
    f.flush()
    f.truncate(nbytes)
    try:
        os.posix_fallocate(f.fileno(), 0, nbytes)
    except OSError as exc:
        raise StorageError(f"cannot reserve {nbytes} bytes for {f.name}: {exc.strerror} (errno {exc.errno})") from None


def padded_records(n_chunks: int, page_chunks: int) -> int:
    """Records a state copy holds for n_chunks chunks: whole pages of page_chunks."""
    return -(-n_chunks // page_chunks) * page_chunks


def shard_pieces(pieces: Iterable[np.ndarray], total: int, lo: int, hi: int):
    """The flat stream of `pieces` (the whole model, `total` elements in layout order) cut to the
    elements of chunks [lo, hi] only; the whole stream is read, so a short or long one is refused."""
    start, stop = lo * K, min((hi + 1) * K, total)
    pos = 0
    for piece in pieces:
        flat = np.asarray(piece, dtype=np.float32).reshape(-1)
        a, b = max(start, pos), min(stop, pos + len(flat))
        if a < b:
            yield flat[a - pos : b - pos]
        pos += len(flat)
    if pos != total:
        raise ConfigError(f"initial parameters have {pos} elements, layout has {total}")


def create(state_dir: str | pathlib.Path, layout: Layout, init: Iterable[np.ndarray], cfg: OptimizerConfig,
           page_chunks: int = DEFAULT_PAGE_CHUNKS, chunks: tuple[int, int] | None = None) -> None:
    """Write a fresh state directory; `init` yields the flat float32 master in layout order, in pieces.

    Pieces are written as they come, so a model larger than memory can be created
    tensor by tensor. `chunks` = (lo, hi): a shard's state, chunks lo..hi (inclusive) of the
    layout's chunk space only, initialised with exactly those elements of `init`.
    """
    cfg.group_runs(layout)  # a parameter group naming a tensor the layout lacks: refused before any file
    rb = record(cfg.lanes).itemsize
    if page_chunks <= 0 or (page_chunks * rb) % mmap.PAGESIZE:
        raise ConfigError(f"page_chunks must be a positive multiple of {mmap.PAGESIZE // np.gcd(mmap.PAGESIZE, rb)}")
    if chunks is not None:
        lo, hi = chunks
        if not 0 <= lo <= hi < layout.n_chunks:
            raise ConfigError(f"chunk range {lo}:{hi} is not within the model's chunks 0:{layout.n_chunks - 1}")
        init = shard_pieces(init, layout.total, lo, hi)
    d = pathlib.Path(state_dir)
    d.mkdir(parents=True, exist_ok=True)
    for name in ("commit.json", "progress.bin"):
        (d / name).unlink(missing_ok=True)
    n = layout.n_chunks if chunks is None else chunks[1] - chunks[0] + 1
    elements = layout.total if chunks is None else min((chunks[1] + 1) * K, layout.total) - chunks[0] * K
    nbytes = padded_records(n, page_chunks) * rb
    block_chunks = 1024
    with open(d / "state0.bin", "wb") as f0:
        pending = np.empty(0, dtype=np.float32)
        written = 0

        def flush_block(flat: np.ndarray) -> None:
            nonlocal written
            c = len(flat) // K
            rec = np.zeros((c, cfg.lanes, K), dtype=np.float32)
            rec[:, MASTER, :] = flat.reshape(c, K)
            f0.write(rec.tobytes())
            written += c

        for piece in init:
            pending = np.concatenate([pending, np.asarray(piece, dtype=np.float32).reshape(-1)])
            while len(pending) >= block_chunks * K:
                flush_block(pending[: block_chunks * K])
                pending = pending[block_chunks * K :]
        total = written * K + len(pending)
        if total != elements:
            raise ConfigError(f"initial parameters have {total} elements, layout has {elements}")
        if len(pending):
            pad = np.zeros(-(-len(pending) // K) * K, dtype=np.float32)
            pad[: len(pending)] = pending
            flush_block(pad)
        _preallocate(f0, nbytes)
        os.fsync(f0.fileno())
    with open(d / "state1.bin", "wb") as f1:
        _preallocate(f1, nbytes)
        os.fsync(f1.fileno())
    meta = {"format": FORMAT, "layout": optim.layout_to_json(layout), "optimizer": cfg.to_dict(),
            "page_chunks": page_chunks, "lanes": cfg.lanes, "k": K}
    if chunks is not None:
        meta["chunks"] = [int(chunks[0]), int(chunks[1])]
    _write_atomic(d / "meta.json", json.dumps(meta, indent=1).encode())
    _write_atomic(d / "commit.json", commit_bytes({"step": -1, "updates": 0, "skipped": False}))


def exists(state_dir: str | pathlib.Path) -> bool:
    d = pathlib.Path(state_dir)
    return (d / "meta.json").exists() and (d / "commit.json").exists()


class Store:
    """An open state directory: pager-backed records, the commit and the step's progress."""

    def __init__(self, state_dir: str | pathlib.Path, budget_bytes: int, *, prefetch: bool = True,
                 drop_cache: bool = True, window: int = 64, map_whole: bool = True, sync: str = "step"):
        """budget_bytes: RAM for state pages (see residency.decide); window: how many chunks out
        of order sums may arrive (the job's slot count), which sets how far ahead pages are read;
        map_whole=False streams the state through the pipeline even if it fits (tests); sync: one
        of SYNC_MODES."""
        if sync not in SYNC_MODES:
            raise ConfigError(f"sync must be one of {'|'.join(SYNC_MODES)}, got {sync!r}")
        self.durable = sync == "step"  # each commit; else only at close
        self._padded = False  # commit.json known to be COMMIT_BYTES long (this store wrote it)
        d = self.dir = pathlib.Path(state_dir)
        meta = read_meta(d)
        try:
            commit = read_commit(d)
            check_boot(d, commit)
            self.unsynced = "boot" in commit  # committed without fsync: made durable at close
            self.committed = int(commit["step"])
            # Optimizer updates through the committed step (a skipped, non-finite step is none);
            # the state after the committed step is in copy updates % 2.
            self.updates = int(commit.get("updates", self.committed + 1))
            self.last_skipped = bool(commit.get("skipped", False))
            self.layout = optim.layout_from_json(meta["layout"])
            self.cfg = OptimizerConfig.from_dict(meta["optimizer"])
            page_chunks = int(meta["page_chunks"])
            lanes = record_lanes(meta)
            if lanes not in (2, 3) or lanes < self.cfg.lanes:
                raise ValueError(f"records of {lanes} lanes for {self.cfg.kind}")
            # A shard holds chunks lo..hi of the layout's chunk space (records 0..hi-lo); else all.
            self.chunks = tuple(int(c) for c in meta.get("chunks", (0, self.layout.n_chunks - 1)))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"state directory {d} is not usable: {exc}") from None
        self.chunk_lo = self.chunks[0]
        self.sharded = "chunks" in meta
        self.n_chunks = n = self.chunks[1] - self.chunks[0] + 1
        self.page_chunks = page_chunks
        padded = padded_records(n, page_chunks)
        self.n_pages = padded // page_chunks
        self.pages = PagedState([d / f"state{i}.bin" for i in (0, 1)], n, page_chunks, budget_bytes,
                                prefetch=prefetch, drop_cache=drop_cache, window=window, map_whole=map_whole,
                                lanes=lanes)
        self.record = self.pages.record
        self.pager = self.pages.pager  # None when the state is mapped whole (in RAM)
        self._open_progress(n)
        self.pages.start_step(self.applied)

    # --- progress of the current step ------------------------------------------
    def _open_progress(self, n: int) -> None:
        path = self.dir / "progress.bin"
        size = PROGRESS_HEADER + n
        fresh = not path.exists() or path.stat().st_size != size
        if fresh:
            with open(path, "wb") as f:
                _preallocate(f, size)
        self._pfd = os.open(path, os.O_RDWR)
        self._pmm = mmap.mmap(self._pfd, size)
        hdr = bytes(self._pmm[:PROGRESS_HEADER])
        step = int.from_bytes(hdr[8:16], "little", signed=True)
        self.applied = np.frombuffer(self._pmm, dtype=np.bool_, offset=PROGRESS_HEADER, count=n)
        trusted = hdr[:8] == PROGRESS_MAGIC and step == self.current and hdr[16:52] == boot_id()
        self.resumed_chunks = int(self.applied.sum()) if trusted else 0
        self.step_nonfinite = trusted and hdr[NONFINITE_AT] == 1
        self.n_applied = self.resumed_chunks
        if not trusted:
            self._reset_progress()

    def _reset_progress(self) -> None:
        self.step_nonfinite = False
        self.applied[:] = False
        self.n_applied = 0
        self._pmm[:PROGRESS_HEADER] = (PROGRESS_MAGIC + self.current.to_bytes(8, "little", signed=True)
                                       + boot_id()).ljust(PROGRESS_HEADER, b"\0")

    @property
    def current(self) -> int:
        """The step being applied now."""
        return self.committed + 1

    def copy_after(self, step: int) -> int:
        """Which file holds the state after `step`: the committed step (-1: the initial state) or
        the current one (its applied chunks; for a non-finite step, the state before it)."""
        if step == self.committed:
            return self.updates % 2
        if step == self.current:
            return self.updates % 2 if self.step_nonfinite else (self.updates + 1) % 2
        raise ValueError(f"step {step}: only the committed ({self.committed}) and current steps are held")

    def mark_nonfinite(self) -> None:
        """The current step had a non-finite gradient: it will commit as skipped (no update), and
        every answer comes from the state before it. Recorded before any such answer leaves."""
        self.step_nonfinite = True
        self._pmm[NONFINITE_AT] = 1
        self.pages.forget_updated()

    # --- records ---------------------------------------------------------------
    def records(self, copy: int, lo: int, hi: int, write: bool = False) -> np.ndarray:
        """Records [lo, hi) of one page of copy `copy` (use them at once; do not keep them).
        write=True: the current step's records of chunks not yet applied, to be updated in place
        (they hold the source state until then) and then passed to mark_applied."""
        src = self.copy_after(self.committed)
        if write:
            return self.pages.working(src, self.copy_after(self.current), lo, hi)
        buffered = not self.pages.mapped and copy == src and (self.step_nonfinite or not self.applied[lo:hi].any())
        return self.pages.read(copy, lo, hi, buffered)

    def page_runs(self, chunks: np.ndarray) -> list[tuple[int, int]]:
        """Sorted unique chunks -> [lo, hi) runs of consecutive chunks within one page."""
        runs = []
        if not len(chunks):
            return runs
        breaks = np.flatnonzero((np.diff(chunks) != 1) | (np.diff(chunks // self.page_chunks) != 0)) + 1
        for part in np.split(chunks, breaks):
            runs.append((int(part[0]), int(part[-1]) + 1))
        return runs

    def prefetch_from(self, chunk: int) -> None:
        """The current step will touch chunks from `chunk` on, in order: read its pages ahead."""
        self.pages.prefetch(self.copy_after(self.committed), chunk, self.current)

    def mark_applied(self, lo: int, hi: int) -> None:
        """Chunks [lo, hi) of one page (any range if mapped whole), none applied before in this
        step, are now applied: their records (updated in place, or answered unchanged in a
        non-finite step) are written to the destination copy first, so a killed node never loses an
        applied chunk."""
        self.pages.applied(None if self.step_nonfinite else self.copy_after(self.current), lo, hi)
        self.applied[lo:hi] = True
        self.n_applied += hi - lo

    @property
    def step_complete(self) -> bool:
        return self.n_applied == self.n_chunks

    def commit(self) -> None:
        """The current step is fully applied: make it durable, then advance."""
        self.pages.flush(self.copy_after(self.current), durable=self.durable)
        skipped = self.step_nonfinite
        updates = self.updates + (not skipped)
        self._write_commit(self.current, updates, skipped, durable=self.durable)
        self.committed += 1
        self.updates = updates
        self.last_skipped = skipped
        self._reset_progress()
        self.pages.next_step(skipped)

    def skip_committed(self) -> bool:
        """Another shard found the committed step non-finite: commit it again as skipped, the state
        before it (its source copy, untouched) becoming the state after it. Only before any chunk of
        the next step is applied (workers send none before every shard knows). False if it was
        already skipped."""
        if self.last_skipped:
            return False
        if self.n_applied or self.updates == 0:
            raise StorageError(f"cannot skip step {self.committed}: "
                               f"{self.n_applied} chunks of step {self.current} are applied already")
        self._write_commit(self.committed, self.updates - 1, True, durable=self.durable)
        self.updates -= 1
        self.last_skipped = True
        self.pages.forget_all()  # kept buffers hold the undone step's state
        return True

    def _write_commit(self, step: int, updates: int, skipped: bool, durable: bool) -> None:
        commit = {"step": step, "updates": updates, "skipped": skipped}
        if durable and self.unsynced:  # the commits before wrote both copies without fsync
            self.pages.flush(None)
        if durable:
            _write_atomic(self.dir / "commit.json", commit_bytes(commit))
        else:
            commit["boot"] = boot_id().decode().strip()
            self._rewrite_commit(commit_bytes(commit))
        self.unsynced = not durable

    def _rewrite_commit(self, text: bytes) -> None:
        """commit.json rewritten in place (a commit without fsync): one write of the whole padded
        record, which a killed process cannot leave half done. A file of another size (made before
        records were padded) is replaced instead."""
        path = self.dir / "commit.json"
        try:
            if not self._padded and path.stat().st_size != COMMIT_BYTES:
                _write_atomic(path, text, durable=False)
                self._padded = True
                return
            self._padded = True  # (every record this store writes is padded: no stat again)
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                if os.pwrite(fd, text, 0) != len(text):
                    raise OSError(0, "short write")
            finally:
                os.close(fd)
        except OSError as exc:
            raise StorageError(f"rewriting {path} failed: {exc.strerror} (errno {exc.errno})") from None

    # --- whole-model access (export) ---------------------------------------------
    def tensor(self, name: str, step: int | None = None) -> np.ndarray:
        """One named float32 master tensor after `step` (default: the last committed), read page by page."""
        copy = self.copy_after(self.committed if step is None else step)
        spec = next(s for s in self.layout.specs if s.name == name)
        lo = self.layout.offsets[name]
        out = np.empty(spec.size, dtype=np.float32)
        done = 0
        while done < spec.size:
            e = lo + done
            c = e // K
            hi_c = min(self.n_chunks, (c // self.page_chunks + 1) * self.page_chunks)
            flat = self.records(copy, c, hi_c)[:, MASTER, :].reshape(-1)[e - c * K :]
            take = min(len(flat), spec.size - done)
            out[done : done + take] = flat[:take]
            done += take
        return out.reshape(spec.shape)

    def export(self, path: str | pathlib.Path) -> None:
        """Write the committed master parameters to an .npz (float32), one tensor in memory at a time.
        A shard writes its elements flat (`master`) with its chunk range (`chunks`): see join_exports."""
        if self.sharded:
            lo, hi = self.chunks
            copy = self.copy_after(self.committed)
            flat = np.concatenate([self.records(copy, a, min(a + self.page_chunks, self.n_chunks))[:, MASTER, :].reshape(-1)
                                   for a in range(0, self.n_chunks, self.page_chunks)])
            np.savez(path, chunks=np.array([lo, hi], dtype=np.int64),
                     master=flat[: min((hi + 1) * K, self.layout.total) - lo * K])
            return
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            for spec in self.layout.specs:
                with zf.open(f"{spec.name}.npy", "w", force_zip64=True) as f:
                    np.lib.format.write_array(f, self.tensor(spec.name), allow_pickle=False)

    def close(self) -> None:
        """Close the files, made durable: a commit made without fsync is written again with one."""
        self.pages.close()  # both copies written back and fsynced
        if self.unsynced:
            self.unsynced = False  # (so the commit record does not flush the closed copies again)
            self._write_commit(self.committed, self.updates, self.last_skipped, durable=True)
        self.applied = None
        try:
            self._pmm.close()
        except BufferError:
            pass
        os.close(self._pfd)


def join_exports(paths: Iterable[str | pathlib.Path], layout: Layout) -> dict[str, np.ndarray]:
    """The shards' exports (Store.export of each) -> the whole model's named float32 master;
    refuses ranges that overlap or leave a chunk out."""
    flat = np.zeros(layout.total, dtype=np.float32)
    have = np.zeros(layout.n_chunks, dtype=bool)
    for p in paths:
        with np.load(p) as z:
            lo, hi = (int(c) for c in z["chunks"])
            master = z["master"]
        if have[lo : hi + 1].any() or len(master) != min((hi + 1) * K, layout.total) - lo * K:
            raise ConfigError(f"{p}: chunks {lo}:{hi} overlap another export or do not fit the model")
        flat[lo * K : lo * K + len(master)] = master
        have[lo : hi + 1] = True
    if not have.all():
        raise ConfigError(f"the exports leave chunks {np.flatnonzero(~have)[:8].tolist()}... out")
    return {s.name: flat[layout.offsets[s.name] : layout.offsets[s.name] + s.size].reshape(s.shape).copy()
            for s in layout.specs}


def init_pieces(layout: Layout, init: dict[str, np.ndarray] | None = None, seed: int = 0):
    """Flat float32 initial master in layout order, one tensor at a time (given, else seeded)."""
    for i, spec in enumerate(layout.specs):
        if init is None:
            yield optim.seed_tensor(seed, i, spec.size)
            continue
        arr = np.asarray(init[spec.name], dtype=np.float32)
        if tuple(arr.shape) != spec.shape:
            raise ConfigError(f"{spec.name}: initial shape {arr.shape} != layout {spec.shape}")
        bad = arr.size - int(np.count_nonzero(np.isfinite(arr)))
        if bad:  # the optimizer would carry them into every step (and NaN payloads differ by kernel)
            raise ConfigError(f"{spec.name}: {bad} initial value(s) are NaN or infinite (as float32): "
                              "the node starts from finite parameters only")
        yield arr.reshape(-1)


def read_state(state_dir: str | pathlib.Path, before_commit: bool = False
               ) -> tuple[dict, OptimizerConfig, Layout, tuple[int, int] | None, np.ndarray]:
    """Another process's view of a state, a whole model's or a shard's, read-only and without the
    node's cooperation: (commit.json, optimizer, layout, the job's chunks lo..hi it holds (None: the
    whole model), records (chunks, lanes, K) float32, a read-only map) at its last commit, or with
    `before_commit` after the step before it: the copy the committed step read, unchanged until the
    node applies the next step (which no worker sends before every shard committed this one)."""
    d = pathlib.Path(state_dir)
    meta = read_meta(d)
    try:
        commit = read_commit(d)
        check_boot(d, commit)
        cfg = OptimizerConfig.from_dict(meta["optimizer"])
        layout = optim.layout_from_json(meta["layout"])
        chunks = (int(meta["chunks"][0]), int(meta["chunks"][1])) if "chunks" in meta else None
        lo, hi = chunks or (0, layout.n_chunks - 1)
        updates = int(commit.get("updates", int(commit["step"]) + 1))
        held = updates - 1 if before_commit and not commit.get("skipped") else updates  # a skipped step wrote none
        records = np.memmap(d / f"state{held % 2}.bin", dtype=np.float32, mode="r",
                            shape=(hi - lo + 1, record_lanes(meta), K))
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise ConfigError(f"state directory {d} is not usable: {exc}") from None
    return {**commit, "updates": updates}, cfg, layout, chunks, records


def job_dirs(state_dirs: str | os.PathLike | Iterable[str | os.PathLike]) -> list[pathlib.Path]:
    """A job's state directories: its one node's directory, or every shard's (a list, shard order)."""
    return [pathlib.Path(d) for d in ([state_dirs] if isinstance(state_dirs, (str, os.PathLike)) else state_dirs)]


def read_committed(state_dirs: str | os.PathLike | Iterable[str | os.PathLike]
                   ) -> tuple[dict, OptimizerConfig, Layout, np.ndarray]:
    """A job's state at its last step every node committed (read_state): (commit.json, optimizer,
    layout, records (chunks, lanes, K)), from its one node's directory or from every shard's. Between
    two steps of the job (a worker that holds a step's parameters and has not sent the next step's
    gradients) it is exactly the nodes' state.

    Shards commit each on its own: one may be a step ahead of another (never more: no worker sends
    step s + 1 before every shard committed s); its chunks then come from the copy its last step
    read, the state after the step the others committed."""
    dirs = job_dirs(state_dirs)
    reads = [read_state(d) for d in dirs]
    if len(reads) == 1 and reads[0][3] is None:
        commit, cfg, layout, _, records = reads[0]
        return commit, cfg, layout, records
    if not reads or any(chunks is None for *_, chunks, _ in reads):
        raise ConfigError("a job's state is one whole-model directory, or every shard's directory of a sharded job")
    _, cfg, layout, _, _ = reads[0]
    step = min(int(commit["step"]) for commit, *_ in reads)
    records = np.zeros((layout.n_chunks, cfg.lanes, K), dtype=np.float32)
    have = np.zeros(layout.n_chunks, dtype=bool)
    first = None
    for d, (commit, c, lay, (lo, hi), recs) in zip(dirs, reads):
        if optim.layout_to_json(lay) != optim.layout_to_json(layout) or c != cfg:
            raise ConfigError(f"{d} holds a shard of another model or optimizer than {dirs[0]}")
        if int(commit["step"]) not in (step, step + 1):
            raise ConfigError(f"{d} committed step {commit['step']}, more than one after {step}")
        if int(commit["step"]) > step:
            recs = read_state(d, before_commit=True)[4]
        elif first is None:
            first = commit
        if have[lo : hi + 1].any():
            raise ConfigError(f"{d} holds chunks {lo}:{hi}, which another shard's directory holds too")
        records[lo : hi + 1] = recs
        have[lo : hi + 1] = True
    if not have.all():
        missing = np.flatnonzero(~have)
        raise ConfigError(f"the shards' directories leave chunks {int(missing[0])}:{int(missing[-1])} out: "
                          "give every shard's directory")
    return first, cfg, layout, records


def create_at(state_dir: str | pathlib.Path, layout: Layout, cfg: OptimizerConfig, lanes: dict[int, np.ndarray],
              step: int, updates: int, page_chunks: int = DEFAULT_PAGE_CHUNKS,
              chunks: tuple[int, int] | None = None) -> None:
    """A state directory committed after `step` (`updates` optimizer updates so far) whose records
    hold flat float32 `lanes` {MASTER: ..., M: ..., V: ...} of layout.total elements each: a
    checkpoint restored, resumed by the node as if it had run those steps itself. `chunks` = (lo,
    hi): a shard's directory, holding those chunks of the lanes (as `create`)."""
    create(state_dir, layout, [lanes[MASTER]], cfg, page_chunks, chunks)
    d = pathlib.Path(state_dir)
    lo, hi = chunks or (0, layout.n_chunks - 1)
    n = hi - lo + 1
    copy = np.memmap(d / f"state{updates % 2}.bin", dtype=np.float32, mode="r+", shape=(n, cfg.lanes, K))
    for lane in range(cfg.lanes):
        flat = np.zeros(n * K, np.float32)  # this directory's chunks only; the last chunk's tail stays 0
        if lane in lanes:
            part = lanes[lane][lo * K : (hi + 1) * K]
            flat[: len(part)] = part
        copy[:, lane, :] = flat.reshape(n, K)
    copy.flush()
    del copy
    with open(d / f"state{updates % 2}.bin", "rb+") as f:
        os.fsync(f.fileno())
    _write_atomic(d / "commit.json", commit_bytes({"step": step, "updates": updates, "skipped": False}))
