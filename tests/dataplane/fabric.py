"""PTF-style harness for the switch program: the real target on veth pairs in network namespaces,
programmed over P4Runtime (the controller's SwitchConnection, with explicit entries so tests choose
slot ranges and epochs), frames sent and received on raw sockets in the hosts' namespaces; and the
frames and values the packet tests send."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from controller import p4info_names as N
from controller.model import Entry, Group
from controller.p4runtime import SwitchConnection
from mindp import codec
from mindp.protocol import K, Kind
from mindp.harness.testbed import FrameTap, Testbed
from mindp.topology import Host

#: Job epochs, each used once in a module's switch (its fixtures' jobs and a test's own).
epochs = iter(range(1, 1 << 16))


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


class SwitchFabric:
    """The switch under test, its hosts, and P4Runtime access."""

    def __init__(self, bed: Testbed, hosts: dict[str, Host], sw: SwitchConnection):
        self.bed = bed
        self.sw = sw
        self.hosts = hosts
        self.tap = FrameTap(bed, list(hosts))

    # --- P4Runtime -------------------------------------------------------
    def entry(self, table: str, action: str, match: dict, params: dict) -> Entry:
        e = Entry(table, match, action, params)
        self.sw.insert(e)
        return e

    def install_forwarding(self) -> None:
        """Per host: forwarding to it and its source guard entry (it may send from its port)."""
        for h in self.hosts.values():
            self.entry(N.L2_FORWARD, N.FORWARD, {N.MF_DST_MAC: h.mac}, {"port": h.port})
            self.entry(N.SOURCES, N.ALLOW, {N.MF_INGRESS_PORT: h.port, N.MF_SRC_MAC: h.mac, N.MF_SRC_IP: h.ip}, {})
        self.entry(N.L2_FORWARD, N.FLOOD, {N.MF_DST_MAC: "ff:ff:ff:ff:ff:ff"}, {"group": N.FLOOD_GROUP})
        self.sw.insert_group(Group(N.FLOOD_GROUP, [(h.port, 0) for h in self.hosts.values()]))

    def install_job(self, job_id, workers, optimizer, slot_base, slots, epoch=1, chunks=0) -> Job:
        opt = self.hosts[optimizer]
        job = Job(job_id, list(workers), optimizer, slot_base, slots, epoch, N.job_group(job_id))
        job.entries.append(self.entry(
            N.JOBS, N.SET_JOB, {N.MF_JOB: job_id},
            {"slot_base": slot_base, "slot_count": slots, "workers": len(workers), "optimizer_port": opt.port,
             "optimizer_mac": opt.mac, "optimizer_ip": opt.ip, "mcast_group": job.group, "epoch": epoch,
             "chunks": chunks, "uplink": 0, "child_id": 0}))
        job.entries.append(self.entry(N.OPTIMIZERS, N.ADMIT, {N.MF_INGRESS_PORT: opt.port, N.MF_JOB: job_id}, {}))
        replicas = []
        for w, name in enumerate(workers):
            h = self.hosts[name]
            rid = N.worker_rid(job_id, w)
            job.entries.append(self.entry(
                N.WORKERS, N.ADMIT_WORKER, {N.MF_INGRESS_PORT: h.port, N.MF_JOB: job_id, N.MF_WORKER: w}, {}))
            job.entries.append(self.entry(N.PARAM_REWRITE, N.SET_WORKER_ADDRESS, {N.MF_EGRESS_RID: rid},
                                          {"mac": h.mac, "ip": h.ip}))
            replicas.append((h.port, rid))
        self.sw.insert_group(Group(job.group, replicas))
        return job

    def remove_job(self, job: Job) -> None:
        for e in reversed(job.entries):
            self.sw.delete(e)
        self.sw.delete_group(job.group)

    def counter(self, name: str, index: int) -> int:
        return self.sw.read_counter(name, index)[index][0]

    def drops(self, reason: str, job: int | None = None) -> int:
        row = N.NO_JOB_ROW if job is None else job
        return self.counter(N.DROPS, N.drop_cell(row, N.DropReason[reason]))

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
        self.tap.send(host, frame)

    def collect(self, n: int = 0, timeout: float = 10.0, grace: float = 0.25) -> dict[str, list[bytes]]:
        return self.tap.collect(n, timeout, grace)

    def drain(self) -> None:
        self.tap.drain()


def random_fp16(rng, n=K, subnormal_share=0.2):
    """Random finite fp16 values including subnormals, +-65504 and +-0."""
    v = rng.standard_normal(n) * rng.choice([1e-6, 1e-2, 1.0, 100.0], size=n)
    v = np.clip(v, -65504, 65504).astype(np.float16)
    sub = rng.random(n) < subnormal_share
    v[sub] = (rng.integers(-1023, 1024, size=sub.sum()) * 2.0**-24).astype(np.float16)
    return v


def param_frame(src: Host, values, *, kind: Kind = Kind.PARAM, **fields) -> bytes:
    """One frame from host `src` carrying len(values) / K chunks (to the broadcast address: the switch
    rewrites each replica's); `more` is chunks - 1 and `count` K unless given."""
    values = np.asarray(values, np.float16)
    fields.setdefault("more", values.size // K - 1)
    addrs = codec.Addresses(src.mac, "ff:ff:ff:ff:ff:ff", src.ip, "255.255.255.255")
    return codec.encode(kind, codec.header_array(1, **fields), values.reshape(1, -1), addrs, k=values.size)[0].tobytes()


def unchanged_but_addresses(out: bytes, sent: bytes) -> bool:
    """`out` is `sent` with only its destination MAC and IPv4 address (and so its IPv4 checksum) rewritten."""
    def kept(b: bytes) -> bytes:
        return b[6:24] + b[26:30] + b[34:]

    return len(out) == len(sent) and kept(out) == kept(sent)
