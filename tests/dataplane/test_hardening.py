"""Attacks and accidents the switch must absorb (issue 11): VLAN-tagged and foreign
frames, trailing bytes, far-future steps and chunks, a worker restarting at step 0.
Each is dropped and counted under its own reason, and honest traffic still sums exactly."""
import struct

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether

from mindp import codec
from mindp.fixedpoint import exact_sum
from mindp.protocol import K, Kind
from mindp.switch_constants import STEP_WINDOW

from .fabric import random_fp16
from .sums import complete_round, only_sums_at
from .vlan_tags import stripped_by_kernel, tagged

pytestmark = pytest.mark.net


def skip_if_stripped(fabric, tags):
    if stripped_by_kernel(fabric, tags):
        pytest.xfail("the embedded switch's ports do not restore 802.1Q/802.1ad tags yet (PACKET_AUXDATA)")


TAGS = {"802.1Q": (0x8100,), "802.1ad QinQ": (0x88A8, 0x8100), "old QinQ": (0x9100, 0x8100),
        "three tags": (0x88A8, 0x8100, 0x8100)}


@pytest.mark.parametrize("tags", list(TAGS.values()), ids=list(TAGS))
def test_tagged_gradient_is_dropped_not_aggregated(fabric, job1, tags):
    """The tag would be stripped by a host's kernel: a tagged gradient must not count."""
    skip_if_stripped(fabric, tags)
    rng = np.random.default_rng(21)
    grads = [random_fp16(rng) for _ in range(3)]
    row = 1 if len(tags) <= 2 else None  # beyond two tags the switch does not look inside
    before = fabric.drops("TAGGED", row)
    fabric.send("w1_0", fabric.grad(job1, 0, grads[0], step=100, chunk=0))
    fabric.send("w1_1", fabric.grad(job1, 1, grads[1], step=100, chunk=0))
    fabric.send("w1_2", tagged(fabric.grad(job1, 2, grads[2], step=100, chunk=0), *tags))
    assert not any(fabric.collect(0).values()), "a tagged gradient completed the sum"
    assert fabric.drops("TAGGED", row) == before + 1
    fabric.send("w1_2", fabric.grad(job1, 2, grads[2], step=100, chunk=0))
    dec = only_sums_at(fabric, fabric.collect(1), "opt1", 1)
    assert np.array_equal(dec.elements[0], exact_sum(grads)[0])


@pytest.mark.parametrize("kind", [Kind.SUM, Kind.PARAM])
@pytest.mark.parametrize("tags", [(0x8100,), (0x88A8, 0x8100)], ids=["802.1Q", "QinQ"])
def test_tagged_forged_sum_or_params_reach_no_host(fabric, job1, kind, tags):
    """A worker forging a SUM for the optimizer node, or PARAMs for the other workers."""
    skip_if_stripped(fabric, tags)
    src, opt = fabric.hosts["w1_0"], fabric.hosts["opt1"]
    dst = (opt.mac, opt.ip) if kind == Kind.SUM else ("ff:ff:ff:ff:ff:ff", "255.255.255.255")
    values = np.full(K, -1000, np.int64 if kind == Kind.SUM else np.float16)
    frame = codec.encode_tensor(kind, values, codec.Addresses(src.mac, dst[0], src.ip, dst[1]), job=1, step=101,
                                nworkers=3 if kind == Kind.SUM else 0)[0].tobytes()
    before = fabric.drops("TAGGED", 1)
    fabric.send("w1_0", tagged(frame, *tags))
    assert not any(fabric.collect(0).values())
    assert fabric.drops("TAGGED", 1) == before + 1


def test_tagged_ordinary_frames_are_dropped(fabric):
    skip_if_stripped(fabric, (0x8100,))
    src, dst = fabric.hosts["w1_0"], fabric.hosts["w1_1"]
    before = fabric.drops("TAGGED")
    ip = bytes(Ether(src=src.mac, dst=dst.mac) / IP(src=src.ip, dst=dst.ip) / UDP(sport=5, dport=5) / (b"x" * 20))
    arp = bytes(Ether(src=src.mac, dst="ff:ff:ff:ff:ff:ff") / ARP(hwsrc=src.mac, psrc=src.ip, pdst=dst.ip))
    fabric.send("w1_0", tagged(ip, 0x8100))
    fabric.send("w1_0", tagged(arp, 0x88A8, 0x8100))
    assert not any(fabric.collect(0).values())
    assert fabric.drops("TAGGED") == before + 2


@pytest.mark.parametrize("ethertype", [0x88B5, 0x86DD, 0x0842, 0x88CC, 0x0000, 0xFFFF])
def test_unknown_ethertype_is_dropped_not_flooded(fabric, ethertype):
    src = fabric.hosts["w1_1"]
    before = fabric.drops("UNKNOWN_ETHERTYPE")
    fabric.send("w1_1", bytes(Ether(src=src.mac, dst="ff:ff:ff:ff:ff:ff", type=ethertype) / (b"hello" * 10)))
    fabric.send("w1_1", bytes(Ether(src=src.mac, dst=fabric.hosts["opt1"].mac, type=ethertype) / (b"x" * 50)))
    assert not any(fabric.collect(0).values())
    assert fabric.drops("UNKNOWN_ETHERTYPE") == before + 2


def test_untagged_arp_and_ipv4_are_still_forwarded(fabric):
    src, dst = fabric.hosts["w1_0"], fabric.hosts["opt2"]
    arp = bytes(Ether(src=src.mac, dst="ff:ff:ff:ff:ff:ff") / ARP(op=2, hwsrc=src.mac, psrc=src.ip, hwdst=src.mac,
                                                                  pdst=src.ip))  # gratuitous: no answer
    ip = bytes(Ether(src=src.mac, dst=dst.mac) / IP(src=src.ip, dst=dst.ip, proto=253) / (b"y" * 40))
    fabric.send("w1_0", arp)
    got = fabric.collect(len(fabric.hosts) - 1)
    assert all(got[h] == [arp] for h in fabric.hosts if h != "w1_0") and not got["w1_0"]
    fabric.send("w1_0", ip)
    got = fabric.collect(1)
    assert got["opt2"][:1] == [ip]  # (the kernel may answer with ARP and ICMP)


@pytest.mark.parametrize("extra", [1, 8, 64, 2 * K])
def test_trailing_bytes_after_the_elements_are_bad_length(fabric, job1, extra):
    """The completing gradient with trailing bytes would have made an oversized sum."""
    rng = np.random.default_rng(extra)
    grads = [random_fp16(rng) for _ in range(3)]
    before = fabric.drops("BAD_LENGTH", 1)
    fabric.send("w1_0", fabric.grad(job1, 0, grads[0], step=110, chunk=1))
    fabric.send("w1_1", fabric.grad(job1, 1, grads[1], step=110, chunk=1))
    fabric.send("w1_2", fabric.grad(job1, 2, grads[2], step=110, chunk=1) + bytes(i % 256 for i in range(extra)))
    assert not any(fabric.collect(0).values()), "an oversized frame completed the sum"
    assert fabric.drops("BAD_LENGTH", 1) == before + 1
    fabric.send("w1_2", fabric.grad(job1, 2, grads[2], step=110, chunk=1))
    dec = only_sums_at(fabric, fabric.collect(1), "opt1", 1)
    assert np.array_equal(dec.elements[0], exact_sum(grads)[0])


def test_params_with_trailing_bytes_and_a_lying_ipv4_length_are_bad_length(fabric, job1):
    opt = fabric.hosts["opt1"]
    params = codec.encode_tensor(Kind.PARAM, np.ones(K, np.float16), codec.Addresses(
        opt.mac, "ff:ff:ff:ff:ff:ff", opt.ip, "255.255.255.255"), job=1, step=111)[0].tobytes()
    grad = bytearray(fabric.grad(job1, 0, np.ones(K, np.float16), step=111, chunk=2))
    grad[16:18] = (struct.unpack("!H", grad[16:18])[0] + 4).to_bytes(2, "big")  # IPv4 total length
    before = fabric.drops("BAD_LENGTH", 1)
    fabric.send("opt1", params + b"\0" * 6)
    fabric.send("w1_0", bytes(grad) + b"\0" * 4)
    assert not any(fabric.collect(0).values())
    assert fabric.drops("BAD_LENGTH", 1) == before + 2


def test_far_future_step_cannot_claim_a_cell(fabric, job1):
    """Once the job completed step s, a gradient beyond s + STEP_WINDOW is dropped, so it cannot
    overwrite a cell and make every honest contribution after it stale."""
    rng = np.random.default_rng(30)
    complete_round(fabric, job1, 120, 0, rng)  # the job's newest completed step: 120
    before = fabric.drops("FUTURE_STEP", 1)
    for step in (120 + STEP_WINDOW + 1, 1 << 20, 0xFFFFFFFF):
        for chunk in (1, 2):  # cells not yet used at step 120: a far-future use would claim them
            fabric.send("w1_1", fabric.grad(job1, 1, np.ones(K, np.float16), step=step, chunk=chunk))
    assert not any(fabric.collect(0).values())
    assert fabric.drops("FUTURE_STEP", 1) == before + 6
    for chunk in (1, 2):  # honest uses of those cells sum exactly
        complete_round(fabric, job1, 121, chunk, rng)
    complete_round(fabric, job1, 121 + STEP_WINDOW, 3, rng)  # the edge of the window is inside


def test_parameters_arm_the_step_window_before_any_completion(fabric, job1):
    """A restarted switch (here: a recreated job, whose progress is unknown alike) bounds steps from
    the first PARAM of the job's node on, not only from its first completion: the node's stall
    resend re-arms the window before any far-future gradient can claim a cell."""
    rng = np.random.default_rng(34)
    fabric.remove_job(job1)
    again = fabric.install_job(1, job1.workers, "opt1", slot_base=100, slots=4, epoch=job1.epoch + 4000)
    job1.entries, job1.epoch = again.entries, again.epoch
    opt = fabric.hosts["opt1"]
    fabric.send("opt1", codec.encode_tensor(Kind.PARAM, np.ones(K, np.float16), codec.Addresses(
        opt.mac, "ff:ff:ff:ff:ff:ff", opt.ip, "255.255.255.255"), job=1, step=150, slot=0, ver=0)[0].tobytes())
    got = fabric.collect(len(job1.workers))
    assert {h for h, f in got.items() if f} == set(job1.workers)  # multicast as before
    before = fabric.drops("FUTURE_STEP", 1)
    fabric.send("w1_0", fabric.grad(job1, 0, np.ones(K, np.float16), step=150 + STEP_WINDOW + 1, chunk=1))
    assert not any(fabric.collect(0).values())
    assert fabric.drops("FUTURE_STEP", 1) == before + 1
    complete_round(fabric, job1, 150 + STEP_WINDOW, 1, rng)  # the cell was not claimed


def test_chunk_beyond_the_jobs_chunk_count_is_dropped(fabric, job2):
    fabric.remove_job(job2)
    bounded = fabric.install_job(2, job2.workers, "opt2", slot_base=200, slots=4, epoch=job2.epoch + 2000, chunks=6)
    job2.entries, job2.epoch = bounded.entries, bounded.epoch
    rng = np.random.default_rng(31)
    before = fabric.drops("BAD_CHUNK", 2)
    for chunk in (6, 1 << 31):
        fabric.send("w2_0", fabric.grad(job2, 0, np.ones(K, np.float16), step=0, chunk=chunk, slot=chunk % 4))
    assert not any(fabric.collect(0).values())
    assert fabric.drops("BAD_CHUNK", 2) == before + 2
    complete_round(fabric, job2, 0, 5, rng)  # the last chunk is inside


def test_worker_restarting_at_step_zero_is_stale_and_rejoins_at_the_jobs_step(fabric, job1):
    """A restarted worker starts at step 0 on a live job: dropped, never poisoning a cell;
    restarted with the job's next step (`mindp-worker --first-step`) it contributes again."""
    rng = np.random.default_rng(32)
    for step in (130, 131):  # one use of each slot a step: versions 0, then 1
        for chunk in range(4):
            complete_round(fabric, job1, step, chunk, rng, ver=step - 130)
    stale = fabric.drops("STALE", 1)
    future = fabric.drops("FUTURE_STEP", 1)
    for chunk in range(4):
        for ver in (0, 1):
            fabric.send("w1_0", fabric.grad(job1, 0, np.ones(K, np.float16), step=0, chunk=chunk, ver=ver))
    assert not any(fabric.collect(0).values())
    assert fabric.drops("STALE", 1) == stale + 8 and fabric.drops("FUTURE_STEP", 1) == future
    for chunk in range(4):
        complete_round(fabric, job1, 132, chunk, rng)


def test_new_job_epoch_accepts_its_first_step_and_then_bounds_it(fabric, job1):
    """A recreated job's progress is unknown until its first completion (docs/P4.md), then bounded."""
    rng = np.random.default_rng(33)
    complete_round(fabric, job1, 140, 0, rng)
    fabric.remove_job(job1)
    again = fabric.install_job(1, job1.workers, "opt1", slot_base=100, slots=4, epoch=job1.epoch + 3000)
    job1.entries, job1.epoch = again.entries, again.epoch
    complete_round(fabric, job1, 5, 0, rng)  # a new job may start below the old one's step
    before = fabric.drops("FUTURE_STEP", 1)
    fabric.send("w1_0", fabric.grad(job1, 0, np.ones(K, np.float16), step=140, chunk=1))
    assert not any(fabric.collect(0).values())
    assert fabric.drops("FUTURE_STEP", 1) == before + 1
