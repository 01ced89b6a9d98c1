"""What the controller configures, seen in real packets on veths, and counted in its per-job stats."""
from __future__ import annotations

import numpy as np
import pytest

from controller.controller import Controller
from controller.stats import rates
from mindp import codec
from mindp.protocol import K, Kind
from mindp.harness import testbed
from mindp.topology import Host, star

from tests.target_params import TARGET_PARAMS

from .switch import Switch

pytestmark = pytest.mark.net


def ours(frame: bytes) -> bool:
    """IPv4/UDP frames: the tests look at mindp traffic, not the hosts' own chatter."""
    return len(frame) >= 38 and frame[12:14] == b"\x08\x00" and frame[23] == 17


@pytest.fixture(params=TARGET_PARAMS)
def net(request, tmp_path):
    topo = star([2, 1], slots=8)
    topo.hosts["spare"] = Host("spare", "02:00:00:00:00:14", "10.0.0.20", 20)
    with testbed.Testbed("ct") as bed:
        for h in topo.hosts.values():
            bed.add(h)
        sw = Switch(request.param, tmp_path, bed.ports()).start()
        hosts = testbed.FrameTap(bed, accept=ours)
        try:
            with Controller(sw.addr, topology=topo) as ctl:
                ctl.push()
                ctl.install_forwarding()
                yield ctl, hosts, topo
        finally:
            hosts.close()
            sw.stop()


def grad(topo, job, sender: str, worker: int, values, step=0, chunk=0) -> bytes:
    h, opt = topo.hosts[sender], topo.hosts[job.optimizer.host]
    return codec.encode_tensor(Kind.GRAD, np.asarray(values, np.float16), codec.Addresses(h.mac, opt.mac, h.ip, opt.ip),
                               first_chunk=chunk, job=job.job_id, worker=worker, step=step,
                               slot=chunk % job.slot_count, ver=0)[0].tobytes()


def param(topo, job, values, step=0, chunk=0) -> bytes:
    opt = topo.hosts[job.optimizer.host]
    return codec.encode_tensor(Kind.PARAM, np.asarray(values, np.float16),
                               codec.Addresses(opt.mac, "ff:ff:ff:ff:ff:ff", opt.ip, "255.255.255.255"),
                               first_chunk=chunk, job=job.job_id, step=step, slot=chunk % job.slot_count,
                               ver=0)[0].tobytes()


def test_jobs_aggregate_multicast_and_are_counted_per_job(net):
    ctl, hosts, topo = net
    j1 = ctl.create_job(topo.jobs[0])
    j2 = ctl.create_job(topo.jobs[1])
    before = ctl.stats()
    ones = np.ones(K, np.float16)
    hosts.send("w1_0", grad(topo, j1, "w1_0", 0, ones))
    hosts.send("w1_1", grad(topo, j1, "w1_1", 1, ones))
    got = hosts.collect(1)
    assert len(got["opt1"]) == 1 and not any(v for k, v in got.items() if k != "opt1")
    dec = codec.decode(got["opt1"], Kind.SUM)
    assert np.array_equal(dec.elements[0], np.full(K, 2 << 24))  # exact sum at scale 2^24
    hosts.send("w1_0", grad(topo, j1, "w1_0", 1, ones, chunk=1))  # w1_0 posing as worker 1
    hosts.send("w2_0", grad(topo, j2, "w2_0", 0, ones))  # job 2's only worker: completes at once
    hosts.send("opt1", param(topo, j1, ones))
    got = hosts.collect(3)
    assert len(got["w1_0"]) == len(got["w1_1"]) == len(got["opt2"]) == 1
    after = ctl.stats()
    s1, s2 = after.jobs[1], after.jobs[2]
    assert (s1.grad_packets, s1.completions, s1.param_packets, s1.drops) == (2, 1, 1, {"NOT_MEMBER": 1})
    assert (s2.grad_packets, s2.completions, s2.param_packets, s2.dropped) == (1, 1, 0, 0)
    r = rates(before, after)
    assert r[1]["grad_packets"] > 0 and r[2]["param_packets"] == 0


def test_replaced_worker_moves_admission_and_multicast(net):
    ctl, hosts, topo = net
    j1 = ctl.create_job(topo.jobs[0])
    ctl.replace_worker(1, 1, "spare")
    ones = np.ones(K, np.float16)
    hosts.send("w1_1", grad(topo, j1, "w1_1", 1, ones))  # the old port: no longer a member
    hosts.send("w1_0", grad(topo, j1, "w1_0", 0, ones))
    assert not any(hosts.collect(0, grace=0.3).values())
    hosts.send("spare", grad(topo, j1, "spare", 1, ones))
    got = hosts.collect(1)
    assert len(got["opt1"]) == 1
    hosts.send("opt1", param(topo, j1, ones))
    got = hosts.collect(2)
    assert len(got["w1_0"]) == len(got["spare"]) == 1 and not got["w1_1"]
    assert got["spare"][0][:6] == bytes.fromhex("020000000014")  # rewritten to the new worker's MAC
    s = ctl.stats().jobs[1]
    assert s.drops == {"NOT_MEMBER": 1} and s.completions == 1
    ctl.delete_job(1)  # deleted job: its gradients are now dropped as UNKNOWN_JOB
    hosts.send("w1_0", grad(topo, j1, "w1_0", 0, ones, step=1))
    assert not any(hosts.collect(0, grace=0.3).values())
    assert ctl.stats([1]).jobs[1].drops.get("UNKNOWN_JOB") == 1
