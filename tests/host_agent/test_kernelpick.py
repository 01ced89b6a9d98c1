"""host_agent.kernelpick: under MINDP_KERNEL=auto the node runs whichever update kernel is faster on
this CPU; a kernel named by MINDP_KERNEL is run as named."""
import itertools

import pytest

from host_agent import fused, kernelpick
from host_agent.optim import OptimizerConfig

needs_both = pytest.mark.skipif(fused.NUMPY_ONLY or not fused.host_has_avx2(),
                                reason="needs numba and a CPU with AVX2 and F16C (both kernels)")


def clock_timing(avx2: float, portable: float):
    """A clock under which each avx2 call takes `avx2` and each portable call `portable` (faster()
    times them in turn: avx2's start and end, then portable's, round after round)."""
    now = 0.0
    steps = itertools.cycle([0.0, avx2, 0.0, portable])

    def clock() -> float:
        nonlocal now
        now += next(steps)
        return now
    return clock


@needs_both
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_the_faster_kernel_is_picked(kind):
    assert kernelpick.faster.__wrapped__(kind, clock_timing(2.0, 1.0)) == "portable"
    assert kernelpick.faster.__wrapped__(kind, clock_timing(1.0, 2.0)) == "avx2"


@needs_both
def test_auto_runs_the_measured_one_and_a_named_kernel_as_named(monkeypatch):
    monkeypatch.delenv("MINDP_KERNEL", raising=False)
    assert kernelpick.update_kernel(OptimizerConfig()) == kernelpick.faster("adamw")
    for kernel in ("avx2", "portable"):
        monkeypatch.setenv("MINDP_KERNEL", kernel)
        assert kernelpick.update_kernel(OptimizerConfig()) == kernel


def test_a_cpu_without_avx2_runs_the_portable_kernel_unmeasured(monkeypatch):
    monkeypatch.delenv("MINDP_KERNEL", raising=False)
    monkeypatch.setattr(fused, "host_has_avx2", lambda: False)
    monkeypatch.setattr(kernelpick, "faster", lambda *a: pytest.fail("measured"))
    assert kernelpick.update_kernel(OptimizerConfig()) == ("numpy" if fused.NUMPY_ONLY else "portable")
