"""Issue 12.4 at 10 M parameters (bench/ooc.py runs 1 billion): a state 30 times the RAM
budget, 3 steps of synthetic sums through NodeCore, the node killed (SIGKILL, another process)
mid-step and restarted: the final state equals an uninterrupted run's bit for bit, and the
process stays within the budget plus its fixed overhead."""
import shutil

from host_agent import synthetic
from host_agent.state import RECORD, page_chunks_for
from mindp.protocol import K

PARAMS = 10_000_000
BUDGET = 8 << 20
PAGE_CHUNKS = page_chunks_for(1 << 14)  # pages of 192 KiB at any K: 42 in the budget


def test_killed_mid_step_and_resumed_equals_uninterrupted(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    synthetic.create(straight, PARAMS, PAGE_CHUNKS)
    shutil.copytree(straight, killed)  # the same initial state for both runs
    n_chunks = -(-PARAMS // K)
    assert 2 * n_chunks * RECORD.itemsize >= 25 * BUDGET

    ref = synthetic.run(straight, 3, BUDGET)
    assert ref["committed"] == 2 and len(ref["times"]) == 3
    out = synthetic.run_killed(killed, 3, BUDGET, kill_step=1)
    assert 0 < out["resumed_chunks"] < n_chunks  # killed mid-step 1; the restart kept its applied chunks
    assert out["committed"] == 2
    assert synthetic.checksum(killed) == synthetic.checksum(straight)
    # Fixed overhead: the process before the state is opened, the progress map (a byte a chunk),
    # one batch of sums and answers in flight.
    overhead = n_chunks + (32 << 20)
    for figures in (ref, out):
        assert figures["peak_pages"] * figures["page_bytes"] <= BUDGET
        assert figures["vm_hwm_kb"] * 1024 <= figures["rss_base_kb"] * 1024 + BUDGET + overhead
