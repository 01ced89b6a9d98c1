"""An agent socket's receive ring (mindp.rxring through host_agent.rawsock) on a veth pair, at two K
(each in a process of its own with MINDP_K, since K is read at import): frames queued before the
ring first, then every frame in order while the ring wraps, tagged and wrong-sized frames counted
and left out; the same through recvmmsg where the ring is off. And the ring's run of ready slots
found without a race, on scripted slot states."""
import json
import os
import pathlib
import sys

import numpy as np
import pytest

from mindp import progress, rxring

from .fake_ring import FakeRing

ROOT = pathlib.Path(__file__).resolve().parents[2]
KS = (32, 1024)


def exercise(mode: str) -> dict:
    """The scenario, in this process's K: what the receiving socket got and counted; `mode` ring,
    in-place (the frames read where the ring holds them, where rawsock.waiting_rows gives them) or
    recvmmsg (no ring)."""
    from host_agent import rawsock
    from mindp.harness import testbed
    from mindp.protocol import UDP_PORT, Kind, frame_len

    rawsock.RING = mode != "recvmmsg"
    width = frame_len(Kind.SUM)
    a, b = testbed.tagged("mdp-rr0"), testbed.tagged("mdp-rr1")
    with testbed.veth_pair(a, b):
        socks = []
        try:
            tx, rx = socks = [rawsock.open_raw(a), rawsock.open_raw(b)]
            n = 5 * rawsock.RING_FRAMES // 2 + 3  # the ring wraps twice
            f = np.random.default_rng(width).integers(0, 256, size=(n, width), dtype=np.uint8)
            f[:, :6] = (2, 0, 0, 0, 0, 1)  # one unicast destination: one packet type, as a node's sums have
            f[:, 12:14] = (0x88, 0xB5)
            f[:, 14:18] = np.arange(n, dtype=">u4").view(np.uint8).reshape(-1, 4)
            assert rawsock.send_rows(tx, f, range(3)) == (3, 0)  # queued before the ring
            tagged_ok = rawsock.enable_auxdata(rx)
            ring = rawsock.ring_of(rx)
            buf = np.zeros((rawsock.RING_FRAMES // 2, width), np.uint8)
            receiver = rawsock.RowReceiver(buf, tagged_ok) if rawsock.MMSG else None
            got, tagged, other, views = [], 0, 0, 0
            for lo in range(3, n, 1000):
                hi = min(lo + 1000, n)
                assert rawsock.send_rows(tx, f, range(lo, hi)) == (hi - lo, 0)
                # A tagged frame that is ours but for its tag, and a short mindp frame.
                tx.send(f[lo, :12].tobytes() + b"\x81\x00\x00\x05" + f[lo, 12:].tobytes())
                short = bytearray(f[lo, :60].tobytes())
                short[12:14], short[23], short[36:38] = b"\x08\x00", 17, UDP_PORT.to_bytes(2, "big")
                tx.send(bytes(short))
                want = hi + 2 * (1 + (lo - 3) // 1000)

                def take() -> bool:
                    nonlocal tagged, other, views
                    # (runs of 100: a burst's last frames, tagged and short, leave the rest to recv_rows_untagged)
                    waiting = rawsock.waiting_rows(rx, width, 100) if mode == "in-place" else None
                    if waiting is not None:
                        ring, rows = waiting
                        got.extend(bytes(r) for r in rows)
                        ring.release(len(rows))
                        views += 1
                        return len(got) + tagged + other >= want
                    rows, t, o = rawsock.recv_rows_untagged(rx, buf, receiver)
                    got.extend(bytes(r) for r in buf[:rows])
                    tagged, other = tagged + t, other + o
                    return len(got) + tagged + other >= want

                progress.wait(take, lambda: len(got) + tagged + other, stall=progress.STALL, what="the ring")
            return {"ring": None if ring is None else [ring.frame, ring.frames], "in_order": got == [r.tobytes() for r in f],
                    "tagged": tagged, "other": other, "bursts": -(-(n - 3) // 1000), "width": width,
                    "dropped": ring.dropped() if ring else 0, "views": views}
        finally:
            for s in socks:
                s.close()


CHILD = "import json, sys; from tests.host_agent.test_rawsock_ring import exercise; print(json.dumps(exercise(sys.argv[1])))"


@pytest.mark.net
@pytest.mark.parametrize("k", KS)
def test_an_agent_socket_receives_through_its_ring_at_each_k(k):
    from mindp.protocol import MAX_K, Kind, frame_len

    assert k <= MAX_K
    env = {**os.environ, "MINDP_K": str(k), "PYTHONPATH": str(ROOT)}
    out = {}
    for mode in ("ring", "in-place", "recvmmsg"):
        proc = progress.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, env=env, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        out[mode] = json.loads(proc.stdout)
    ring, in_place, plain = out["ring"], out["in-place"], out["recvmmsg"]
    assert ring["width"] == frame_len(Kind.SUM, k)
    frame, frames = ring["ring"]
    assert frame == rxring.slot_bytes(frame_len(Kind.SUM, k)) and frame >= rxring.MAC_OFFSET + frame_len(Kind.SUM, k)
    assert plain["ring"] is None and in_place["ring"] == ring["ring"] and in_place["views"] and not ring["views"]
    for r in (ring, in_place, plain):
        assert r["in_order"] and r["tagged"] == r["other"] == r["bursts"] and r["dropped"] == 0, r


@pytest.mark.parametrize("k", [8, 32, 512, 1024, 4096])
def test_a_switch_ring_holds_every_slot_of_the_pool_at_any_k(k):
    """A switch port's ring has a slot for each of the pool's aggregation slots, the most a port
    has in flight, whatever K's slot size; in whole blocks (RxRing makes exactly that many)."""
    from mindp.switch_constants import POOL_SLOTS

    frame = rxring.switch_slot(k)
    frames = rxring.switch_frames(frame)
    per_block, _ = rxring.whole_blocks(1, frame)
    assert frames >= POOL_SLOTS and frames % per_block == 0


def test_an_old_kernel_or_a_socket_pair_gets_no_ring():
    """enable_auxdata on a socket that is not AF_PACKET: no ring, False, nothing read from it."""
    import socket

    from host_agent import rawsock

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with a, b:
        a.send(b"x" * 40)
        assert not rawsock.enable_auxdata(b) and rawsock.ring_of(b) is None
        assert b.recv(100) == b"x" * 40


class GeneralRing(FakeRing):
    """A FakeRing that never takes the common path."""

    def _take_run(self, *args) -> bool:
        return False


@pytest.mark.parametrize("owned,most,expect", [
    ("UUUUUUUU", 8, 8),
    ("UUU.....", 8, 3),
    ("UUU.U...", 8, 3),  # slot 3 still being copied on another CPU while slot 4 is handed over
    ("U.UUUUUU", 8, 1),
    ("........", 8, 0),
    ("UUUUUUUU", 5, 5),
    ("UUUUUU..", 64, 6),  # never past the ring's end
])
def test_the_run_of_ready_slots_stops_at_the_first_the_kernel_owns(owned, most, expect):
    ring = FakeRing(len(owned))
    for k, c in enumerate(owned):
        ring.status[k] = rxring.TP_STATUS_USER if c == "U" else 0
    assert ring.ready(0, most) == expect


def test_receive_rows_takes_frames_of_its_width_in_order_across_the_ring_end():
    """Slots 6, 7, 0, 1, 2, 3 ready (the read position near the end): the right-sized untagged frames
    in order; a tagged one, a short mindp frame, a short frame of other traffic (ARP, the step
    digest's UDP) and our own transmission left out, the first two counted; every taken slot back
    to the kernel; slot 4, still the kernel's, ends the read."""
    from mindp.protocol import UDP_PORT

    ring = FakeRing(8)
    ring.head[0] = 6 + 8 * 5
    width = 48
    frames = [bytes([i]) * width for i in range(5)]
    short_mindp = bytearray(frames[2][:40])
    short_mindp[12:14], short_mindp[23], short_mindp[36:38] = b"\x08\x00", 17, UDP_PORT.to_bytes(2, "big")
    ring.put(6, frames[0])
    ring.put(7, frames[1], status=rxring.TP_STATUS_USER | rxring.TP_STATUS_VLAN_VALID, tci=7)
    ring.put(0, bytes(short_mindp))
    ring.put(1, frames[3])
    ring.put(2, frames[4])
    ring.pkttypes[2] = rxring.PACKET_OUTGOING
    ring.put(3, frames[2][:30])
    buf = np.zeros((16, width), np.uint8)
    assert ring.receive_rows(buf, 1) == (2, 1, 1)
    assert [bytes(r) for r in buf[1:3]] == [frames[0], frames[3]]
    assert int(ring.head[0]) == 8 * 6 + 4 and not ring.status.any()
    ring.put(4, frames[1])
    assert ring.receive_rows(buf) == (1, 0, 0) and bytes(buf[0]) == frames[1]


def test_rows_of_several_lengths_are_taken_from_the_ring_with_their_lengths():
    """receive_rows with `lens`: frames up to the rows' width, each length recorded; a longer mindp
    frame (cut short in its slot) counted; only the longest frame's bytes copied into a row."""
    from mindp.protocol import UDP_PORT

    ring = FakeRing(8, frame=256)
    width = 96
    mindp = bytearray(120)
    mindp[12:14], mindp[23], mindp[36:38] = b"\x08\x00", 17, UDP_PORT.to_bytes(2, "big")
    frames = [bytes([1]) * 60, bytes([2]) * 96, bytes([3]) * 40]
    for k, f in enumerate(frames):
        ring.put(k, f)
    ring.put(3, bytes(mindp))
    ring.snaplens[3] = 100  # cut short
    buf = np.full((8, width), 0xEE, np.uint8)
    lens = np.zeros(8, np.int64)
    assert ring.receive_rows(buf, 0, lens) == (3, 0, 1)
    assert lens[:3].tolist() == [60, 96, 40]
    assert [bytes(buf[i, : lens[i]]) for i in range(3)] == frames
    ring.put(4, frames[0])
    ring.put(5, frames[2])
    buf[:] = 0xEE
    assert ring.receive_rows(buf, 0, lens) == (2, 0, 0)
    assert (buf[:2, 60:] == 0xEE).all()  # no byte past the longest frame of the batch


def test_a_run_of_good_frames_at_one_offset_is_copied_by_the_common_path_across_the_ring_end():
    """The node's case: every frame of the rows' width, untagged, at one offset: each run (to the
    ring's end, then from its start) taken by the common path, in order, the slots given back."""
    ring = FakeRing(8)
    ring.head[0] = 5 + 8 * 3
    width = 48
    frames = [bytes([i + 1]) * width for i in range(6)]
    for i, f in enumerate(frames):
        ring.put((5 + i) % 8, f)
    buf = np.zeros((16, width), np.uint8)
    assert ring.receive_rows(buf) == (6, 0, 0) and ring.common == [True, True]
    assert [bytes(r) for r in buf[:6]] == frames
    assert int(ring.head[0]) == 8 * 4 + 3 and not ring.status.any()


def test_frames_of_several_lengths_take_the_common_path_with_lens_and_only_with_it():
    """With `lens` (the workers' PARAM frames of 1-4 chunks) a run of several lengths is one strided
    copy of its longest frame's bytes; without, the same run is sorted out by the general path."""
    width = 96
    frames = [bytes([1]) * 60, bytes([2]) * 96, bytes([3]) * 40]
    for with_lens in (True, False):
        ring = FakeRing(8, frame=256)
        for k, f in enumerate(frames):
            ring.put(k, f)
        buf = np.full((8, width), 0xEE, np.uint8)
        lens = np.zeros(8, np.int64)
        if with_lens:
            assert ring.receive_rows(buf, 0, lens) == (3, 0, 0) and ring.common == [True]
            assert [bytes(buf[i, : lens[i]]) for i in range(3)] == frames and (buf[:3, 96:] == 0xEE).all()
        else:
            assert ring.receive_rows(buf) == (1, 0, 0) and ring.common == [False]
            assert bytes(buf[0]) == frames[1]


KINDS = ["vlan", "vlan0", "tci", "ours", "short", "long", "cut", "snap", "mac", "losing", "kernel"]


def scripted(seed: int, with_lens: bool, rings: tuple, n: int = 16, width: int = 96) -> bool:
    """`rings` (of n slots) scripted alike from `seed`: slots all good, all of one other kind
    (KINDS: tagged by status and tci, by status alone (VID 0) or by tci alone; ours; short, long,
    cut short, only partly kept; another MAC offset; another status bit; a slot still the kernel's
    before or after one handed over) or mixed, from a random read position; True when all are
    good. Frames of `width` bytes (with_lens: of up to it)."""
    from mindp.protocol import UDP_PORT

    rng = np.random.default_rng(seed)
    mode = ["good", str(rng.choice(KINDS)), "mixed", "mixed"][seed % 4]
    start = int(rng.integers(0, 4 * n))
    for i in range(n - int(rng.integers(0, 3))):
        k = (start + i) % n
        size = width if not with_lens or rng.random() < 0.5 else int(rng.integers(40, width + 1))
        kind = mode if mode != "mixed" else "good" if rng.random() < 0.6 else rng.choice(KINDS)
        size = {"short": 30, "long": width + 8, "cut": width}.get(kind, size)
        f = bytearray(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
        f[12:14], f[23], f[36:38] = b"\x08\x00", 17, UDP_PORT.to_bytes(2, "big")
        for ring in rings:
            ring.put(k, bytes(f), mac=rxring.MAC_OFFSET + 4 * (kind == "mac"))
            ring.status[k] |= {"vlan": rxring.TP_STATUS_VLAN_VALID, "vlan0": rxring.TP_STATUS_VLAN_VALID,
                               "losing": 4}.get(kind, 0)
            ring.tcis[k] = 5 if kind in ("vlan", "tci") else 0
            ring.pkttypes[k] = rxring.PACKET_OUTGOING if kind == "ours" else 1
            if kind == "cut":  # longer than its slot held
                ring.lens[k] = width + 30
            if kind == "snap":  # (only its first bytes kept)
                ring.snaplens[k] = size - 20
            if kind == "kernel":
                ring.status[k] = 0
    for ring in rings:
        ring.head[0] = start
    return mode == "good"


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("with_lens", [False, True])
def test_the_common_path_takes_what_the_general_path_takes(seed, with_lens):
    """Scripted rings (`scripted`), read in random-sized buffers: rows, lengths, counts, read
    position and slot states are the same with the common path as with the general path alone;
    where all are good the common path takes them."""
    width = 96
    rings = FakeRing(16, 256), GeneralRing(16, 256)
    plain = scripted(seed, with_lens, rings, width=width)
    results = []
    for ring in rings:
        got = []
        r = np.random.default_rng(seed + 1)
        while True:
            buf = np.full((int(r.integers(1, 12)), width), 0xEE, np.uint8)
            lens = np.zeros(len(buf), np.int64) if with_lens else None
            at = int(r.integers(0, len(buf)))
            counts = ring.receive_rows(buf, at, lens)
            got.append((counts, buf.tobytes(), None if lens is None else lens.tolist(), int(ring.head[0])))
            if counts == (0, 0, 0):
                break
        results.append((got, ring.status.tolist()))
    assert results[0] == results[1]
    if plain:
        assert True in rings[0].common


@pytest.mark.parametrize("seed", range(40))
def test_rows_read_in_place_are_the_rows_receive_rows_copies(seed):
    """The node's read of its sums where the kernel put them (waiting_rows, then release; where it
    gives None, receive_rows as before) receives the frames receive_rows alone receives, in order,
    and leaves the same read position and slot states, on the scripted rings; a view is the ring's
    memory, its slots the reader's until released; where all are good no frame is copied."""
    width = 96
    rings = FakeRing(16, 256), FakeRing(16, 256)
    plain = scripted(seed, False, rings, width=width)
    copied, in_place = rings
    want = []
    while True:
        buf = np.zeros((5, width), np.uint8)
        counts = copied.receive_rows(buf)
        if counts == (0, 0, 0):
            break
        want += [bytes(r) for r in buf[: counts[0]]]
    got, views = [], 0
    while True:
        rows = in_place.waiting_rows(width, 5)
        if rows is not None:
            assert len(rows) and np.shares_memory(rows, in_place.slots) and rows.shape == (len(rows), width)
            head = int(in_place.head[0])
            k = head % in_place.frames
            assert (in_place.status[k : k + len(rows)] & rxring.TP_STATUS_USER).all()
            got += [bytes(r) for r in rows]
            in_place.release(len(rows))
            assert int(in_place.head[0]) == head + len(rows) and not in_place.status[k : k + len(rows)].any()
            views += 1
            continue
        buf = np.zeros((5, width), np.uint8)
        counts = in_place.receive_rows(buf)
        if counts == (0, 0, 0):
            break
        got += [bytes(r) for r in buf[: counts[0]]]
    assert got == want
    assert int(in_place.head[0]) == int(copied.head[0]) and in_place.status.tolist() == copied.status.tolist()
    if plain:
        assert views and in_place.common == []


@pytest.mark.net
def test_a_link_going_down_is_reported_by_a_ring_receive_as_by_a_receive_call():
    """The ring makes no system call, so the socket's pending error (ENETDOWN) is read where the
    ring had nothing and raised once, as recvmmsg raised it: the agents' link-down handling sees
    it, and select stops waking for it."""
    import errno
    import select

    from host_agent import rawsock
    from mindp.harness import testbed
    from mindp.protocol import Kind, frame_len

    a, b = testbed.tagged("mdp-rd0"), testbed.tagged("mdp-rd1")
    with testbed.veth_pair(a, b):
        rx = None
        try:
            rx = rawsock.open_raw(b)
            assert rawsock.enable_auxdata(rx) and rawsock.ring_of(rx) is not None
            buf = np.zeros((8, frame_len(Kind.PARAM)), np.uint8)
            assert rawsock.recv_rows_untagged(rx, buf) == (0, 0, 0)
            testbed.sh("ip", "link", "set", b, "down")
            assert select.select([rx], [], [], progress.STALL)[0] == [rx]
            with pytest.raises(OSError) as err:
                rawsock.recv_rows_untagged(rx, buf)
            assert err.value.errno == errno.ENETDOWN
            assert rawsock.recv_rows_untagged(rx, buf) == (0, 0, 0) and select.select([rx], [], [], 0)[0] == []
        finally:
            if rx is not None:
                rx.close()


@pytest.mark.net
def test_a_link_down_whose_error_a_send_took_is_still_told_where_sends_failed():
    """A send under way as the link goes down can take the socket's pending ENETDOWN for itself;
    the ring's receive then never reports it. raise_if_link_down, asked where sends failed, looks
    at the interface: ENETDOWN while it is down, nothing once it is up, ENODEV once it is gone."""
    import errno
    import socket

    from host_agent import rawsock
    from mindp.harness import testbed
    from mindp.protocol import Kind, frame_len

    a, b = testbed.tagged("mdp-rs0"), testbed.tagged("mdp-rs1")
    with testbed.veth_pair(a, b):
        s = None
        try:
            s = rawsock.open_raw(b)
            assert rawsock.enable_auxdata(s)
            frames = np.zeros((4, frame_len(Kind.GRAD)), np.uint8)
            buf = np.zeros((8, frame_len(Kind.PARAM)), np.uint8)
            rawsock.raise_if_link_down(s)
            testbed.sh("ip", "link", "set", b, "down")
            assert s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ENETDOWN  # as the racing send took it
            assert rawsock.recv_rows_untagged(s, buf) == (0, 0, 0)  # the receive can no longer tell
            assert rawsock.send_rows(s, frames, range(4)) == (4, 4)
            with pytest.raises(OSError) as err:
                rawsock.raise_if_link_down(s)
            assert err.value.errno == errno.ENETDOWN
            testbed.sh("ip", "link", "set", b, "up")
            rawsock.raise_if_link_down(s)
            testbed.sh("ip", "link", "del", a)
            with pytest.raises(OSError) as err:
                rawsock.raise_if_link_down(s)
            assert err.value.errno in rawsock.LINK_ERRNOS
        finally:
            if s is not None:
                s.close()
