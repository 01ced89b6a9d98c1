"""Per-job statistics from counter cells, and rates between two reads."""
import pytest

from controller import p4info_names as n
from controller.stats import rates, snapshot


def cells(job, grads, sums, drops_not_member=0, no_job_no_route=0):
    return {
        n.GRAD_PACKETS: {job: (grads, grads * 110), job + 1: (999, 1)},
        n.COMPLETIONS: {job: (sums, 0)},
        n.DUPLICATES: {job: (2, 0)},
        n.RESENT_SUMS: {job: (1, 0)},
        n.PARAM_PACKETS: {job: (sums, sums * 110)},
        n.REWRITE_MISSES: {},
        n.DROPS: {n.drop_cell(job, n.DropReason.NOT_MEMBER): (drops_not_member, 0),
                  n.drop_cell(job + 1, n.DropReason.STALE): (5, 0),
                  n.drop_cell(n.NO_JOB_ROW, n.DropReason.NO_ROUTE): (no_job_no_route, 0)},
    }


def test_snapshot_picks_each_jobs_cells():
    s = snapshot(cells(3, grads=30, sums=10, drops_not_member=4, no_job_no_route=7), 100.0, [3])
    c = s.jobs[3]
    assert (c.grad_packets, c.grad_bytes, c.completions, c.duplicates, c.resent_sums) == (30, 3300, 10, 2, 1)
    assert (c.param_packets, c.param_bytes, c.rewrite_misses) == (10, 1100, 0)
    assert c.drops == {"NOT_MEMBER": 4} and c.dropped == 4  # job 4's STALE drops are not job 3's
    assert s.no_job.drops == {"NO_ROUTE": 7}
    assert list(s.to_dict()["jobs"]) == ["3"]


def test_rates_between_two_reads():
    a = snapshot(cells(3, grads=30, sums=10), 100.0, [3])
    b = snapshot(cells(3, grads=90, sums=30, drops_not_member=8), 102.0, [3])
    r = rates(a, b)[3]
    assert r["grad_packets"] == 30.0 and r["completions"] == 10.0 and r["duplicates"] == 0.0
    assert r["dropped"] == 4.0 and r["drop.NOT_MEMBER"] == 4.0
    with pytest.raises(ValueError):
        rates(b, a)


def test_a_job_new_in_the_second_read_counts_from_zero():
    a = snapshot(cells(3, grads=30, sums=10), 100.0, [])
    b = snapshot(cells(3, grads=40, sums=10), 110.0, [3])
    assert rates(a, b)[3]["grad_packets"] == 4.0
