"""mindp.heap: a process that frees and allocates the same memory every step (a training step's
activations) takes it from its heap again, not as fresh pages the kernel faults in and zeroes."""
import subprocess
import sys

import pytest

from mindp import heap

STEPS = """
import resource, sys
import numpy as np
from mindp import heap
if sys.argv[1] == "keep":
    assert heap.keep_freed()
faults = []
for _ in range(5):  # a step: 64 MiB in 8 arrays, written, then freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    arrays = [np.ones(1 << 20) for _ in range(8)]
    del arrays
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(min(faults[2:]))
"""


def faults_a_step(mode: str) -> int:
    return int(subprocess.run([sys.executable, "-c", STEPS, mode], check=True, capture_output=True, text=True).stdout)


@pytest.mark.skipif(heap._MALLOPT is None, reason="the C library has no mallopt")
def test_freed_memory_is_kept_for_the_next_step():
    default, kept = faults_a_step("default"), faults_a_step("keep")
    assert default > (64 << 20) // 4096 // 8  # fresh pages again each step: glibc gave them back
    assert kept * 20 < default
