"""Which slot and slot version each (step, chunk) of a job uses (docs/DESIGN.md invariant 3).

Chunk c uses slot c mod S. The uses of one slot follow each other in
(step, chunk) order; its version alternates 0, 1, 0, ... with each use, so the
other version still holds the previous use's result for retransmissions.
Workers, the optimizer node and the tests all take slots from here: the scalar
functions for one chunk, `slots_and_versions` for many at once.
"""
from __future__ import annotations

import numpy as np


def slot_of(chunk: int, slots: int) -> int:
    return chunk % slots


def uses_per_step(slot: int, n_chunks: int, slots: int) -> int:
    """How many chunks of one step land in `slot`."""
    return max(0, -(-(n_chunks - slot) // slots))


def use_index(step: int, chunk: int, n_chunks: int, slots: int) -> int:
    """The ordinal of this use of its slot since step 0."""
    slot = slot_of(chunk, slots)
    return step * uses_per_step(slot, n_chunks, slots) + chunk // slots


def version_of(step: int, chunk: int, n_chunks: int, slots: int) -> int:
    return use_index(step, chunk, n_chunks, slots) & 1


def slots_and_versions(step, chunks, n_chunks: int, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """slot_of and version_of for many chunks at once; `step` is one step or one per chunk."""
    chunks = np.asarray(chunks, dtype=np.int64)
    slot = chunks % slots
    uses = -(-(n_chunks - slot) // slots)  # uses_per_step of each chunk's slot
    return slot, (np.asarray(step, dtype=np.int64) * uses + chunks // slots) & 1
