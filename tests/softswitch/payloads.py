"""Frames for the batched-I/O tests: the size of a batch's slot (softswitch.batch's) and random bodies."""
import numpy as np

SLOT = 65544


def body(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()
