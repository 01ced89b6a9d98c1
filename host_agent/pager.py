"""A pager over memory-mapped files of fixed-size records, within a RAM budget.

The files are mapped whole (MAP_SHARED), but at most `budget_bytes` of them is
kept resident in this process: pages are registered in an LRU on access, and the
least recently used page is evicted when room is needed (a dirty page is written
back with msync first, then unmapped with MADV_DONTNEED and, with `drop_cache`,
dropped from the page cache so the budget is also honest about the machine's
memory). A background thread prefetches the pages the caller says it will need
next (in chunk order), so the caller rarely waits for the disk.

madvise/msync go through ctypes, which releases the GIL during the system call:
the prefetch thread's disk waits do not stall the main thread.
"""
from __future__ import annotations

import collections
import ctypes
import mmap
import os
import threading
from dataclasses import dataclass

import numpy as np

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MADV_RANDOM, MADV_WILLNEED, MADV_DONTNEED, MADV_POPULATE_READ, MADV_POPULATE_WRITE = 1, 3, 4, 22, 23
MS_SYNC = 4
FALLOC_FL_KEEP_SIZE, FALLOC_FL_ZERO_RANGE = 0x01, 0x10
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
OS_PAGE = mmap.PAGESIZE


class PagerError(RuntimeError):
    pass


class StorageError(PagerError):
    """A write or flush of the state failed (ENOSPC, EIO, ...): the last commit is still intact."""


def _check(rc: int, what: str, path: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise StorageError(f"{what} of {path} failed: {os.strerror(err)} (errno {err}); the last committed step is intact")


def _fsync(fd: int, path: str) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        raise StorageError(f"fsync of {path} failed: {exc.strerror} (errno {exc.errno}); "
                           "the last committed step is intact") from None


class MappedFile:
    """One file mapped read-write as an array of records."""

    def __init__(self, path: str, record_dtype: np.dtype, n_records: int):
        """record_dtype: a subarray dtype such as np.dtype((np.float32, (3, 32)))."""
        self.path = str(path)
        self.fd = os.open(self.path, os.O_RDWR)
        self.record_bytes = record_dtype.itemsize
        size = os.fstat(self.fd).st_size
        if size < n_records * self.record_bytes:
            os.close(self.fd)
            raise PagerError(f"{self.path}: {size} bytes, expected at least {n_records * self.record_bytes}")
        self.size = size
        self.mm = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.bytes = np.frombuffer(self.mm, dtype=np.uint8)
        self.addr = self.bytes.ctypes.data
        # No kernel read-ahead or fault-around: only the pages the pager asks for become resident.
        _libc.madvise(self.addr, size, MADV_RANDOM)
        base, shape = (record_dtype.subdtype or (record_dtype, ()))
        self.records = self.bytes[: n_records * self.record_bytes].view(base).reshape(n_records, *shape)

    def close(self) -> None:
        self.records = self.bytes = None
        try:
            self.mm.close()
        except BufferError:
            pass  # a caller still holds a view; the mapping goes with it
        os.close(self.fd)


@dataclass
class PagerStats:
    faults: int = 0  # pages registered by the caller's own access (prefetch missed)
    prefetched: int = 0
    evictions: int = 0
    writebacks: int = 0
    peak_pages: int = 0


class Pager:
    """LRU residency over several MappedFiles sharing one page geometry."""

    def __init__(self, files: list[MappedFile], page_bytes: int, budget_bytes: int, *, drop_cache: bool = True,
                 prefetch: bool = True):
        if page_bytes % OS_PAGE:
            raise PagerError(f"page size {page_bytes} is not a multiple of {OS_PAGE}")
        self.files = files
        self.page_bytes = page_bytes
        self.max_pages = budget_bytes // page_bytes
        if self.max_pages < 4:
            raise PagerError(f"RAM budget {budget_bytes} B holds {self.max_pages} pages of {page_bytes} B; need >= 4")
        self.drop_cache = drop_cache
        if drop_cache:
            # Start cold: cached large folios (e.g. from the writes that created the file) would be
            # mapped whole on first touch, beyond any page the pager registered.
            for mf in files:
                os.fsync(mf.fd)
                os.posix_fadvise(mf.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        self.lru: collections.OrderedDict[tuple[int, int], bool] = collections.OrderedDict()  # -> dirty
        self.lock = threading.Lock()
        self.io = threading.Lock()  # held while a page is written back, and by flush()
        self.stats = PagerStats()
        self._want: list[tuple[int, int, bool]] = []
        self._unused: set[tuple[int, int]] = set()  # prefetched, not yet touched by the caller
        self._cv = threading.Condition(self.lock)
        self._stop = False
        self._reserved = 0
        self.error: StorageError | None = None
        self._thread = None
        if prefetch:
            self._thread = threading.Thread(target=self._prefetcher, name="pager-prefetch", daemon=True)
            self._thread.start()

    # --- access ------------------------------------------------------------
    def page_of(self, f: int, record: int) -> int:
        return record * self.files[f].record_bytes // self.page_bytes

    def touch(self, f: int, page: int, write: bool) -> None:
        """Register (f, page) as resident and most recently used; evict to stay in budget."""
        key = (f, page)
        with self.lock:
            if key in self.lru:
                self.lru.move_to_end(key)
                if write:
                    self.lru[key] = True
                if key in self._unused:
                    self._unused.discard(key)
                    self._cv.notify()
                return
        self._make_room(1)
        self._populate(key, write)
        with self.lock:
            self._reserved -= 1
            self.stats.faults += key not in self.lru
            self.lru[key] = self.lru.get(key, False) or write
            self.lru.move_to_end(key)
            self.stats.peak_pages = max(self.stats.peak_pages, len(self.lru))

    def records(self, f: int, lo: int, hi: int, write: bool = False) -> np.ndarray:
        """Records [lo, hi) of file f (a view); registers their pages."""
        recs = self.files[f].records
        size = self.files[f].record_bytes
        for page in range(lo * size // self.page_bytes, ((hi * size) - 1) // self.page_bytes + 1):
            self.touch(f, page, write)
        return recs[lo:hi]

    def discard(self, f: int, page: int) -> bool:
        """Forget a page's contents (it reads as zeros, with no disk read) unless it is resident;
        for pages about to be overwritten. The blocks stay allocated (FALLOC_FL_ZERO_RANGE, not a
        punched hole), so writing the page later cannot run out of space. False if not done
        (resident, or the file system has no ZERO_RANGE, e.g. tmpfs)."""
        with self.lock:
            if (f, page) in self.lru:
                return False
            mf, off, length = self._range((f, page))
            return length > 0 and _libc.fallocate(mf.fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, off, length) == 0

    def hint(self, wants: list[tuple[int, int, bool]]) -> None:
        """Pages (f, page, write) needed soon, in order; replaces the previous hint."""
        if self._thread is None:
            return
        with self._cv:
            self._want = [w for w in wants if (w[0], w[1]) not in self.lru]
            self._cv.notify()

    # --- residency -----------------------------------------------------------
    def _make_room(self, n: int) -> None:
        """Evict until n more pages fit, and reserve them (the caller registers them, then unreserves)."""
        while True:
            with self.io:
                with self.lock:
                    if len(self.lru) + self._reserved + n <= self.max_pages:
                        self._reserved += n
                        return
                    key, dirty = self.lru.popitem(last=False)
                    self._unused.discard(key)
                try:
                    self._evict(key, dirty)
                except StorageError:
                    with self.lock:  # keep the page (still dirty) so nothing written is forgotten
                        self.lru[key] = dirty
                        self.lru.move_to_end(key, last=False)
                    raise

    def _range(self, key: tuple[int, int]) -> tuple[MappedFile, int, int]:
        mf = self.files[key[0]]
        off = key[1] * self.page_bytes
        return mf, off, min(self.page_bytes, mf.size - off)

    def _evict(self, key: tuple[int, int], dirty: bool) -> None:
        mf, off, length = self._range(key)
        if length <= 0:
            return
        if dirty:
            _check(_libc.msync(mf.addr + off, length, MS_SYNC), "write-back (msync)", mf.path)
            self.stats.writebacks += 1
        _libc.madvise(mf.addr + off, length, MADV_DONTNEED)
        if self.drop_cache:
            os.posix_fadvise(mf.fd, off, length, os.POSIX_FADV_DONTNEED)
        self.stats.evictions += 1

    def _populate(self, key: tuple[int, int], write: bool) -> None:
        """Read the page in with one large I/O, then map it (the mapping itself reads 4 KiB at a time)."""
        mf, off, length = self._range(key)
        if length <= 0:
            return
        os.posix_fadvise(mf.fd, off, length, os.POSIX_FADV_WILLNEED)
        if _libc.madvise(mf.addr + off, length, MADV_POPULATE_WRITE if write else MADV_POPULATE_READ):
            _libc.madvise(mf.addr + off, length, MADV_WILLNEED)  # older kernels: read ahead at least

    def _prefetcher(self) -> None:
        # Prefetch at most half the budget ahead, so prefetching never evicts its own pages.
        ahead = max(1, self.max_pages // 2)
        while True:
            with self._cv:
                while not self._stop and (not self._want or len(self._unused) >= ahead):
                    self._cv.wait()
                if self._stop:
                    return
                f, page, write = self._want.pop(0)
                if (f, page) in self.lru:
                    continue
            try:
                self._make_room(1)
            except StorageError as exc:
                self.error = exc  # reported by the caller's next flush
                return
            self._populate((f, page), write)
            with self.lock:
                self._reserved -= 1
                if (f, page) not in self.lru:
                    self.lru[(f, page)] = write
                    self._unused.add((f, page))
                    self.stats.prefetched += 1
                    self.stats.peak_pages = max(self.stats.peak_pages, len(self.lru))
                elif write:
                    self.lru[(f, page)] = True

    # --- durability ------------------------------------------------------------
    def flush(self) -> None:
        """Make every write so far durable (dirty resident pages stay resident, now clean)."""
        if self.error:
            raise self.error
        with self.io:
            with self.lock:
                dirty = [k for k, d in self.lru.items() if d]
                for k in dirty:
                    self.lru[k] = False
            try:
                for k in dirty:
                    mf, off, length = self._range(k)
                    if length <= 0:
                        continue  # a hinted page past the end of the file
                    _check(_libc.msync(mf.addr + off, length, MS_SYNC), "write-back (msync)", mf.path)
                for mf in self.files:
                    _fsync(mf.fd, mf.path)
            except StorageError:
                with self.lock:  # still dirty: a later flush must not report them durable
                    for k in dirty:
                        if k in self.lru:
                            self.lru[k] = True
                raise

    def resident_pages(self) -> int:
        with self.lock:
            return len(self.lru)

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread:
            self._thread.join()
        self.flush()
        for mf in self.files:
            mf.close()
