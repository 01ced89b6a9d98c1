"""State I/O of the optimizer node: a streaming page pipeline (out of core) and whole-file mappings (in RAM).

Out of core, `Pager` moves whole pages between the state files and a fixed pool of page-aligned
buffers (the RAM budget) with pread/pwrite, by one reader thread and one writer thread that live as
long as the state is open (reused by every step): while the caller updates page p, the reader
fills the buffers of the pages hinted next (p+1, ...) and the writer writes back the pages the
caller retired (p-1, ...). Reads are O_DIRECT where the file system allows it (one large I/O into
the buffer, no page-cache copy to drop). Writes are buffered pwrites of the caller's records (so a
killed process loses nothing it wrote); a retired page is written back with sync_file_range and
then dropped from the page cache, and counts against the budget until then.

When the budget is full of pages in use (sums of one slot stalled while the others ran through the
model leave every page partly applied), room is made from what can be re-read: the least recently
used buffer is evicted (its applied records are in the destination, the others in the source),
else a partly written page is written back early (its records are in the file). The caller waits
for disk I/O at worst, never for the network: no sum is refused and no deadlock is possible.

In RAM (the budget holds both copies), `MappedFile` maps a file whole and the caller updates it in
place: no copy at all.

Disk errors never pass silently: every pwrite, write-back and fsync is checked and a failure raises
`StorageError` (one line, errno named); the caller then must not commit.
"""
from __future__ import annotations

import collections
import ctypes
import mmap
import os
import threading
from dataclasses import dataclass

import numpy as np

from mindp import threadname

from .residency import MIN_PAGES

_libc = ctypes.CDLL(None, use_errno=True)
_libc.msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MS_SYNC = 4
MADV_HUGEPAGE, MADV_POPULATE_READ = 14, 22
SYNC_FILE_RANGE_WAIT_BEFORE, SYNC_FILE_RANGE_WRITE, SYNC_FILE_RANGE_WAIT_AFTER = 1, 2, 4
OS_PAGE = mmap.PAGESIZE


class PagerError(RuntimeError):
    pass


class StorageError(PagerError):
    """A write or flush of the state failed (ENOSPC, EIO, ...): the last commit is still intact."""


def _fail(what: str, path: str, err: int) -> StorageError:
    return StorageError(f"{what} of {path} failed: {os.strerror(err)} (errno {err}); the last committed step is intact")


def _fsync(fd: int, path: str) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        raise _fail("fsync", path, exc.errno) from None


class MappedFile:
    """One file mapped whole, read-write, as an array of records (the in-RAM mode)."""

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
        # Read in as large folios (MADV_HUGEPAGE, the file's clean cached pages dropped first): each
        # commit's write-back write-protects the mapping again, and the next step's writes fault once
        # a folio instead of once a 4 KiB page (those faults were a third of the node's CPU). Populated
        # at once: faulting the state in during the first step cost that step half its speed.
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)  # (dirty pages stay: nothing is lost)
        self.mm = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.bytes = np.frombuffer(self.mm, dtype=np.uint8)
        self.addr = self.bytes.ctypes.data
        _libc.madvise(self.addr, size, MADV_HUGEPAGE)
        if _libc.madvise(self.addr, size, MADV_POPULATE_READ):
            self.bytes[::OS_PAGE].sum()  # read a byte a page
        base, shape = (record_dtype.subdtype or (record_dtype, ()))
        self.records = self.bytes[: n_records * self.record_bytes].view(base).reshape(n_records, *shape)

    def flush(self) -> None:
        """Make every write through the mapping durable."""
        if _libc.msync(self.addr, self.size, MS_SYNC):
            raise _fail("write-back (msync)", self.path, ctypes.get_errno())
        _fsync(self.fd, self.path)

    def close(self) -> None:
        self.records = self.bytes = None
        try:
            self.mm.close()
        except BufferError:
            pass  # a caller still holds a view; the mapping goes with it
        os.close(self.fd)


@dataclass
class PagerStats:
    faults: int = 0  # pages the caller had to wait to read (not prefetched in time)
    prefetched: int = 0
    evictions: int = 0  # resident pages dropped to make room (not retired)
    writebacks: int = 0
    early_writebacks: int = 0  # pages written back before retired, to make room
    peak_pages: int = 0  # most budget units in use: resident buffers + pages in the page cache
    read_bytes: int = 0
    written_bytes: int = 0


class _File:
    def __init__(self, path: str):
        self.path = str(path)
        self.fd = os.open(self.path, os.O_RDWR)
        try:  # large reads straight into our buffers; tmpfs and some others refuse O_DIRECT
            self.dfd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
        except OSError:
            self.dfd = None
        self.size = os.fstat(self.fd).st_size

    def close(self) -> None:
        os.close(self.fd)
        if self.dfd is not None:
            os.close(self.dfd)


class Pager:
    """Page buffers of one page index space over several equally sized files, within a budget.

    A resident page has one buffer; which file it was read from is the caller's business (a
    buffer may be updated in place and written to another file). Budget units: one per resident
    buffer, one per page with records written to the page cache and not yet written back.
    """

    def __init__(self, paths: list[str], page_bytes: int, budget_bytes: int, *, drop_cache: bool = True,
                 prefetch: bool = True, ahead: int | None = None):
        if page_bytes % OS_PAGE:
            raise PagerError(f"page size {page_bytes} is not a multiple of {OS_PAGE}")
        self.page_bytes = page_bytes
        self.max_pages = budget_bytes // page_bytes
        if self.max_pages < MIN_PAGES:
            raise PagerError(f"RAM budget {budget_bytes} B holds {self.max_pages} pages of {page_bytes} B; "
                             f"need >= {MIN_PAGES}")
        self.files = [_File(p) for p in paths]
        self.drop_cache = drop_cache
        if drop_cache:  # start cold, so the budget is honest about the machine's memory too
            for f in self.files:
                os.fsync(f.fd)
                os.posix_fadvise(f.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        # The pool: page-aligned (O_DIRECT), touched only as slots are used (so RSS follows use).
        self._pool_mm = mmap.mmap(-1, self.max_pages * page_bytes)
        self._pool = np.frombuffer(self._pool_mm, dtype=np.uint8).reshape(self.max_pages, page_bytes)
        self._free = list(range(self.max_pages - 1, -1, -1))  # LIFO: reuse the slots already touched
        self.slot: collections.OrderedDict[int, int] = collections.OrderedDict()  # page -> slot, LRU first
        self.token: dict[int, int] = {}  # page -> load id (changes when a page is read in again)
        self._tokens = 0
        self._loading: dict[int, int] = {}  # page -> slot, being read by the reader thread
        self._unused: set[int] = set()  # prefetched, not yet used by the caller
        # (file, page) with records in the page cache, in order of their first write
        self._cached: dict[tuple[int, int], None] = {}
        self._wb: collections.deque[tuple[int, int]] = collections.deque()  # retired, to write back
        self.ahead = max(1, self.max_pages // 2 if ahead is None else ahead)
        self._want: list[tuple[int, int]] = []  # (file, page) to read next, in order
        self.stats = PagerStats()
        self.error: StorageError | None = None
        self._cv = threading.Condition()
        self._stop = False
        self._threads = [threadname.Thread(target=self._writer, name="mindp-pager-wr", daemon=True)]
        if prefetch:
            self._threads.append(threadname.Thread(target=self._reader, name="mindp-pager-rd", daemon=True))
        for t in self._threads:
            t.start()

    # --- budget ------------------------------------------------------------------
    def _used(self) -> int:
        return len(self.slot) + len(self._loading) + len(self._cached)

    def _note_peak(self) -> None:
        self.stats.peak_pages = max(self.stats.peak_pages, self._used())

    def _room(self, keep: int | None) -> None:
        """Make one budget unit free (cv held): wait for write-back, else evict the least recently
        used resident page, else write back the page written first (never `keep`'s)."""
        while self._used() >= self.max_pages:
            if self.error:
                raise self.error
            if self._wb:  # write-back frees budget soon
                self._cv.wait(0.05)
                continue
            victim = next((p for p in self.slot if p != keep), None)
            if victim is not None:
                self._release(victim)
                self.stats.evictions += 1
                continue
            if self._loading:
                self._cv.wait(0.05)
                continue
            # Every unit is a partly written page: `keep` holds at most 2 (its buffer, its records)
            # of the budget's MIN_PAGES, so another page's records are there to write back.
            early = next(k for k in self._cached if k[1] != keep)
            self._wb.append(early)
            self.stats.early_writebacks += 1
            self._cv.notify_all()

    def _take_slot(self, keep: int | None) -> int:
        self._room(keep)
        return self._free.pop()

    def _release(self, page: int) -> None:
        self._free.append(self.slot.pop(page))
        self.token.pop(page, None)
        self._unused.discard(page)

    # --- the caller's side ---------------------------------------------------------
    def buffer(self, page: int) -> np.ndarray | None:
        """The resident buffer of `page` (uint8, page_bytes), or None."""
        with self._cv:
            s = self.slot.get(page)
            return None if s is None else self._pool[s]

    def load(self, f: int, page: int) -> np.ndarray:
        """The buffer of `page`, read from file `f` if not resident (waiting for the reader if it is
        reading it); it becomes the most recently used."""
        with self._cv:
            while True:
                while page in self._loading:
                    self._cv.wait()
                if page in self.slot:
                    self.slot.move_to_end(page)
                    if page in self._unused:
                        self._unused.discard(page)
                        self._cv.notify_all()
                    return self._pool[self.slot[page]]
                s = self._take_slot(page)  # may wait, letting the reader start on this very page
                if page not in self._loading and page not in self.slot:
                    break
                self._free.append(s)
            self._loading[page] = s
            self.stats.faults += 1
        try:
            self._read_page(f, page, self._pool[s])
        except BaseException:
            with self._cv:
                del self._loading[page]
                self._free.append(s)
                self._cv.notify_all()
            raise
        with self._cv:
            del self._loading[page]
            self._install(page, s)
            self._cv.notify_all()
            return self._pool[s]

    def _install(self, page: int, s: int) -> None:
        self.slot[page] = s
        self._tokens += 1
        self.token[page] = self._tokens
        self._note_peak()

    def hint(self, wants: list[tuple[int, int]]) -> None:
        """Pages (file, page) to read ahead, in the order they will be needed; replaces the last hint."""
        with self._cv:
            self._want = [w for w in wants if w[1] not in self.slot and w[1] not in self._loading]
            self._cv.notify_all()

    def write(self, f: int, offset: int, data: np.ndarray, page: int) -> None:
        """Write `data` (contiguous) at `offset` of file f, into the page cache: a killed process
        loses none of it. Its page counts against the budget until retired and written back."""
        fl = self.files[f]
        mv = memoryview(data).cast("B")
        with self._cv:
            while (f, page) in self._wb:  # written back early: counted again once that is done
                if self.error:
                    raise self.error
                self._cv.wait()
            if (f, page) not in self._cached:
                self._room(page)
                self._cached[f, page] = None
                self._note_peak()
        done = 0
        while done < len(mv):
            try:
                done += os.pwrite(fl.fd, mv[done:], offset + done)
            except OSError as exc:
                raise _fail("write", fl.path, exc.errno) from None
        self.stats.written_bytes += done

    def retire(self, f: int | None, page: int, keep: bool) -> None:
        """The caller is done with `page` for now: its writes to file f (if any) are written back
        in the background; its buffer stays resident only if `keep`."""
        with self._cv:
            self._want = [w for w in self._want if w[1] != page]
            if not keep and page in self.slot:
                self._release(page)
            if f is not None and (f, page) in self._cached and (f, page) not in self._wb:
                self._wb.append((f, page))
            self._cv.notify_all()

    def settle(self) -> None:
        """Cancel the read-ahead and wait for reads in flight: afterwards no buffer changes or
        appears behind the caller's back (before the source copy changes, at a commit)."""
        with self._cv:
            self._want = []
            while self._loading:
                self._cv.wait()

    def drop(self, page: int) -> None:
        """Forget the buffer of `page` (its contents are no longer what the caller needs)."""
        with self._cv:
            if page in self.slot:
                self._release(page)
                self._cv.notify_all()

    def resident(self) -> list[int]:
        with self._cv:
            return list(self.slot)

    def read(self, f: int, offset: int, nbytes: int) -> np.ndarray:
        """A small read outside the pool (resends, export): uint8 array of nbytes."""
        fl = self.files[f]
        out = np.empty(nbytes, dtype=np.uint8)
        mv = memoryview(out)
        done = 0
        while done < nbytes:
            n = os.preadv(fl.fd, [mv[done:]], offset + done)
            if n <= 0:
                raise PagerError(f"{fl.path}: short read at {offset + done}")
            done += n
        return out

    def flush(self, durable: bool = True) -> None:
        """Write back every page written so far and make the files durable (fsync; durable=False:
        none, the written-back pages are in the files for any process)."""
        with self._cv:
            self._wb.extend(k for k in self._cached if k not in self._wb)
            self._cv.notify_all()
            while self._wb and not self.error:
                self._cv.wait()
            if self.error:
                raise self.error
        for fl in self.files if durable else ():
            _fsync(fl.fd, fl.path)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            with self._cv:
                self._stop = True
                self._cv.notify_all()
            for t in self._threads:
                t.join()
            for fl in self.files:
                fl.close()
            self._pool = None
            try:
                self._pool_mm.close()
            except BufferError:
                pass

    # --- threads ---------------------------------------------------------------------
    def _read_page(self, f: int, page: int, buf: np.ndarray) -> None:
        fl = self.files[f]
        off = page * self.page_bytes
        n = min(self.page_bytes, fl.size - off)
        mv = memoryview(buf)[:n]
        done = 0
        while done < n:
            fd = fl.dfd if fl.dfd is not None and done == 0 else fl.fd
            try:
                got = os.preadv(fd, [mv[done:]], off + done)
            except OSError as exc:
                if fd == fl.dfd and exc.errno == 22:  # EINVAL: O_DIRECT refused here after all
                    fl.dfd = None
                    continue
                raise _fail("read", fl.path, exc.errno) from None
            if got <= 0:
                raise PagerError(f"{fl.path}: short read at {off + done}")
            done += got
        self.stats.read_bytes += n

    def _reader(self) -> None:
        while True:
            with self._cv:
                # One unit stays free for the caller: the records it writes next.
                while not self._stop and not (self._want and len(self._unused) < self.ahead and self._free
                                              and self._used() + 1 < self.max_pages and not self.error):
                    self._cv.wait()
                if self._stop:
                    return
                f, page = self._want.pop(0)
                if page in self.slot or page in self._loading:
                    continue
                s = self._free.pop()
                self._loading[page] = s
                self._note_peak()
            try:
                self._read_page(f, page, self._pool[s])
                ok = True
            except (StorageError, PagerError):
                ok = False  # the caller reads it again itself and sees the error
            with self._cv:
                del self._loading[page]
                if ok:
                    self._install(page, s)
                    self._unused.add(page)
                    self.stats.prefetched += 1
                else:
                    self._free.append(s)
                self._cv.notify_all()

    def _writer(self) -> None:
        # Write-back of every retired page is started at once (several writes in flight), then
        # waited for in order; a page leaves the page cache (and the budget) when it is on disk.
        wait = SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER
        started = 0  # of the queue's head items
        while True:
            with self._cv:
                while not self._stop and not self._wb:
                    self._cv.wait()
                if self._stop and not self._wb:
                    return
                queue = list(self._wb)
            err = 0
            for f, page in queue[started:]:
                if _libc.sync_file_range(self.files[f].fd, page * self.page_bytes, self.page_bytes,
                                         SYNC_FILE_RANGE_WRITE):
                    err = err or ctypes.get_errno()
            started = len(queue)
            f, page = queue[0]
            fl = self.files[f]
            off = page * self.page_bytes
            if _libc.sync_file_range(fl.fd, off, self.page_bytes, wait):
                err = err or ctypes.get_errno()
            elif self.drop_cache:
                os.posix_fadvise(fl.fd, off, self.page_bytes, os.POSIX_FADV_DONTNEED)
            started -= 1
            with self._cv:
                self._wb.popleft()
                if err and err != 38:  # ENOSYS: no sync_file_range here; fsync at commit covers it
                    self.error = self.error or _fail("write-back (sync_file_range)", fl.path, err)
                else:
                    self._cached.pop((f, page), None)
                    self.stats.writebacks += 1
                self._cv.notify_all()
