"""Packet-level tests of p4src/mindp.p4: expected frames on expected ports, and nothing else."""
import itertools
import struct
import subprocess

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from controller import p4info_names as N
from mindp import codec, progress
from mindp.fixedpoint import exact_sum
from mindp.layers import Mindp
from mindp.protocol import ETH_LEN, K, Flag, Kind, UDP_PORT, link_mtu, param_frame_len

from .fabric import param_frame, random_fp16, unchanged_but_addresses
from .sums import only_sums_at

pytestmark = pytest.mark.net


def check_ip(frame: bytes) -> None:
    ip = frame[14:34]
    assert codec.ipv4_checksum(ip) == 0, "bad IPv4 checksum"
    assert struct.unpack("!H", ip[2:4])[0] == len(frame) - 14


def test_flooded_frame_reaches_every_other_host_once(fabric):
    src = fabric.hosts["w1_1"]
    frame = bytes(Ether(src=src.mac, dst="ff:ff:ff:ff:ff:ff") / IP(src=src.ip, dst="255.255.255.255")
                  / UDP(sport=9, dport=9) / (b"hello" * 10))
    fabric.send("w1_1", frame)
    got = fabric.collect(len(fabric.hosts) - 1)
    assert not got["w1_1"]
    assert all(got[h] == [frame] for h in fabric.hosts if h != "w1_1")


def test_unknown_destination_is_dropped_and_counted(fabric):
    before = fabric.drops("NO_ROUTE")
    src = fabric.hosts["x"]
    fabric.send("x", bytes(Ether(src=src.mac, dst="02:aa:00:00:00:01") / IP(src=src.ip, dst="10.0.9.9")
                           / UDP(sport=9, dport=9) / (b"z" * 50)))
    assert not any(fabric.collect(0).values())
    assert fabric.drops("NO_ROUTE") == before + 1


def test_single_contribution_per_worker_gives_exact_sum(fabric, job1):
    rng = np.random.default_rng(1)
    grads = [random_fp16(rng) for _ in job1.workers]
    for w, g in enumerate(grads):
        fabric.send(job1.workers[w], fabric.grad(job1, w, g, step=0, chunk=5))
        if w < len(grads) - 1:
            assert not any(fabric.collect(0, grace=0.1).values()), "sum before the last worker"
    dec = only_sums_at(fabric, fabric.collect(1), "opt1", 1)
    total, _ = exact_sum(grads)
    assert np.array_equal(dec.elements[0], total)
    h = dec.headers[0]
    assert (h["kind"], h["job"], h["step"], h["chunk"], h["nworkers"], h["flags"]) == (Kind.SUM, 1, 0, 5, 3, 0)


def test_sum_frame_is_well_formed_for_the_optimizer_node(fabric, job1):
    g = np.ones(K, np.float16)
    for w in range(3):
        fabric.send(job1.workers[w], fabric.grad(job1, w, g, step=1, chunk=2))
    got = fabric.collect(1)
    frame = got["opt1"][0]
    check_ip(frame)
    pkt = Ether(frame)
    opt = fabric.hosts["opt1"]
    assert pkt.dst == opt.mac and pkt[IP].dst == opt.ip
    assert pkt[UDP].dport == UDP_PORT and pkt[UDP].len == len(frame) - 34
    assert pkt[Mindp].kind == Kind.SUM and pkt[Mindp].nworkers == 3


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_every_arrival_order_gives_the_same_exact_sum(fabric, job1, order):
    rng = np.random.default_rng(sum(order))
    grads = [random_fp16(rng) for _ in range(3)]
    for w in order:
        fabric.send(job1.workers[w], fabric.grad(job1, w, grads[w], step=3, chunk=1))
    dec = only_sums_at(fabric, fabric.collect(1), "opt1", 1)
    assert np.array_equal(dec.elements[0], exact_sum(grads)[0])


def test_duplicate_contribution_is_a_noop(fabric, job1):
    g = [np.full(K, 0.5, np.float16), np.full(K, 0.25, np.float16), np.full(K, 2.0**-24, np.float16)]
    dups = fabric.counter("MindpIngress.aggregation.duplicates", 1)
    dropped = fabric.drops("DUPLICATE", 1)
    frame0 = fabric.grad(job1, 0, g[0], step=4, chunk=0)
    fabric.send("w1_0", frame0)
    fabric.send("w1_0", frame0)
    fabric.send("w1_1", fabric.grad(job1, 1, g[1], step=4, chunk=0))
    assert not any(fabric.collect(0, grace=0.1).values())
    fabric.send("w1_2", fabric.grad(job1, 2, g[2], step=4, chunk=0))
    dec = only_sums_at(fabric, fabric.collect(1), "opt1", 1)
    assert np.array_equal(dec.elements[0], exact_sum(g)[0])
    assert fabric.counter("MindpIngress.aggregation.duplicates", 1) == dups + 1
    assert fabric.drops("DUPLICATE", 1) == dropped + 1


def test_retransmission_to_a_completed_slot_resends_the_sum(fabric, job1):
    rng = np.random.default_rng(9)
    grads = [random_fp16(rng) for _ in range(3)]
    for w in range(3):
        fabric.send(job1.workers[w], fabric.grad(job1, w, grads[w], step=5, chunk=3))
    first = only_sums_at(fabric, fabric.collect(1), "opt1", 1)
    assert not first.headers[0]["flags"] & Flag.RETRANSMIT
    resent = fabric.counter("MindpIngress.aggregation.resent_sums", 1)
    fabric.send("w1_1", fabric.grad(job1, 1, grads[1], step=5, chunk=3, flags=int(Flag.RETRANSMIT)))
    again = only_sums_at(fabric, fabric.collect(1), "opt1", 1)
    assert np.array_equal(again.elements[0], first.elements[0])
    assert again.headers[0]["flags"] & Flag.RETRANSMIT and again.headers[0]["nworkers"] == 3
    assert fabric.counter("MindpIngress.aggregation.resent_sums", 1) == resent + 1


def test_sum_completed_by_a_retransmitted_gradient_is_flagged(fabric, job1):
    """Its round trip includes a timeout: the flag tells workers not to sample it (Karn)."""
    rng = np.random.default_rng(10)
    grads = [random_fp16(rng) for _ in range(3)]
    completions = fabric.counter("MindpIngress.aggregation.completions", 1)
    resent = fabric.counter("MindpIngress.aggregation.resent_sums", 1)
    fabric.send("w1_0", fabric.grad(job1, 0, grads[0], step=6, chunk=2))
    fabric.send("w1_1", fabric.grad(job1, 1, grads[1], step=6, chunk=2, flags=int(Flag.RETRANSMIT)))
    fabric.send("w1_2", fabric.grad(job1, 2, grads[2], step=6, chunk=2, flags=int(Flag.RETRANSMIT)))
    dec = only_sums_at(fabric, fabric.collect(1), "opt1", 1)
    assert np.array_equal(dec.elements[0], exact_sum(grads)[0])
    assert dec.headers[0]["flags"] == Flag.RETRANSMIT and dec.headers[0]["nworkers"] == 3
    assert fabric.counter("MindpIngress.aggregation.completions", 1) == completions + 1
    assert fabric.counter("MindpIngress.aggregation.resent_sums", 1) == resent


def test_versions_alternate_over_many_reuses_of_a_slot(fabric, job1):
    """Slot 0 of a 4-slot job reused for 12 uses; while use u is in progress, a worker that lost
    the parameters of use u-1 retransmits it and gets that sum from the other version."""
    rng = np.random.default_rng(11)
    previous = None
    for u in range(12):
        step, chunk, ver = u, 0, u & 1
        grads = [random_fp16(rng) for _ in range(3)]
        fabric.send("w1_0", fabric.grad(job1, 0, grads[0], step=step, chunk=chunk, ver=ver))
        if previous is not None:
            pgrads, pstep = previous
            fabric.send("w1_2", fabric.grad(job1, 2, pgrads[2], step=pstep, chunk=chunk, ver=ver ^ 1,
                                            flags=int(Flag.RETRANSMIT)))
            old = only_sums_at(fabric, fabric.collect(1), "opt1", 1)
            assert np.array_equal(old.elements[0], exact_sum(pgrads)[0])
            assert old.headers[0]["step"] == pstep
        for w in (1, 2):
            fabric.send(job1.workers[w], fabric.grad(job1, w, grads[w], step=step, chunk=chunk, ver=ver))
        dec = only_sums_at(fabric, fabric.collect(1), "opt1", 1)
        assert np.array_equal(dec.elements[0], exact_sum(grads)[0]), f"use {u}"
        previous = (grads, step)


def test_stale_gradient_of_an_older_use_is_dropped(fabric, job1):
    g = np.ones(K, np.float16)
    for step in (20, 22):
        for w in range(3):
            fabric.send(job1.workers[w], fabric.grad(job1, w, g, step=step, chunk=0, ver=0))
        only_sums_at(fabric, fabric.collect(1), "opt1", 1)
    stale = fabric.drops("STALE", 1)
    fabric.send("w1_1", fabric.grad(job1, 1, g, step=20, chunk=0, ver=0, flags=int(Flag.RETRANSMIT)))
    assert not any(fabric.collect(0).values())
    assert fabric.drops("STALE", 1) == stale + 1


def test_exact_sums_over_random_vectors_with_edge_values(fabric, job1):
    rng = np.random.default_rng(5)
    edges = np.array([65504, -65504, 0.0, -0.0, 2.0**-24, -(2.0**-24), 1023 * 2.0**-24, 2.0**-14], np.float16)
    for chunk in range(4):
        grads = [random_fp16(rng) for _ in range(3)]
        grads[chunk % 3][: len(edges)] = edges
        grads[(chunk + 1) % 3][: len(edges)] = edges  # 65504 + 65504: beyond fp16, exact in int64
        for w in range(3):
            fabric.send(job1.workers[w], fabric.grad(job1, w, grads[w], step=30, chunk=chunk))
        dec = only_sums_at(fabric, fabric.collect(1), "opt1", 1)
        assert np.array_equal(dec.elements[0], exact_sum(grads)[0])
        assert dec.headers[0]["flags"] == 0


def test_nonfinite_sets_the_flag_without_corrupting_neighbours(fabric, job1):
    rng = np.random.default_rng(6)
    grads = [random_fp16(rng) for _ in range(3)]
    grads[1][7] = np.inf
    grads[2][8] = np.nan
    for w in range(3):
        fabric.send(job1.workers[w], fabric.grad(job1, w, grads[w], step=40, chunk=1))
    dec = only_sums_at(fabric, fabric.collect(1), "opt1", 1)
    total, nonfinite = exact_sum(grads)
    assert dec.headers[0]["flags"] & Flag.NONFINITE
    assert np.array_equal(dec.elements[0], total) and list(np.flatnonzero(nonfinite)) == [7, 8]
    clean = [random_fp16(rng) for _ in range(3)]
    for w in range(3):  # the next use of the same cell starts clean
        fabric.send(job1.workers[w], fabric.grad(job1, w, clean[w], step=42, chunk=1))
    dec = only_sums_at(fabric, fabric.collect(1), "opt1", 1)
    assert dec.headers[0]["flags"] == 0 and np.array_equal(dec.elements[0], exact_sum(clean)[0])


def test_two_jobs_at_once_on_disjoint_slots(fabric, job1, job2):
    rng = np.random.default_rng(8)
    g1 = [random_fp16(rng) for _ in range(3)]
    g2 = [random_fp16(rng) for _ in range(2)]
    fabric.send("w1_0", fabric.grad(job1, 0, g1[0], step=50, chunk=0))
    fabric.send("w2_0", fabric.grad(job2, 0, g2[0], step=50, chunk=0))
    fabric.send("w1_1", fabric.grad(job1, 1, g1[1], step=50, chunk=0))
    fabric.send("w2_1", fabric.grad(job2, 1, g2[1], step=50, chunk=0))
    got = fabric.collect(1)
    d2 = codec.decode(got.pop("opt2"), Kind.SUM)
    assert len(d2.headers) == 1 and d2.headers[0]["job"] == 2
    assert np.array_equal(d2.elements[0], exact_sum(g2)[0])
    assert not any(got.values())
    fabric.send("w1_2", fabric.grad(job1, 2, g1[2], step=50, chunk=0))
    d1 = only_sums_at(fabric, fabric.collect(1), "opt1", 1)
    assert np.array_equal(d1.elements[0], exact_sum(g1)[0])


def test_recreated_job_starts_from_clean_slots(fabric, job1):
    """A new epoch overwrites cells left half-filled by an earlier incarnation of the job."""
    g = np.ones(K, np.float16)
    counted = fabric.counter(N.GRAD_PACKETS, 1)
    fabric.send("w1_0", fabric.grad(job1, 0, g, step=60, chunk=0))  # never completed
    # In the cell before the job goes: processed after its new entries, the frame would claim the
    # cell for the new epoch at step 60 and make step 0 stale (a busy BMv2 lags its sender).
    progress.wait(lambda: fabric.counter(N.GRAD_PACKETS, 1) > counted, lambda: 0, stall=progress.STALL,
                  what="the switch counting the old incarnation's gradient")
    fabric.remove_job(job1)
    again = fabric.install_job(1, job1.workers, "opt1", slot_base=100, slots=4, epoch=job1.epoch + 1000)
    job1.entries = again.entries
    job1.epoch = again.epoch
    grads = [np.full(K, 0.5, np.float16)] * 3
    for w in range(3):
        fabric.send(job1.workers[w], fabric.grad(job1, w, grads[w], step=0, chunk=0))
    dec = only_sums_at(fabric, fabric.collect(1), "opt1", 1)
    assert np.array_equal(dec.elements[0], exact_sum(grads)[0]) and dec.headers[0]["nworkers"] == 3


def raw_mindp(fabric, src, jb, *, truncate=0, **overrides):
    """A gradient frame from `src` for job `jb` with header fields overridden, optionally cut short."""
    host, opt = fabric.hosts[src], fabric.hosts[jb.optimizer]
    fields = dict(job=jb.job_id, worker=0, step=70, slot=0, ver=0)
    fields.update(overrides)
    patched = {"version": (42, 1), "kind": (43, 1), "count": (52, 2)}
    frame = codec.encode_tensor(Kind.GRAD, np.ones(K, np.float16), codec.Addresses(host.mac, opt.mac, host.ip, opt.ip),
                                **{k: v for k, v in fields.items() if k not in patched})[0]
    b = bytearray(frame.tobytes())
    for name, (offset, width) in patched.items():
        if name in overrides:
            b[offset : offset + width] = overrides[name].to_bytes(width, "big")
    return bytes(b[: len(b) - truncate])


@pytest.mark.parametrize(
    "case,reason,row",
    [
        ("spoofed port", "NOT_MEMBER", 1),
        ("unknown job", "UNKNOWN_JOB", 9),
        ("job id beyond the table", "UNKNOWN_JOB", None),
        ("truncated header", "MALFORMED", None),
        ("truncated elements", "MALFORMED", 1),
        ("protocol version 2", "BAD_VERSION", 1),
        ("sum sent to the switch", "BAD_KIND", 1),
        ("slot outside the job", "BAD_SLOT", 1),
        ("slot version 2", "BAD_SLOT", 1),
        ("element count 0", "BAD_LENGTH", 1),
        ("parameters from a worker port", "NOT_MEMBER", 1),
    ],
)
def test_bad_packets_are_dropped_and_counted(fabric, job1, case, reason, row):
    frame = {
        "spoofed port": lambda: raw_mindp(fabric, "w1_0", job1, worker=1),
        "unknown job": lambda: raw_mindp(fabric, "w1_0", job1, job=9),
        "job id beyond the table": lambda: raw_mindp(fabric, "w1_0", job1, job=4000),
        "truncated header": lambda: raw_mindp(fabric, "w1_0", job1, truncate=2 * K + 10),
        "truncated elements": lambda: raw_mindp(fabric, "w1_0", job1, truncate=3),
        "protocol version 2": lambda: raw_mindp(fabric, "w1_0", job1, version=2),
        "sum sent to the switch": lambda: raw_mindp(fabric, "w1_0", job1, kind=int(Kind.SUM)),
        "slot outside the job": lambda: raw_mindp(fabric, "w1_0", job1, slot=4),
        "slot version 2": lambda: raw_mindp(fabric, "w1_0", job1, ver=2),
        "element count 0": lambda: raw_mindp(fabric, "w1_0", job1, count=0),
        "parameters from a worker port": lambda: raw_mindp(fabric, "w1_0", job1, kind=int(Kind.PARAM)),
    }[case]()
    before = fabric.drops(reason, row)
    fabric.send("w1_0", frame)
    assert not any(fabric.collect(0).values()), case
    assert fabric.drops(reason, row) == before + 1, case


def multicast(fabric, job, frame) -> dict[str, bytes]:
    """The node's PARAM `frame` sent from opt1: exactly one replica to each of the job's workers,
    addressed to it, counted once; the replicas by worker."""
    sent = fabric.counter("MindpIngress.multicast.param_packets", job.job_id)
    fabric.send("opt1", frame)
    got = fabric.collect(3)
    assert {h for h, f in got.items() if f} == set(job.workers)
    for name in job.workers:
        assert len(got[name]) == 1
        check_ip(got[name][0])
        pkt = Ether(got[name][0])
        assert pkt.dst == fabric.hosts[name].mac and pkt[IP].dst == fabric.hosts[name].ip
    assert fabric.counter("MindpIngress.multicast.param_packets", job.job_id) == sent + 1
    return {name: got[name][0] for name in job.workers}


def test_parameters_are_multicast_to_exactly_the_jobs_workers(fabric, job1, job2):
    opt = fabric.hosts["opt1"]
    params = np.linspace(-2, 2, K).astype(np.float16)
    frame = codec.encode_tensor(Kind.PARAM, params, codec.Addresses(opt.mac, "ff:ff:ff:ff:ff:ff", opt.ip,
                                "255.255.255.255"), job=1, step=80, slot=2, ver=1)[0].tobytes()
    for out in multicast(fabric, job1, frame).values():
        pkt = Ether(out)
        assert pkt.src == opt.mac and pkt[IP].src == opt.ip
        hdr, elems = codec.decode_one(out, Kind.PARAM)
        assert (hdr["job"], hdr["step"], hdr["slot"], hdr["ver"]) == (1, 80, 2, 1)
        assert np.array_equal(elems.view(np.uint16), params.view(np.uint16))


@pytest.mark.parametrize("chunks", [2, 4])
def test_parameters_of_several_chunks_reach_every_worker_whole(fabric, job1, chunks):
    """The first chunk is parsed, the rest rides along as payload: every replica is the node's frame
    byte for byte but for its worker's addresses."""
    opt = fabric.hosts["opt1"]
    values = random_fp16(np.random.default_rng(chunks), chunks * K)
    frame = param_frame(opt, values, job=1, step=81, chunk=6, slot=2, ver=1)
    assert len(frame) == param_frame_len(chunks)
    for out in multicast(fabric, job1, frame).values():
        assert unchanged_but_addresses(out, frame)


#: A `more` that wraps more * 2K (16 bits) to 0, so a one-chunk frame's lengths would match it.
WRAPPING_MORE = (1 << 16) // (2 * K) if (1 << 16) % (2 * K) == 0 else None


@pytest.mark.parametrize("case", ["more for 3 chunks on 2", "more 1 on 1 chunk", "UDP length of 1 chunk less",
                                  "more 4", "more wrapping the length", "count below K", "gradient with more"])
def test_frames_of_several_chunks_that_are_not_full_params_are_dropped(fabric, job1, case):
    if case == "more wrapping the length" and WRAPPING_MORE is None:
        pytest.skip(f"no more wraps 2K = {2 * K} to 0")
    if case == "more 4" and param_frame_len(5) - ETH_LEN > link_mtu():
        pytest.skip(f"a frame of 5 chunks of K = {K} is longer than the links' MTU ({link_mtu()})")
    opt, w = fabric.hosts["opt1"], fabric.hosts["w1_0"]
    ones = np.ones(K, np.float16)
    fields = dict(job=1, step=82, chunk=0)
    frame = {
        "more for 3 chunks on 2": lambda: param_frame(opt, np.tile(ones, 2), more=2, **fields),
        "more 1 on 1 chunk": lambda: param_frame(opt, ones, more=1, **fields),
        "UDP length of 1 chunk less": lambda: param_frame(opt, np.tile(ones, 4), **fields),
        "more 4": lambda: param_frame(opt, np.tile(ones, 5), **fields),  # its lengths those of more = 4
        "more wrapping the length": lambda: param_frame(opt, ones, more=WRAPPING_MORE, **fields),
        "count below K": lambda: param_frame(opt, np.tile(ones, 2), count=K - 1, **fields),
        "gradient with more": lambda: param_frame(w, np.tile(ones, 2), kind=Kind.GRAD, worker=0, **fields),
    }[case]()
    if case == "UDP length of 1 chunk less":
        frame = frame[:38] + struct.pack("!H", struct.unpack("!H", frame[38:40])[0] - 2 * K) + frame[40:]
    before = fabric.drops("BAD_LENGTH", 1)
    fabric.send("w1_0" if case == "gradient with more" else "opt1", frame)
    assert not any(fabric.collect(0).values()), case
    assert fabric.drops("BAD_LENGTH", 1) == before + 1, case


# Last in the module: the kernels' ARP traffic it starts must not reach the tests above.
def test_ping_and_arp_between_hosts(fabric):
    ns = fabric.bed.hosts["w1_0"].netns
    for dst in ("opt1", "w2_1", "x"):
        r = subprocess.run(["ip", "netns", "exec", ns, "ping", "-c", "2", "-i", "0.2", "-W", "2",
                            fabric.hosts[dst].ip], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    for nh in fabric.bed.hosts.values():  # no ARP probes later from these neighbour entries
        nh.exec("ip", "neigh", "flush", "all", check=True)
    fabric.drain()
