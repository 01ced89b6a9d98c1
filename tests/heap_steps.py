"""A process's page faults a step while it frees and allocates the same 64 MiB every step (a
training step's activations), after a setup of the caller's: how tests/test_heap.py and the bench's
test see whether a process keeps the memory a step frees (mindp/heap.py)."""
from __future__ import annotations

import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
FRESH = (64 << 20) // 4096 // 8  # more faults a step than this: the kernel gave fresh pages again

STEPS = """
import resource
import numpy as np
SETUP
faults = []
for _ in range(5):  # a step: 64 MiB in 8 arrays, written, then freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    arrays = [np.ones(1 << 20) for _ in range(8)]
    del arrays
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(min(faults[2:]))
"""


def faults_a_step(setup: str = "") -> int:
    """The fewest faults a step of the steps after the first two, in a new process that ran `setup`
    (Python lines, from the repository's root) first."""
    return int(subprocess.run([sys.executable, "-c", STEPS.replace("SETUP", setup)], cwd=REPO, check=True,
                              capture_output=True, text=True).stdout)
