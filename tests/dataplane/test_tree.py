"""Packet tests of the tree roles and shards (issue 14) on every target: one switch configured by
the controller's JobState entries as a leaf (uplink), as a spine (child switches as members), or
with sharded optimizer nodes; frames on veths, exact int64 sums, drops counted."""
from __future__ import annotations

import numpy as np
import pytest

from controller import p4info_names as N
from controller.jobs import AttachedHost, JobState, Shard, rebuild
from controller.slots import SlotRange
from mindp import codec
from mindp.fixedpoint import exact_sum
from mindp.protocol import K, Flag, Kind

from .fabric import epochs, param_frame, random_fp16, unchanged_but_addresses

pytestmark = pytest.mark.net

CHILD_ID = 5  # the leaf's index at its parent


def at(fabric, name: str) -> AttachedHost:
    return AttachedHost.of(fabric.hosts[name])


class Installed:
    """A JobState written to the switch through its own entries and group, removed afterwards."""

    def __init__(self, fabric, job: JobState):
        self.fabric, self.job = fabric, job
        for e in job.entries():
            fabric.sw.insert(e)
        fabric.sw.insert_group(job.mcast_group())

    def remove(self) -> None:
        for e in reversed(self.job.entries()):
            self.fabric.sw.delete(e)
        self.fabric.sw.delete_group(self.job.group)
        self.fabric.drain()


@pytest.fixture
def leaf(fabric):
    """Job 3 as a leaf: workers w1_0, w1_1; its uplink is opt1's port (the node's addresses: opt2's)."""
    node = at(fabric, "opt2")
    uplink = AttachedHost(fabric.hosts["opt1"].port, node.mac, node.ip, "spine")
    job = JobState(3, SlotRange(300, 4), next(epochs), {0: at(fabric, "w1_0"), 1: at(fabric, "w1_1")}, uplink,
                   uplink=uplink, child_id=CHILD_ID)
    inst = Installed(fabric, job)
    yield job
    inst.remove()


BENEATH = {0: 2, 1: 3, 2: 1}  # the spine's children: workers beneath each


@pytest.fixture
def spine(fabric):
    """Job 4 as a spine: child switches 0, 1, 2 behind w1_0, w1_1, w1_2's ports (BENEATH workers
    each); node opt1."""
    children = {c: AttachedHost(fabric.hosts[f"w1_{c}"].port, f"02:00:00:00:01:0{c}", f"10.0.1.{c + 1}", f"leaf{c}")
                for c in range(3)}
    job = JobState(4, SlotRange(400, 4), next(epochs), children, at(fabric, "opt1"), children=BENEATH)
    inst = Installed(fabric, job)
    yield job
    inst.remove()


@pytest.fixture
def sharded(fabric):
    """Job 5: workers w2_0, w2_1; chunks 0..9 owned by opt2, 10..19 by x."""
    opt2, x = at(fabric, "opt2"), at(fabric, "x")
    job = JobState(5, SlotRange(500, 8), next(epochs), {0: at(fabric, "w2_0"), 1: at(fabric, "w2_1")}, opt2,
                   chunks=20, shards=(Shard(0, 9, opt2), Shard(10, 19, x)))
    inst = Installed(fabric, job)
    yield job
    inst.remove()


def frame(fabric, job: JobState, kind: Kind, src: str, values, *, worker: int, step: int, chunk: int,
          slot: int | None = None, flags: int = 0, nworkers: int = 0) -> bytes:
    host = fabric.hosts[src]
    addrs = codec.Addresses(host.mac, job.endpoint.mac, host.ip, job.endpoint.ip)
    dtype = np.int64 if kind == Kind.PARTIAL else np.float16
    return codec.encode_tensor(kind, np.asarray(values, dtype=dtype), addrs, first_chunk=chunk, job=job.job_id,
                               worker=worker, step=step, slot=chunk % job.slot_count if slot is None else slot,
                               flags=flags, nworkers=nworkers)[0].tobytes()


def only_at(fabric, got, host: str, kind: Kind, n: int = 1) -> codec.Decoded:
    others = {h: len(f) for h, f in got.items() if f and h != host}
    assert not others, f"unexpected frames at {others}"
    assert len(got[host]) == n, f"{len(got[host])} frames at {host}, expected {n}"
    dec = codec.decode(got[host], kind)
    assert len(dec.headers) == n, dec.rejects
    return dec


def random_partial(rng) -> np.ndarray:
    return rng.integers(-(1 << 40), 1 << 40, size=K, dtype=np.int64)


def test_the_switch_holds_each_role_as_the_controller_wrote_it(fabric, leaf, spine, sharded):
    """Read back over P4Runtime (range matches included) and rebuilt: nothing to write."""
    got = rebuild(fabric.sw.read_entries(), None)
    for job in (leaf, spine, sharded):
        back = got.jobs[job.job_id]
        assert sorted(map(repr, back.entries())) == sorted(map(repr, job.entries()))
    assert got.jobs[leaf.job_id].uplink is not None and got.jobs[leaf.job_id].child_id == CHILD_ID
    assert got.jobs[spine.job_id].children == BENEATH and got.jobs[leaf.job_id].children == {}
    assert [(s.lo, s.hi, s.node.port) for s in got.jobs[sharded.job_id].shards] == [(0, 9, 7), (10, 19, 9)]


def test_leaf_sends_one_exact_partial_up_its_uplink(fabric, leaf):
    rng = np.random.default_rng(21)
    grads = [random_fp16(rng) for _ in range(2)]
    completions = fabric.counter(N.COMPLETIONS, 3)
    fabric.send("w1_0", frame(fabric, leaf, Kind.GRAD, "w1_0", grads[0], worker=0, step=2, chunk=6))
    assert not any(fabric.collect(0, grace=0.1).values()), "partial before the last worker"
    fabric.send("w1_1", frame(fabric, leaf, Kind.GRAD, "w1_1", grads[1], worker=1, step=2, chunk=6))
    dec = only_at(fabric, fabric.collect(1), "opt1", Kind.PARTIAL)
    h = dec.headers[0]
    assert np.array_equal(dec.elements[0], exact_sum(grads)[0])
    assert (h["kind"], h["job"], h["worker"], h["nworkers"], h["step"], h["chunk"], h["flags"]) == \
           (Kind.PARTIAL, 3, CHILD_ID, 2, 2, 6, 0)
    assert fabric.counter(N.COMPLETIONS, 3) == completions + 1
    # a worker that lost the parameters retransmits: the leaf resends its partial, flagged
    resent = fabric.counter(N.RESENT_SUMS, 3)
    fabric.send("w1_1", frame(fabric, leaf, Kind.GRAD, "w1_1", grads[1], worker=1, step=2, chunk=6,
                              flags=int(Flag.RETRANSMIT)))
    again = only_at(fabric, fabric.collect(1), "opt1", Kind.PARTIAL)
    assert np.array_equal(again.elements[0], dec.elements[0])
    assert again.headers[0]["flags"] & Flag.RETRANSMIT and again.headers[0]["nworkers"] == 2
    assert again.headers[0]["worker"] == CHILD_ID
    assert fabric.counter(N.RESENT_SUMS, 3) == resent + 1


def test_leaf_multicasts_parameters_from_its_uplink_only(fabric, leaf):
    params = np.linspace(-1, 1, K).astype(np.float16)
    fabric.send("opt1", frame(fabric, leaf, Kind.PARAM, "opt1", params, worker=0, step=2, chunk=6))
    got = fabric.collect(2)
    assert sorted(h for h, f in got.items() if f) == ["w1_0", "w1_1"]
    for name in ("w1_0", "w1_1"):
        hdr, elems = codec.decode_one(got[name][0], Kind.PARAM)
        assert got[name][0][:6] == bytes.fromhex(fabric.hosts[name].mac.replace(":", ""))
        assert np.array_equal(elems.view(np.uint16), params.view(np.uint16))
    before = fabric.drops("NOT_MEMBER", 3)
    fabric.send("w1_2", frame(fabric, leaf, Kind.PARAM, "w1_2", params, worker=0, step=2, chunk=6))
    assert not any(fabric.collect(0).values())
    assert fabric.drops("NOT_MEMBER", 3) == before + 1


def test_spine_adds_partials_exactly_and_counts_their_gradients(fabric, spine):
    rng = np.random.default_rng(22)
    parts = [random_partial(rng) for _ in range(3)]
    contributions = [2, 3, 1]
    dups, dropped = fabric.counter(N.DUPLICATES, 4), fabric.drops("DUPLICATE", 4)
    for c in (2, 0):
        fabric.send(f"w1_{c}", frame(fabric, spine, Kind.PARTIAL, f"w1_{c}", parts[c], worker=c, step=7, chunk=1,
                                     nworkers=contributions[c]))
    # a duplicate partial (lost PARAM below a leaf) while the cell is incomplete: dropped
    fabric.send("w1_0", frame(fabric, spine, Kind.PARTIAL, "w1_0", parts[0], worker=0, step=7, chunk=1,
                              nworkers=contributions[0], flags=int(Flag.RETRANSMIT)))
    assert not any(fabric.collect(0, grace=0.1).values())
    assert fabric.drops("DUPLICATE", 4) == dropped + 1 and fabric.counter(N.DUPLICATES, 4) == dups + 1
    fabric.send("w1_1", frame(fabric, spine, Kind.PARTIAL, "w1_1", parts[1], worker=1, step=7, chunk=1,
                              nworkers=contributions[1]))
    dec = only_at(fabric, fabric.collect(1), "opt1", Kind.SUM)
    total = np.sum(parts, axis=0, dtype=np.int64)
    h = dec.headers[0]
    assert np.array_equal(dec.elements[0], total)
    assert (h["kind"], h["job"], h["nworkers"], h["step"], h["chunk"], h["flags"]) == (Kind.SUM, 4, 6, 7, 1, 0)
    # after completion a duplicate partial gets the sum again
    fabric.send("w1_2", frame(fabric, spine, Kind.PARTIAL, "w1_2", parts[2], worker=2, step=7, chunk=1,
                              nworkers=contributions[2], flags=int(Flag.RETRANSMIT)))
    again = only_at(fabric, fabric.collect(1), "opt1", Kind.SUM)
    assert np.array_equal(again.elements[0], total)
    assert again.headers[0]["flags"] & Flag.RETRANSMIT and again.headers[0]["nworkers"] == 6


def test_spine_keeps_a_childs_nonfinite_flag_and_int64_extremes(fabric, spine):
    parts = [np.zeros(K, np.int64) for _ in range(3)]
    parts[0][0], parts[1][0] = (1 << 62), (1 << 62) - 1  # int64 range, as the node receives it
    parts[2][1] = -(1 << 63)
    for c in range(3):
        fabric.send(f"w1_{c}", frame(fabric, spine, Kind.PARTIAL, f"w1_{c}", parts[c], worker=c, step=8, chunk=2,
                                     nworkers=1, flags=int(Flag.NONFINITE) if c == 1 else 0))
    dec = only_at(fabric, fabric.collect(1), "opt1", Kind.SUM)
    assert dec.headers[0]["flags"] == Flag.NONFINITE
    assert dec.elements[0][0] == (1 << 63) - 1 and dec.elements[0][1] == -(1 << 63)


def test_spine_drops_partials_from_a_wrong_port_or_malformed(fabric, spine):
    part = np.ones(K, np.int64)
    before = fabric.drops("NOT_MEMBER", 4)
    # child 0's id from child 1's port, and from a port in no job
    fabric.send("w1_1", frame(fabric, spine, Kind.PARTIAL, "w1_1", part, worker=0, step=9, chunk=0, nworkers=1))
    fabric.send("x", frame(fabric, spine, Kind.PARTIAL, "x", part, worker=0, step=9, chunk=0, nworkers=1))
    bad_len = fabric.drops("BAD_LENGTH", 4)
    fabric.send("w1_0", frame(fabric, spine, Kind.PARTIAL, "w1_0", part, worker=0, step=9, chunk=0) + b"\0" * 8)
    malformed = fabric.drops("MALFORMED", 4)  # the header was parsed: counted under its job
    fabric.send("w1_0", frame(fabric, spine, Kind.PARTIAL, "w1_0", part, worker=0, step=9, chunk=0)[:120])
    assert not any(fabric.collect(0).values())
    assert fabric.drops("NOT_MEMBER", 4) == before + 2
    assert fabric.drops("BAD_LENGTH", 4) == bad_len + 1
    assert fabric.drops("MALFORMED", 4) == malformed + 1


def test_members_are_admitted_only_in_their_role(fabric, leaf, spine):
    """A gradient from a child switch's port (with its child id) and a partial sum from a worker's
    port (with its worker id) are WRONG_ROLE: neither adds to a cell, nothing leaves."""
    rng = np.random.default_rng(24)
    before = fabric.drops("WRONG_ROLE", 4), fabric.drops("WRONG_ROLE", 3)
    grads_in = fabric.counter(N.GRAD_PACKETS, 4), fabric.counter(N.GRAD_PACKETS, 3)
    for c in range(3):  # every child of the spine sends a gradient as if it were a worker
        fabric.send(f"w1_{c}", frame(fabric, spine, Kind.GRAD, f"w1_{c}", random_fp16(rng), worker=c, step=3,
                                     chunk=0))
    for w in range(2):  # the leaf's workers send partial sums as if they were child switches
        fabric.send(f"w1_{w}", frame(fabric, leaf, Kind.PARTIAL, f"w1_{w}", random_partial(rng), worker=w, step=3,
                                     chunk=0, nworkers=1))
    assert not any(fabric.collect(0).values())
    assert (fabric.drops("WRONG_ROLE", 4), fabric.drops("WRONG_ROLE", 3)) == (before[0] + 3, before[1] + 2)
    assert (fabric.counter(N.GRAD_PACKETS, 4), fabric.counter(N.GRAD_PACKETS, 3)) == grads_in
    # the same ports in their roles complete both cells
    parts = [random_partial(rng) for _ in range(3)]
    for c in range(3):
        fabric.send(f"w1_{c}", frame(fabric, spine, Kind.PARTIAL, f"w1_{c}", parts[c], worker=c, step=3, chunk=0,
                                     nworkers=BENEATH[c]))
    dec = only_at(fabric, fabric.collect(1), "opt1", Kind.SUM)
    assert np.array_equal(dec.elements[0], np.sum(parts, axis=0, dtype=np.int64))
    assert dec.headers[0]["nworkers"] == sum(BENEATH.values())
    grads = [random_fp16(rng) for _ in range(2)]
    for w in range(2):
        fabric.send(f"w1_{w}", frame(fabric, leaf, Kind.GRAD, f"w1_{w}", grads[w], worker=w, step=3, chunk=0))
    dec = only_at(fabric, fabric.collect(1), "opt1", Kind.PARTIAL)
    assert np.array_equal(dec.elements[0], exact_sum(grads)[0]) and dec.headers[0]["nworkers"] == 2


def test_partial_claiming_more_gradients_than_its_child_has_workers_is_dropped(fabric, spine):
    """nworkers must be 1 .. the workers beneath the child (the controller's bound): more would
    skew the node's mean, 0 is no contribution. Dropped before the cell; the honest ones sum."""
    rng = np.random.default_rng(25)
    parts = [random_partial(rng) for _ in range(3)]
    before = fabric.drops("BAD_NWORKERS", 4)
    for c, nworkers in ((1, BENEATH[1] + 1), (1, 0xFFFF), (0, 0), (2, BENEATH[2] + 1)):
        fabric.send(f"w1_{c}", frame(fabric, spine, Kind.PARTIAL, f"w1_{c}", parts[c], worker=c, step=4, chunk=3,
                                     nworkers=nworkers))
    assert not any(fabric.collect(0).values())
    assert fabric.drops("BAD_NWORKERS", 4) == before + 4
    for c in range(3):  # not counted as contributions: the cell completes with each child's own
        assert not any(fabric.collect(0, grace=0.05).values()), "sum before the last child"
        fabric.send(f"w1_{c}", frame(fabric, spine, Kind.PARTIAL, f"w1_{c}", parts[c], worker=c, step=4, chunk=3,
                                     nworkers=BENEATH[c]))
    dec = only_at(fabric, fabric.collect(1), "opt1", Kind.SUM)
    assert np.array_equal(dec.elements[0], np.sum(parts, axis=0, dtype=np.int64))
    assert dec.headers[0]["nworkers"] == sum(BENEATH.values())


def test_a_root_with_workers_and_a_child_switch_admits_each_in_its_role(fabric):
    """A parent may hold both (its own workers beside child switches): job 6 has worker 0 on w2_0's
    port and child switch 1 (2 workers beneath it) on w2_1's; the sum carries 3 gradients."""
    child = AttachedHost(fabric.hosts["w2_1"].port, "02:00:00:00:01:11", "10.0.1.17", "leafx")
    job = JobState(6, SlotRange(600, 4), next(epochs), {0: at(fabric, "w2_0"), 1: child}, at(fabric, "opt2"),
                   children={1: 2})
    inst = Installed(fabric, job)
    try:
        assert rebuild(fabric.sw.read_entries(), None).jobs[6].children == {1: 2}
        rng = np.random.default_rng(26)
        grad, part = random_fp16(rng), random_partial(rng)
        wrong = fabric.drops("WRONG_ROLE", 6)
        fabric.send("w2_0", frame(fabric, job, Kind.PARTIAL, "w2_0", part, worker=0, step=1, chunk=2, nworkers=1))
        fabric.send("w2_1", frame(fabric, job, Kind.GRAD, "w2_1", grad, worker=1, step=1, chunk=2))
        assert not any(fabric.collect(0).values()) and fabric.drops("WRONG_ROLE", 6) == wrong + 2
        fabric.send("w2_0", frame(fabric, job, Kind.GRAD, "w2_0", grad, worker=0, step=1, chunk=2))
        fabric.send("w2_1", frame(fabric, job, Kind.PARTIAL, "w2_1", part, worker=1, step=1, chunk=2, nworkers=2))
        dec = only_at(fabric, fabric.collect(1), "opt2", Kind.SUM)
        assert np.array_equal(dec.elements[0], exact_sum([grad])[0] + part) and dec.headers[0]["nworkers"] == 3
    finally:
        inst.remove()


def test_spine_multicasts_parameters_to_its_children(fabric, spine):
    params = np.full(K, 0.5, np.float16)
    fabric.send("opt1", frame(fabric, spine, Kind.PARAM, "opt1", params, worker=0, step=7, chunk=1))
    got = fabric.collect(3)
    assert sorted(h for h, f in got.items() if f) == ["w1_0", "w1_1", "w1_2"]
    assert got["w1_2"][0][:6] == bytes.fromhex("020000000102")  # rewritten to the child's address


def test_sums_go_to_the_node_owning_their_chunk(fabric, sharded):
    rng = np.random.default_rng(23)
    for chunk, node in ((3, "opt2"), (9, "opt2"), (10, "x"), (19, "x")):
        grads = [random_fp16(rng) for _ in range(2)]
        for w in range(2):
            fabric.send(f"w2_{w}", frame(fabric, sharded, Kind.GRAD, f"w2_{w}", grads[w], worker=w, step=1,
                                         chunk=chunk))
        got = fabric.collect(1)
        dec = only_at(fabric, got, node, Kind.SUM)
        assert got[node][0][:6] == bytes.fromhex(fabric.hosts[node].mac.replace(":", ""))
        assert np.array_equal(dec.elements[0], exact_sum(grads)[0]) and dec.headers[0]["chunk"] == chunk
        assert dec.headers[0]["nworkers"] == 2


def test_parameters_are_admitted_only_from_the_owning_node(fabric, sharded):
    params = np.full(K, 0.25, np.float16)
    before = fabric.drops("NOT_OWNER", 5)
    fabric.send("opt2", frame(fabric, sharded, Kind.PARAM, "opt2", params, worker=0, step=1, chunk=12))
    fabric.send("x", frame(fabric, sharded, Kind.PARAM, "x", params, worker=0, step=1, chunk=4))
    assert not any(fabric.collect(0).values())
    assert fabric.drops("NOT_OWNER", 5) == before + 2
    for src, chunk in (("x", 12), ("opt2", 4)):
        fabric.send(src, frame(fabric, sharded, Kind.PARAM, src, params, worker=0, step=1, chunk=chunk))
        got = fabric.collect(2)
        assert sorted(h for h, f in got.items() if f) == ["w2_0", "w2_1"]
        assert codec.decode_one(got["w2_0"][0], Kind.PARAM)[0]["chunk"] == chunk


def test_parameters_of_several_chunks_must_all_be_the_senders(fabric, sharded):
    """A PARAM carries chunk .. chunk + more: one reaching past its node's range (opt2: 0..9, x: 10..19)
    is NOT_OWNER, even though its first chunk is the node's; one inside it reaches the workers whole."""
    values = random_fp16(np.random.default_rng(31), 4 * K)
    fields = dict(job=5, step=2, slot=0)
    crossing = [("opt2", 8, 3), ("opt2", 9, 2), ("opt2", 7, 4), ("x", 17, 4)]  # (node, first chunk, chunks)
    inside = [("opt2", 8, 2), ("opt2", 6, 4), ("x", 16, 4), ("x", 10, 2)]
    before = fabric.drops("NOT_OWNER", 5)
    for src, chunk, n in crossing:
        fabric.send(src, param_frame(fabric.hosts[src], values[: n * K], chunk=chunk, **fields))
    assert not any(fabric.collect(0).values())
    assert fabric.drops("NOT_OWNER", 5) == before + len(crossing)
    for src, chunk, n in inside:
        frame = param_frame(fabric.hosts[src], values[: n * K], chunk=chunk, **fields)
        fabric.send(src, frame)
        got = fabric.collect(2)
        assert sorted(h for h, f in got.items() if f) == ["w2_0", "w2_1"]
        assert all(len(got[w]) == 1 and unchanged_but_addresses(got[w][0], frame) for w in ("w2_0", "w2_1"))
    assert fabric.drops("NOT_OWNER", 5) == before + len(crossing)
