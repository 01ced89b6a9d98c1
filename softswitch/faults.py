"""Seeded fault injection on links: drop, duplicate and reorder frames.

Applied to each frame the switch receives and each frame it sends, so a frame
crossing the switch traverses two lossy links. A reordered frame is held back
and released after the next frame in the same direction on the same port (or
when the link has been idle for `hold_s`).
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass


@dataclass
class FaultConfig:
    drop: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    seed: int = 0

    @property
    def active(self) -> bool:
        return bool(self.drop or self.dup or self.reorder)

    def check(self) -> None:
        for name in ("drop", "dup", "reorder"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"--{name}-prob must be within [0, 1], got {p}")


@dataclass
class FaultStats:
    dropped: int = 0
    duplicated: int = 0
    reordered: int = 0


class LinkFaults:
    def __init__(self, cfg: FaultConfig, hold_s: float = 0.002):
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.hold_s = hold_s
        self.held: dict = {}  # (direction, port) -> (frame, since)
        self.stats = FaultStats()

    def apply(self, key, frame: bytes) -> list[bytes]:
        """Frames to deliver now, in order, for one frame on link `key`."""
        c, r = self.cfg, self.rng
        if c.drop and r.random() < c.drop:
            self.stats.dropped += 1
            return self._release(key, [])
        frames = [frame]
        if c.dup and r.random() < c.dup:
            self.stats.duplicated += 1
            frames.append(frame)
        if c.reorder and key not in self.held and r.random() < c.reorder:
            self.stats.reordered += 1
            self.held[key] = (frames.pop(), time.monotonic())
            return frames
        return self._release(key, frames)

    def _release(self, key, frames: list[bytes]) -> list[bytes]:
        held = self.held.pop(key, None)
        if held is not None:
            frames.append(held[0])
        return frames

    def expired(self) -> list:
        """(key, frame) held longer than hold_s: deliver them now."""
        if not self.held:
            return []
        now = time.monotonic()
        out = [(k, fr) for k, (fr, t) in self.held.items() if now - t >= self.hold_s]
        for k, _ in out:
            del self.held[k]
        return out
