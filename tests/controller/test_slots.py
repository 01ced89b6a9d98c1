"""Slot pool: first fit, disjoint ranges, clear exhaustion and fragmentation errors."""
import pytest

from controller.slots import PoolExhausted, PoolFragmented, SlotError, SlotPool, SlotRange


def test_first_fit_packs_from_the_bottom():
    pool = SlotPool(100)
    assert pool.allocate(1, 10) == SlotRange(0, 10)
    assert pool.allocate(2, 30) == SlotRange(10, 30)
    assert pool.free == 60
    assert pool.free_ranges() == [SlotRange(40, 60)]


def test_freed_range_is_reused_first_fit():
    pool = SlotPool(100)
    pool.allocate(1, 10)
    pool.allocate(2, 30)
    pool.allocate(3, 20)
    assert pool.release(2) == SlotRange(10, 30)
    assert pool.allocate(4, 25) == SlotRange(10, 25)  # lowest gap that fits
    assert pool.allocate(5, 10) == SlotRange(60, 10)  # 35..39 too small
    assert pool.allocate(6, 5) == SlotRange(35, 5)


def test_exhaustion_names_need_and_free():
    pool = SlotPool(64)
    pool.allocate(1, 60)
    with pytest.raises(PoolExhausted, match="needs 5 slots, 4 of 64 free"):
        pool.allocate(2, 5)
    assert pool.allocations == {1: SlotRange(0, 60)}  # nothing recorded on failure


def test_fragmentation_is_told_apart_from_exhaustion():
    pool = SlotPool(30)
    for j in range(3):
        pool.allocate(j, 10)
    pool.release(0)
    pool.release(2)
    with pytest.raises(PoolFragmented, match="20 free but the largest gap is 10"):
        pool.allocate(9, 15)


def test_whole_pool_and_bad_counts():
    pool = SlotPool()
    assert pool.allocate(0, 1024) == SlotRange(0, 1024)
    with pytest.raises(PoolExhausted):
        pool.allocate(1, 1)
    for bad in (0, -1, 1025):
        with pytest.raises(SlotError, match="outside"):
            SlotPool().allocate(1, bad)


def test_one_range_per_job():
    pool = SlotPool()
    pool.allocate(3, 8)
    with pytest.raises(SlotError, match="job 3 already holds slots 0..7"):
        pool.allocate(3, 8)


def test_claim_rejects_overlap_and_out_of_pool():
    pool = SlotPool(100)
    pool.claim(1, SlotRange(50, 10))
    with pytest.raises(SlotError, match="overlap job 1"):
        pool.claim(2, SlotRange(55, 10))
    with pytest.raises(SlotError, match="outside the pool"):
        pool.claim(3, SlotRange(95, 10))
    pool.claim(2, SlotRange(0, 50))
    assert pool.allocate(4, 40) == SlotRange(60, 40)


def test_map_covers_the_pool_in_order():
    pool = SlotPool(100)
    pool.allocate(1, 10)
    pool.allocate(2, 10)
    pool.release(1)
    assert pool.map() == [(0, 10, None), (10, 10, 2), (20, 80, None)]
    assert sum(c for _, c, _ in pool.map()) == 100
