"""What keeps parallel test workers apart: each its own port slice and its own name tag."""
import subprocess
import sys

from mindp import targets, testbed


def test_port_slices_are_disjoint_and_free_port_keeps_to_its_own(monkeypatch):
    slices = [tuple(map(int, targets.slice_of(i, 4).split("-"))) for i in range(4)]
    assert all(a[1] <= b[0] for a, b in zip(slices, slices[1:])) and slices[0][0] >= 10000
    monkeypatch.setenv(targets.PORTS_ENV, targets.slice_of(2, 4))
    lo, hi = slices[2]
    assert all(lo <= targets.free_port() < hi for _ in range(50))


def test_beds_of_two_workers_never_share_a_name(monkeypatch):
    names = []
    for tag in ("0", "1"):
        monkeypatch.setenv(testbed.TAG_ENV, tag)
        bed = testbed.Testbed("dp")  # names only: no host added
        names.append((bed.prefix, testbed.tagged("ss-")))
    assert names == [("dp0", "ss-0"), ("dp1", "ss-1")]
    monkeypatch.delenv(testbed.TAG_ENV)
    assert testbed.Testbed("dp").prefix == "dp"  # outside a parallel run: the names as given


def test_a_claimed_tag_is_not_handed_to_another_process():
    mine = testbed.claim_tag()
    other = subprocess.run([sys.executable, "-c", "from mindp import testbed; print(testbed.claim_tag())"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert len(mine) == len(other) == 1 and other != mine and mine != testbed.claim_tag()
