"""The pager: data survives eviction and reopening; residency stays within the budget."""
import re
import time

import numpy as np
import pytest

from host_agent.pager import MappedFile, Pager, PagerError

REC = np.dtype((np.float32, (3, 32)))
PAGE_RECS = 32  # 12 KiB pages
PAGE = PAGE_RECS * REC.itemsize


def make_files(tmp_path, n_records, count=2):
    paths = []
    for i in range(count):
        p = tmp_path / f"f{i}.bin"
        with open(p, "wb") as f:
            f.truncate(n_records * REC.itemsize)
        paths.append(p)
    return paths


def mapping_rss(paths) -> int:
    """Resident bytes of this process's mappings of `paths` (from /proc/self/smaps)."""
    names = {str(p) for p in paths}
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            inside = line.split()[-1] in names
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


@pytest.mark.parametrize("prefetch", [True, False])
def test_writes_survive_eviction_and_reopen_within_budget(tmp_path, prefetch):
    n = 64 * PAGE_RECS  # 64 pages a file, 128 in all; budget 8 pages
    paths = make_files(tmp_path, n)
    budget = 8 * PAGE
    pager = Pager([MappedFile(p, REC, n) for p in paths], PAGE, budget, prefetch=prefetch)
    rng = np.random.default_rng(0)
    expect = rng.standard_normal((n, 3, 32)).astype(np.float32)
    peak = 0
    for lo in range(0, n, PAGE_RECS):
        if prefetch:
            page = lo // PAGE_RECS
            pager.hint([(f, p, True) for p in range(page, page + 3) for f in (0, 1)])
        pager.records(0, lo, lo + PAGE_RECS, write=True)[...] = expect[lo : lo + PAGE_RECS]
        pager.records(1, lo, lo + PAGE_RECS, write=True)[...] = -expect[lo : lo + PAGE_RECS]
        peak = max(peak, mapping_rss(paths))
    assert pager.stats.peak_pages <= 8
    assert pager.stats.evictions >= 120 and pager.stats.writebacks >= 120
    assert peak <= budget + PAGE  # one page of slack: a sample can fall between unmap and register
    pager.close()
    again = Pager([MappedFile(p, REC, n) for p in paths], PAGE, budget, prefetch=False)
    for lo in range(0, n, PAGE_RECS):
        assert np.array_equal(again.records(0, lo, lo + PAGE_RECS), expect[lo : lo + PAGE_RECS])
        assert np.array_equal(again.records(1, lo, lo + PAGE_RECS), -expect[lo : lo + PAGE_RECS])
    again.close()


def test_prefetch_brings_pages_in_ahead_of_use(tmp_path):
    n = 16 * PAGE_RECS
    paths = make_files(tmp_path, n, 1)
    pager = Pager([MappedFile(paths[0], REC, n)], PAGE, 8 * PAGE)
    pager.hint([(0, p, False) for p in range(4)])
    for _ in range(200):
        if pager.stats.prefetched == 4:
            break
        time.sleep(0.005)
    assert pager.stats.prefetched == 4
    for p in range(4):
        pager.records(0, p * PAGE_RECS, (p + 1) * PAGE_RECS)
    assert pager.stats.faults == 0
    pager.close()


def test_flush_makes_writes_durable_in_the_file(tmp_path):
    n = 4 * PAGE_RECS
    paths = make_files(tmp_path, n, 1)
    pager = Pager([MappedFile(paths[0], REC, n)], PAGE, 4 * PAGE, prefetch=False)
    pager.records(0, 3, 4, write=True)[...] = 7.0
    pager.flush()
    raw = np.fromfile(paths[0], dtype=np.float32).reshape(n, 3, 32)
    assert (raw[3] == 7.0).all() and (raw[2] == 0).all()
    pager.close()


def test_budget_below_four_pages_is_refused(tmp_path):
    paths = make_files(tmp_path, PAGE_RECS, 1)
    with pytest.raises(PagerError, match="need >= 4"):
        Pager([MappedFile(paths[0], REC, PAGE_RECS)], PAGE, 3 * PAGE)
