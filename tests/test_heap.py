"""mindp.heap: a process that frees and allocates the same memory every step (a training step's
activations) takes it from its heap again, not as fresh pages the kernel faults in and zeroes."""
import pytest

from mindp import heap
from tests.heap_steps import FRESH, faults_a_step


@pytest.mark.skipif(heap._MALLOPT is None, reason="the C library has no mallopt")
def test_freed_memory_is_kept_for_the_next_step():
    default, kept = faults_a_step(), faults_a_step("from mindp import heap\nassert heap.keep_freed()")
    assert default > FRESH  # fresh pages again each step: glibc gave them back
    assert kept * 20 < default
