"""Random frame bodies for the batched-I/O tests."""
import numpy as np


def body(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()
