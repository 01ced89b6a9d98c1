"""The pager: page buffers read ahead by its reader thread, written back by its writer thread,
durable at flush, and never more than the budget in use."""
import time

import numpy as np
import pytest

from host_agent.pager import MappedFile, Pager, PagerError

REC = np.dtype((np.float32, (3, 32)))
PAGE_RECS = 32  # 12 KiB pages
PAGE = PAGE_RECS * REC.itemsize


def make_files(tmp_path, n_records, count=2, fill=None):
    paths = []
    for i in range(count):
        p = tmp_path / f"f{i}.bin"
        data = np.zeros((n_records, 3, 32), np.float32) if fill is None else fill[i]
        data.tofile(p)
        paths.append(str(p))
    return paths


def pool_rss(pager) -> int:
    """Resident bytes of the pager's buffer pool (from /proc/self/smaps)."""
    start = pager._pool.ctypes.data
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        head = line.split(" ", 1)[0]
        if "-" in head and not line.startswith(("Rss", "Size")):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= start < hi
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


@pytest.mark.parametrize("prefetch", [True, False])
def test_stream_one_file_into_the_other_within_budget_and_durably(tmp_path, prefetch):
    """Each page read from file 0, updated in its buffer, written to file 1, retired: file 1 ends
    with every page updated, the budget holds, and a reopened pager reads the new data."""
    n = 64 * PAGE_RECS
    rng = np.random.default_rng(0)
    src = rng.standard_normal((n, 3, 32)).astype(np.float32)
    paths = make_files(tmp_path, n, fill=[src, np.zeros_like(src)])
    pager = Pager(paths, PAGE, 8 * PAGE, prefetch=prefetch, ahead=3)
    for page in range(64):
        pager.hint([(0, p) for p in range(page + 1, min(64, page + 4))])
        buf = pager.load(0, page).view(np.float32)
        buf *= 2
        half = len(buf) // 2  # written in two parts, as two batches of sums would be
        pager.write(1, page * PAGE, buf[:half], page)
        pager.write(1, page * PAGE + half * 4, buf[half:], page)
        pager.retire(1, page, keep=False)
        assert pool_rss(pager) <= 8 * PAGE
    pager.flush()
    assert pager.stats.peak_pages <= 8
    assert pager.stats.writebacks >= 64 and pager.stats.read_bytes == 64 * PAGE
    assert (pager.stats.prefetched > 50) == prefetch
    pager.close()
    assert np.array_equal(np.fromfile(paths[1], np.float32).reshape(n, 3, 32), 2 * src)
    again = Pager(paths, PAGE, 4 * PAGE, prefetch=False)
    assert np.array_equal(again.read(1, 5 * PAGE, PAGE).view(np.float32), 2 * src[5 * PAGE_RECS : 6 * PAGE_RECS].reshape(-1))
    again.close()


def test_prefetch_brings_pages_in_ahead_of_use(tmp_path):
    n = 16 * PAGE_RECS
    paths = make_files(tmp_path, n, 1)
    pager = Pager(paths, PAGE, 8 * PAGE, ahead=4)
    pager.hint([(0, p) for p in range(4)])
    for _ in range(200):
        if pager.stats.prefetched == 4:
            break
        time.sleep(0.005)
    assert pager.stats.prefetched == 4
    for p in range(4):
        pager.load(0, p)
    assert pager.stats.faults == 0
    pager.close()


def test_kept_pages_stay_and_others_make_room(tmp_path):
    """A retired page kept stays resident with its contents; loading beyond the budget evicts the
    least recently used page, never the one being loaded."""
    n = 8 * PAGE_RECS
    paths = make_files(tmp_path, n, 1, fill=[np.arange(n * 96, dtype=np.float32).reshape(n, 3, 32)])
    pager = Pager(paths, PAGE, 4 * PAGE, prefetch=False)
    pager.load(0, 0)[:4] = 7
    pager.retire(None, 0, keep=True)
    assert pager.buffer(0)[:4].tolist() == [7, 7, 7, 7]
    for p in range(1, 6):
        pager.load(0, p)
    assert len(pager.resident()) == 4 and pager.stats.evictions == 2
    assert 5 in pager.resident() and 0 not in pager.resident()
    pager.close()


def test_pages_left_partly_written_make_room_by_early_write_back(tmp_path):
    """Every page half updated and written before any is finished (a stalled slot's chunks left
    out of each), 8 pages through a budget of 4: the buffers are evicted, then the half-written
    pages written back early; each page is finished later from a buffer read again. Never more than
    the budget in use, never an error, and the file ends with every record updated once."""
    n = 8 * PAGE_RECS
    rng = np.random.default_rng(1)
    src = rng.standard_normal((n, 3, 32)).astype(np.float32)
    paths = make_files(tmp_path, n, fill=[src, np.zeros_like(src)])
    pager = Pager(paths, PAGE, 4 * PAGE, prefetch=False)
    half = PAGE // 2
    for part in (0, 1):
        for page in range(8):
            buf = pager.load(0, page)[part * half : (part + 1) * half].view(np.float32)
            buf *= 2
            pager.write(1, page * PAGE + part * half, buf, page)
            if part:
                pager.retire(1, page, keep=False)
            assert pager._used() <= 4
    assert pager.stats.evictions > 0 and pager.stats.early_writebacks >= 4
    assert pager.stats.read_bytes == 16 * PAGE  # each page read again to be finished
    pager.close()
    assert pager.stats.peak_pages <= 4
    assert np.array_equal(np.fromfile(paths[1], np.float32).reshape(n, 3, 32), 2 * src)


def test_mapped_file_flush_makes_writes_durable(tmp_path):
    n = 4 * PAGE_RECS
    paths = make_files(tmp_path, n, 1)
    mf = MappedFile(paths[0], REC, n)
    mf.records[3] = 7.0
    mf.flush()
    raw = np.fromfile(paths[0], dtype=np.float32).reshape(n, 3, 32)
    assert (raw[3] == 7.0).all() and (raw[2] == 0).all()
    mf.close()


def test_mapped_files_fault_once_a_large_folio_however_they_were_made(tmp_path):
    """The state's copies, one written by write() and one only reserved (fallocate, as state.create
    makes them), are mapped in large folios both: a step's writes after a commit (the write-back
    leaves the mapping write-protected) fault once a folio, not once a 4 KiB page."""
    import os
    import resource

    n = 32768  # 12 MiB of records
    raw = np.random.default_rng(7).standard_normal((n, 3, 32)).astype(np.float32)
    neg = -raw
    written, reserved = tmp_path / "w.bin", tmp_path / "r.bin"
    raw.tofile(written)
    with open(reserved, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, raw.nbytes)
    faults = {}
    for path in (written, reserved):
        with open(path, "rb+") as f:
            os.fsync(f.fileno())
        mf = MappedFile(str(path), REC, n)
        mf.records[:] = raw
        mf.flush()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        mf.records[:] = neg
        faults[path.name] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        mf.flush()
        assert np.array_equal(np.fromfile(path, np.float32).reshape(n, 3, 32), neg)
        mf.close()
    pages = raw.nbytes // 4096
    if faults["w.bin"] >= pages // 4:
        pytest.skip(f"no large folios here: {faults['w.bin']} faults for {pages} pages written")
    assert faults["r.bin"] < pages // 4, faults


def test_budget_below_four_pages_is_refused(tmp_path):
    paths = make_files(tmp_path, PAGE_RECS, 1)
    with pytest.raises(PagerError, match="need >= 4"):
        Pager(paths, PAGE, 3 * PAGE)
