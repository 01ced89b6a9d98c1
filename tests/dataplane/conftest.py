"""PTF-style harness for the switch program: the real target on veth pairs in
network namespaces, programmed over P4Runtime (p4runtime-shell), frames sent
and received on raw sockets in the hosts' namespaces.

The same suite runs on every target present: the embedded switch always, BMv2
wherever simple_switch_grpc is installed.
"""
from __future__ import annotations

import select
import time
from dataclasses import dataclass, field

import numpy as np
import p4runtime_sh.shell as sh
import pytest

from mindp import codec, targets
from mindp.protocol import K, Kind
from mindp.testbed import Testbed
from mindp.topology import Host, star
from p4src import artifacts

FLOOD_GROUP = 1
DROP_REASONS = 16
NO_JOB_ROW = 64
REASONS = {
    "MALFORMED": 0, "BAD_VERSION": 1, "BAD_KIND": 2, "BAD_LENGTH": 3, "UNKNOWN_JOB": 4,
    "NOT_MEMBER": 5, "BAD_SLOT": 6, "STALE": 7, "DUPLICATE": 8, "NO_ROUTE": 10,
}
BCAST = codec.Addresses


def available_targets():
    return [
        pytest.param("embedded"),
        pytest.param(
            "bmv2",
            marks=pytest.mark.skipif(targets.find_bmv2() is None, reason="BMv2 simple_switch_grpc not installed"),
        ),
    ]


@dataclass
class Job:
    job_id: int
    workers: list[str]
    optimizer: str
    slot_base: int
    slots: int
    epoch: int
    group: int
    entries: list = field(default_factory=list)


class Fabric:
    """The switch under test, its hosts, and P4Runtime access."""

    def __init__(self, bed: Testbed, hosts: dict[str, Host]):
        self.bed = bed
        self.hosts = hosts
        self.socks = {name: bed.hosts[name].socket() for name in hosts}
        self.by_fd = {s.fileno(): name for name, s in self.socks.items()}

    # --- P4Runtime -------------------------------------------------------
    @staticmethod
    def entry(table: str, action: str, match: dict, params: dict):
        te = sh.TableEntry(table)(action=action)
        for k, v in match.items():
            te.match[k] = str(v)
        for k, v in params.items():
            te.action[k] = str(v)
        te.insert()
        return te

    def install_forwarding(self) -> None:
        for h in self.hosts.values():
            self.entry("MindpIngress.forwarding.l2_forward", "MindpIngress.forwarding.forward",
                       {"hdr.ethernet.dstAddr": h.mac}, {"port": h.port})
        self.entry("MindpIngress.forwarding.l2_forward", "MindpIngress.forwarding.flood",
                   {"hdr.ethernet.dstAddr": "ff:ff:ff:ff:ff:ff"}, {"group": FLOOD_GROUP})
        group = sh.MulticastGroupEntry(FLOOD_GROUP)
        for h in self.hosts.values():
            group.add(h.port, 0)
        group.insert()

    def install_job(self, job_id, workers, optimizer, slot_base, slots, epoch=1) -> Job:
        opt = self.hosts[optimizer]
        job = Job(job_id, list(workers), optimizer, slot_base, slots, epoch, 256 + job_id)
        job.entries.append(self.entry(
            "MindpIngress.admission.jobs", "MindpIngress.admission.set_job", {"hdr.mindp.job": job_id},
            {"slot_base": slot_base, "slot_count": slots, "workers": len(workers), "optimizer_port": opt.port,
             "optimizer_mac": opt.mac, "optimizer_ip": opt.ip, "mcast_group": job.group, "epoch": epoch}))
        job.entries.append(self.entry(
            "MindpIngress.admission.optimizers", "MindpIngress.admission.admit",
            {"standard_metadata.ingress_port": opt.port, "hdr.mindp.job": job_id}, {}))
        group = sh.MulticastGroupEntry(job.group)
        for w, name in enumerate(workers):
            h = self.hosts[name]
            rid = 1 + job_id * 32 + w
            job.entries.append(self.entry(
                "MindpIngress.admission.workers", "MindpIngress.admission.admit",
                {"standard_metadata.ingress_port": h.port, "hdr.mindp.job": job_id, "hdr.mindp.worker": w}, {}))
            job.entries.append(self.entry(
                "MindpEgress.rewrite.param_rewrite", "MindpEgress.rewrite.set_worker_address",
                {"standard_metadata.egress_rid": rid}, {"mac": h.mac, "ip": h.ip}))
            group.add(h.port, rid)
        group.insert()
        return job

    def remove_job(self, job: Job) -> None:
        for te in reversed(job.entries):
            te.delete()
        sh.MulticastGroupEntry(job.group).delete()

    @staticmethod
    def counter(name: str, index: int) -> int:
        ce = sh.CounterEntry(name)
        ce.index = index
        return sum(c.data.packet_count for c in ce.read())

    def drops(self, reason: str, job: int | None = None) -> int:
        row = NO_JOB_ROW if job is None else job
        return self.counter("MindpIngress.drops", row * DROP_REASONS + REASONS[reason])

    # --- frames ----------------------------------------------------------
    def grad(self, job: Job, worker: int, values, *, step: int, chunk: int, ver: int | None = None,
             slot: int | None = None, flags: int = 0, src: str | None = None, **fields) -> bytes:
        """A gradient frame from `worker` of `job` (from host `src` if given: spoofing)."""
        host = self.hosts[src or job.workers[worker]]
        opt = self.hosts[job.optimizer]
        addrs = codec.Addresses(host.mac, opt.mac, host.ip, opt.ip)
        slot = chunk % job.slots if slot is None else slot
        ver = 0 if ver is None else ver
        values = np.asarray(values, dtype=np.float16)
        return codec.encode_tensor(Kind.GRAD, values, addrs, first_chunk=chunk, job=job.job_id, worker=worker,
                                   step=step, slot=slot, ver=ver, flags=flags, **fields)[0].tobytes()

    def send(self, host: str, frame: bytes) -> None:
        self.socks[host].send(frame)

    def collect(self, n: int = 0, timeout: float = 3.0, grace: float = 0.25) -> dict[str, list[bytes]]:
        """Frames received per host: wait until `n` arrived (or timeout), then `grace` more for extras."""
        got: dict[str, list[bytes]] = {name: [] for name in self.hosts}
        total = 0
        deadline = time.monotonic() + timeout
        quiet_until = None
        while True:
            now = time.monotonic()
            if total >= n and quiet_until is None:
                quiet_until = now + grace
            end = quiet_until if quiet_until is not None else deadline
            if now >= end:
                return got
            ready, _, _ = select.select(list(self.socks.values()), [], [], end - now)
            for s in ready:
                while True:
                    try:
                        frame = s.recv(4096)
                    except BlockingIOError:
                        break
                    got[self.by_fd[s.fileno()]].append(frame)
                    total += 1

    def drain(self) -> None:
        self.collect(0, grace=0.05)

    def close(self) -> None:
        for s in self.socks.values():
            s.close()


@pytest.fixture(scope="module", params=available_targets())
def fabric(request, tmp_path_factory):
    topo = star([3, 2])
    hosts = dict(topo.hosts)
    hosts["x"] = Host("x", "02:00:00:00:00:63", "10.0.0.99", 9)  # a host in no job
    logs = tmp_path_factory.mktemp(f"dp-{request.param}")
    with Testbed("dp") as bed:
        for h in hosts.values():
            bed.add(h)
        cfg = targets.SwitchConfig(ports=bed.ports(), grpc_addr=f"127.0.0.1:{targets.free_port()}",
                                   log_file=str(logs / "switch.log"), thrift_port=targets.free_port())
        with targets.SwitchProcess(request.param, cfg):
            sh.setup(device_id=0, grpc_addr=cfg.grpc_addr, election_id=(0, 1),
                     config=sh.FwdPipeConfig(str(artifacts.P4INFO), str(artifacts.BMV2_JSON)))
            fab = Fabric(bed, hosts)
            try:
                fab.install_forwarding()
                fab.drain()
                yield fab
            finally:
                fab.close()
                sh.teardown()


_epoch = iter(range(1, 1 << 16))


@pytest.fixture
def job1(fabric):
    """Job 1: workers w1_0..w1_2, optimizer opt1, 4 slots at pool offset 100, a fresh epoch."""
    job = fabric.install_job(1, ["w1_0", "w1_1", "w1_2"], "opt1", slot_base=100, slots=4, epoch=next(_epoch))
    yield job
    fabric.remove_job(job)
    fabric.drain()


@pytest.fixture
def job2(fabric):
    """Job 2: workers w2_0, w2_1, optimizer opt2, 4 slots at pool offset 200."""
    job = fabric.install_job(2, ["w2_0", "w2_1"], "opt2", slot_base=200, slots=4, epoch=next(_epoch))
    yield job
    fabric.remove_job(job)
    fabric.drain()


def random_fp16(rng, n=K, subnormal_share=0.2):
    """Random finite fp16 values including subnormals, +-65504 and +-0."""
    v = rng.standard_normal(n) * rng.choice([1e-6, 1e-2, 1.0, 100.0], size=n)
    v = np.clip(v, -65504, 65504).astype(np.float16)
    sub = rng.random(n) < subnormal_share
    v[sub] = (rng.integers(-1023, 1024, size=sub.sum()) * 2.0**-24).astype(np.float16)
    return v
