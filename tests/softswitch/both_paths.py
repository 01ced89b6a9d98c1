"""The compiled and the Python pipeline of one program side by side: frames run through an engine in
batches as the packet loop runs them, the two paths' outputs and state compared, and random frames
(the test programs' seeds, cut, flipped and padded) to compare them on."""
from __future__ import annotations

import struct

import numpy as np

from softswitch.batch import Batch
from softswitch.engine import Engine

from . import engines as te


# --- running frames through an engine ----------------------------------------------------
def run(eng: Engine, frames: list[tuple[bytes, int]], batch: int = 32, tx_slots: int = 64) -> list:
    """Frames through eng.run_batch `batch` at a time, as the packet loop does: (port, frame) out."""
    rx, tx = Batch.empty(batch), Batch.empty(tx_slots)
    out = []
    for i in range(0, len(frames), batch):
        rx.n = 0
        for frame, port in frames[i:i + batch]:
            assert rx.append(frame, port)
        start = 0
        while start < rx.n:
            tx.n = 0
            nxt = eng.run_batch(rx, start, tx)
            assert nxt > start or tx.n, "no progress"
            out += [(int(tx.ports[j]), tx.frame(j)) for j in range(tx.n)]
            start = nxt
    return out


def state(eng: Engine):
    p, s = eng.program, eng.stats
    direct = {t.name: sorted((repr(k), tuple(e.counter)) for k, e in t.entries.items()) for t in p.tables.values()}
    return ({n: list(r) for n, r in p.registers.items()}, {n: (list(a), list(b)) for n, (a, b) in p.counters.items()},
            direct, (s.dropped, s.mcast_empty, s.errors))


def assert_same(native: Engine, python: Engine, frames, batch=32):
    assert native.native is not None, "the compiled path is not in use"
    assert python.native is None
    got, want = run(native, frames, batch), run(python, frames, batch)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"output {i} differs: {g[0]} {g[1].hex()} vs {w[0]} {w[1].hex()}"
    assert state(native) == state(python)
    return got


# --- frames ------------------------------------------------------------------------------------
def mutations(rng, seeds: list[bytes], n: int, ports=range(0, 9)) -> list[tuple[bytes, int]]:
    """Seeds as they are, cut, with flipped bytes, with a random tail, and random bytes."""
    out = []
    for _ in range(n):
        seed = seeds[int(rng.integers(len(seeds)))]
        kind = int(rng.integers(6))
        if kind == 0:
            frame = rng.integers(0, 256, int(rng.integers(0, 200)), np.uint8).tobytes()
        elif kind == 1:
            frame = seed[:int(rng.integers(0, len(seed) + 1))]
        elif kind == 2:
            b = bytearray(seed)
            for _ in range(int(rng.integers(1, 4))):
                if b:
                    b[int(rng.integers(len(b)))] = int(rng.integers(256))
            frame = bytes(b)
        elif kind == 3:
            frame = seed + rng.integers(0, 256, int(rng.integers(1, 64)), np.uint8).tobytes()
        else:
            frame = seed
        out.append((frame, int(ports[int(rng.integers(len(ports)))])))
    return out


def generic_seeds(rng, n: int = 60) -> list[bytes]:
    """Frames for the test programs: IPv4 to the features program's routes, and the EtherTypes of
    the exprs, parser and stacks programs with random bodies."""
    seeds = []
    for _ in range(n):
        src = [0x0A000001, 0x0A000007, 0x0B000001][int(rng.integers(3))]
        dst = [0x0A010203, 0x0A01FF01, 0x0A020001, 0x0C000001][int(rng.integers(4))] ^ int(rng.integers(256))
        seeds.append(te.feat_frame(src=src, dst=dst, ttl=int(rng.integers(0, 40)), tos=int(rng.integers(0, 8))))
        body = rng.integers(0, 256, int(rng.integers(0, 40)), np.uint8).tobytes()
        etype = [0x88B5, 0x88B6, 0x0800, int(rng.integers(0x10000))][int(rng.integers(4))]
        seeds.append(te.MAC_A + te.MAC_B[:5] + bytes([int(rng.integers(256))]) + struct.pack("!H", etype) + body)
    return seeds
