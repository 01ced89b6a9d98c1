"""A worker's checks of each step against put(), side by side, without the network: over the
tensors of the default gpt (1.3M elements; `--elements` for another count), the time of

- holds(): that no gradient changed after backward() sent it (gradframes.holds, in put()'s own
  compiled kernel comparing instead of writing), against the put() that wrote the frames;
- the parameter check: that no parameter was edited through `.data` since the network wrote it
  (parallel.same_bits: widened's compiled pass for float32), against the torch path it takes
  without numba, and against finish()'s copy of the fp16 values into the parameters.

K is the process's (MINDP_K). .venv/bin/python bench/checks.py [--rounds N] [--elements N]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

from host_agent import fused, gradframes  # noqa: E402
from host_agent.agent_args import integer  # noqa: E402
from mindp import codec  # noqa: E402
from mindp.protocol import K, Kind  # noqa: E402


def tensor_sizes(elements: int | None) -> list[int]:
    """The default gpt's trained tensors' sizes (torch installed, `elements` None), else `elements`
    (20 tensors' worth by default) in tensors of 65,536."""
    if elements is None:
        try:
            from mindp.torch import models, parallel
            return [p.numel() for _, p in parallel.trained(models.build("gpt", {}, 0))]
        except ImportError:
            elements = 20 * 65536
    return [65536] * (elements // 65536) + ([elements % 65536] if elements % 65536 else [])


def timed(fn, rounds: int) -> float:
    """Median seconds of fn() over `rounds` calls, after one untimed."""
    fn()
    took = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        took.append(time.perf_counter() - t)
    return float(np.median(took))


def gradient_checks(sizes: list[int], rounds: int) -> tuple[float, float]:
    """(put, holds) seconds over tensors of `sizes` laid out one after another in a step's frames."""
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    offs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    frames = np.zeros((-(-sum(sizes) // K), codec.frame_len(Kind.GRAD)), np.uint8)
    flags = np.zeros(len(frames), np.uint8)

    def put():
        for off, g in zip(offs, grads):
            gradframes.put(frames, int(off), g, flags)

    def holds():
        assert all(gradframes.holds(frames, int(off), g) for off, g in zip(offs, grads))
    return timed(put, rounds), timed(holds, rounds)


def parameter_checks(sizes: list[int], rounds: int) -> tuple[float, float, float] | None:
    """(finish()'s copy, compiled check, torch check) seconds, or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    from mindp.torch import parallel
    torch.set_num_threads(1)
    rng = np.random.default_rng(1)
    values = [rng.standard_normal(n).astype(np.float16) for n in sizes]
    params = [torch.nn.Parameter(torch.empty(n)) for n in sizes]
    scratch: dict = {}

    def copy():
        with torch.no_grad():
            for p, v in zip(params, values):
                p.copy_(torch.from_numpy(v))

    def check(compiled: bool):
        def run():
            assert all(parallel.same_bits(p, v, scratch, compiled) for p, v in zip(params, values))
        return run
    copy()
    return timed(copy, rounds), timed(check(True), rounds), timed(check(False), rounds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=integer(1), default=21, help="timed calls per figure, the median printed (default 21)")
    ap.add_argument("--elements", type=integer(1), help="elements in all, in tensors of 65,536 (default: the gpt's tensors)")
    args = ap.parse_args(argv)
    if fused.NUMPY_ONLY:  # (make bench goes on to the next script)
        print("bench/checks.py: skipped: numba is off (MINDP_NO_NUMBA=1 or not installed): nothing compiled to time")
        return 0
    sizes = tensor_sizes(args.elements)
    print(f"K = {K}, {sum(sizes):,} elements in {len(sizes)} tensors, median of {args.rounds} calls")
    put, holds = gradient_checks(sizes, args.rounds)
    print(f"  gradients: put {put * 1e3:.3f} ms, holds {holds * 1e3:.3f} ms: holds / put {holds / put:.2f}")
    par = parameter_checks(sizes, args.rounds)
    if par is None:
        print("  parameters: skipped (no torch)")
        return 0
    copy, compiled, through_torch = par
    print(f"  parameters: finish()'s copy {copy * 1e3:.3f} ms, check compiled {compiled * 1e3:.3f} ms, through torch "
          f"{through_torch * 1e3:.3f} ms: compiled / copy {compiled / copy:.2f}, through torch / compiled "
          f"{through_torch / compiled:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
