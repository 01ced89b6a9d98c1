"""A receive ring against a scripted kernel (no socket): the kernel fills slots in order but hands
them over in any order (a copy still running on another CPU), drops frames while the ring is full,
and reuses a slot the moment the reader gives it back. Every reader of mindp.rxring (the agents'
receive_rows, recv_batch's frames_waiting, the switch's receive) must then take every frame the
kernel kept, once, in order, with its own bytes: a slot given back before its frame was copied
(or a frame handed out as a view into the ring) reads the next frame's bytes with the right
length, which only a loaded machine would show otherwise."""
import random

import numpy as np
import pytest

from mindp import rxring

from .fake_ring import FakeRing

WIDTH = 48  # the frames the readers want; FakeRing's 128-byte slots hold them after MAC_OFFSET
SCRIBBLE = 0xEE


class ReusedAtOnce(np.ndarray):
    """A ring's status words: a slot given back to the kernel (0) is overwritten at once, as a kernel
    with frames waiting refills it on another CPU, with a frame of the readers' length."""

    def __setitem__(self, key, value):
        if np.all(np.asarray(value) == 0):
            freed = np.atleast_1d(np.arange(len(self))[key])
            self.ring.slots[freed, rxring.MAC_OFFSET:] = SCRIBBLE
            self.ring.lens[freed] = self.ring.snaplens[freed] = WIDTH
        super().__setitem__(key, value)


class Kernel:
    """The kernel's side of a FakeRing: a frame goes into the slot at its head if the reader gave it
    back (else it is dropped, as at a full ring) and is handed over (status USER) later, slots in any
    order."""

    def __init__(self, ring: FakeRing, rng: random.Random):
        self.ring, self.rng = ring, rng
        self.head = 0
        self.filling: dict[int, tuple] = {}  # slots taken, not yet handed over -> their frame
        self.kept: list[bytes] = []  # frames the readers must return, in ring order
        self.dropped = 0

    def deliver(self, frame: bytes, tagged=False, outgoing=False, mac=rxring.MAC_OFFSET) -> None:
        """Into the slot at the head: taken now, written by the time it is handed over."""
        k = self.head % self.ring.frames
        if self.ring.status[k] or k in self.filling:
            self.dropped += 1
            return
        self.ring.slots[k, rxring.MAC_OFFSET:] = SCRIBBLE  # the copy has not started
        self.filling[k] = (frame, tagged, outgoing, mac)
        self.head += 1
        if len(frame) == WIDTH and not tagged and not outgoing:
            self.kept.append(frame)

    def hand_over(self, n: int) -> None:
        """n of the slots being filled, chosen at random: written, then theirs."""
        r = self.ring
        for k in self.rng.sample(sorted(self.filling), n):
            frame, tagged, outgoing, mac = self.filling.pop(k)
            r.slots[k, mac : mac + len(frame)] = np.frombuffer(frame, np.uint8)
            r.lens[k] = r.snaplens[k] = len(frame)
            r.macs[k], r.tcis[k] = mac, 5 if tagged else 0
            r.pkttypes[k] = rxring.PACKET_OUTGOING if outgoing else 0
            status = rxring.TP_STATUS_USER | (rxring.TP_STATUS_VLAN_VALID if tagged else 0)
            np.ndarray.__setitem__(r.status, k, status)


def scripted_ring(frames: int) -> FakeRing:
    ring = FakeRing(frames)
    ring.status = ring.status.view(ReusedAtOnce)
    ring.status.ring = ring
    return ring


def frame_of(seq: int) -> bytes:
    return seq.to_bytes(4, "big") + random.Random(seq).randbytes(WIDTH - 4)


def read(ring: FakeRing, how: str, rng: random.Random) -> list[bytes]:
    """One read by `how`, of a random size: the frames of the readers' length it returned."""
    most = rng.randint(1, 40)
    if how == "rows":  # the agents' (recv_rows_untagged)
        buf = np.zeros((most, WIDTH), np.uint8)
        start = rng.randint(0, min(3, most - 1))
        n, _, _ = ring.receive_rows(buf, start)
        return [bytes(r) for r in buf[start : start + n]]
    if how == "bytes":  # recv_batch's
        return [f for f in ring.frames_waiting(most)[0] if len(f) == WIDTH]
    buf = np.zeros((most, ring.frame), np.uint8)  # the switch's: tags put back (longer), short frames kept
    lens = np.zeros(most, np.int64)
    n, _, _ = ring.receive(buf, lens, 0, most, WIDTH, outgoing=True)
    return [bytes(buf[i, : lens[i]]) for i in range(n) if lens[i] == WIDTH]


@pytest.mark.parametrize("how", ["rows", "bytes", "switch"])
@pytest.mark.parametrize("seed", range(4))
def test_every_kept_frame_is_read_once_in_order_with_its_own_bytes(how, seed):
    rng = random.Random(seed)
    ring = scripted_ring(16)
    kernel = Kernel(ring, rng)
    got: list[bytes] = []
    seq = 0
    for _ in range(3000):
        for _ in range(rng.randint(0, 6)):  # a burst, with frames the agents' readers leave out
            odd, seq = rng.random(), seq + 1
            kernel.deliver(frame_of(seq) if odd > 0.1 else frame_of(seq)[:30], tagged=0.1 < odd < 0.15,
                           outgoing=0.15 < odd < 0.18, mac=rxring.MAC_OFFSET + 2 * (odd > 0.9))
        kernel.hand_over(rng.randint(0, len(kernel.filling)))
        if rng.random() < 0.7:
            got += read(ring, how, rng)
    kernel.hand_over(len(kernel.filling))
    for _ in range(ring.frames):  # each read takes a slot at least while any is handed over
        got += read(ring, how, rng)
    assert not ring.status.any(), "handed-over slots never read"
    assert kernel.dropped > 0 and len(kernel.kept) > 1000  # the ring was full at times, and wrapped
    assert got == kernel.kept
