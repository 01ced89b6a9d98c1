"""Topology and jobs as data: the one description that Mininet, the controller,
the agents and the tests all read.

JSON form (`mindp.topology.star([2]).dump(path)` writes a full example):

    {"switch": {"name": "s1", "grpc_addr": "127.0.0.1:9559", "device_id": 0},
     "hosts": {"w0": {"mac": "02:00:00:00:00:01", "ip": "10.0.0.1", "port": 1}, ...},
     "jobs": [{"job_id": 1, "workers": {"0": "w0", "1": "w1"}, "optimizer": "opt1", "slots": 64}]}

A job may also give "chunks", its chunk count: the switch then drops gradients for
chunks beyond it (0 or absent: not known).
"""
from __future__ import annotations

import ipaddress
import json
import pathlib
import re
from dataclasses import dataclass, field

from .protocol import MAX_WORKERS
from .switch_constants import MAX_JOB_ID, MAX_PORT

_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


class TopologyError(ValueError):
    """A topology or job description that cannot be used; the message says why."""


def valid_mac(text: str) -> bool:
    """Six lower-case hex pairs separated by colons, as the topology and the controller write MACs."""
    return bool(_MAC.match(text))


def valid_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Host:
    name: str
    mac: str
    ip: str
    port: int  # the switch port the host is attached to


@dataclass(frozen=True)
class SwitchSpec:
    name: str = "s1"
    grpc_addr: str = "127.0.0.1:9559"
    device_id: int = 0


@dataclass(frozen=True)
class JobSpec:
    job_id: int
    workers: dict[int, str]  # worker id -> host name
    optimizer: str  # host name of the optimizer node
    slots: int = 64
    chunks: int = 0  # chunks per step, if known: the switch bounds gradients' chunk index by it

    @property
    def n_workers(self) -> int:
        return len(self.workers)

    def to_dict(self) -> dict:
        out = {
            "job_id": self.job_id,
            "workers": {str(w): h for w, h in sorted(self.workers.items())},
            "optimizer": self.optimizer,
            "slots": self.slots,
        }
        if self.chunks:
            out["chunks"] = self.chunks
        return out

    @classmethod
    def from_dict(cls, d: dict) -> JobSpec:
        try:
            workers = {int(w): str(h) for w, h in dict(d["workers"]).items()}
            spec = cls(int(d["job_id"]), workers, str(d["optimizer"]), int(d.get("slots", 64)),
                       int(d.get("chunks", 0)))
        except KeyError as exc:
            raise TopologyError(f"malformed job description: {exc.args[0]!r} missing") from None
        except (TypeError, ValueError, AttributeError) as exc:
            raise TopologyError(f"malformed job description: {exc}") from None
        spec.check()
        return spec

    def check(self) -> None:
        if not 0 <= self.job_id <= MAX_JOB_ID:
            raise TopologyError(f"job id {self.job_id} outside 0..{MAX_JOB_ID}")
        if not self.workers:
            raise TopologyError(f"job {self.job_id} has no workers")
        bad = [w for w in self.workers if not 0 <= w < MAX_WORKERS]
        if bad:
            raise TopologyError(f"job {self.job_id}: worker ids {bad} outside 0..{MAX_WORKERS - 1}")
        if self.slots < 1:
            raise TopologyError(f"job {self.job_id}: slots must be >= 1")
        if not 0 <= self.chunks < 1 << 32:
            raise TopologyError(f"job {self.job_id}: chunks must be 0 (not known) or a 32-bit count")


@dataclass(frozen=True)
class Topology:
    switch: SwitchSpec
    hosts: dict[str, Host]
    jobs: list[JobSpec] = field(default_factory=list)

    def check(self) -> None:
        for attr in ("mac", "ip", "port"):
            seen: dict = {}
            for h in self.hosts.values():
                key = getattr(h, attr)
                if key in seen:
                    raise TopologyError(f"hosts {seen[key]} and {h.name} share {attr} {key}")
                seen[key] = h.name
        for h in self.hosts.values():
            if not valid_mac(h.mac):
                raise TopologyError(f"host {h.name}: bad MAC {h.mac!r}")
            if not valid_ipv4(h.ip):
                raise TopologyError(f"host {h.name}: bad IPv4 address {h.ip!r}")
            if not 1 <= h.port <= MAX_PORT:
                raise TopologyError(f"host {h.name}: port {h.port} outside 1..{MAX_PORT}")
        ids = set()
        for job in self.jobs:
            job.check()
            if job.job_id in ids:
                raise TopologyError(f"job id {job.job_id} used twice")
            ids.add(job.job_id)
            for name in [*job.workers.values(), job.optimizer]:
                if name not in self.hosts:
                    raise TopologyError(f"job {job.job_id} names unknown host {name!r}")

    def job(self, job_id: int) -> JobSpec:
        """The job with this id, or a TopologyError naming the ids there are."""
        for job in self.jobs:
            if job.job_id == job_id:
                return job
        have = ", ".join(str(j.job_id) for j in self.jobs) or "none"
        raise TopologyError(f"job {job_id} is not in the topology (jobs: {have})")

    def host(self, name: str) -> Host:
        try:
            return self.hosts[name]
        except KeyError:
            raise TopologyError(f"unknown host {name!r}") from None

    def to_dict(self) -> dict:
        return {
            "switch": vars(self.switch).copy(),
            "hosts": {n: {"mac": h.mac, "ip": h.ip, "port": h.port} for n, h in self.hosts.items()},
            "jobs": [j.to_dict() for j in self.jobs],
        }

    @classmethod
    def from_dict(cls, d: dict) -> Topology:
        try:
            switch = SwitchSpec(**d.get("switch", {}))
            hosts = {
                str(n): Host(str(n), str(h["mac"]).lower(), str(h["ip"]), int(h["port"]))
                for n, h in dict(d["hosts"]).items()
            }
            jobs = [JobSpec.from_dict(j) for j in d.get("jobs", [])]
        except TopologyError:
            raise
        except KeyError as exc:
            raise TopologyError(f"malformed topology: {exc.args[0]!r} missing") from None
        except (TypeError, ValueError, AttributeError) as exc:
            raise TopologyError(f"malformed topology: {exc}") from None
        topo = cls(switch, hosts, jobs)
        topo.check()
        return topo

    @classmethod
    def load(cls, path: str | pathlib.Path) -> Topology:
        try:
            data = json.loads(pathlib.Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise TopologyError(f"cannot read topology {path}: {exc}") from None
        return cls.from_dict(data)

    def dump(self, path: str | pathlib.Path) -> None:
        pathlib.Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")


def host_addresses(index: int) -> tuple[str, str]:
    """MAC and IP of the index-th host (1-based) in generated topologies."""
    return f"02:00:00:00:{index >> 8:02x}:{index & 0xFF:02x}", f"10.0.{index >> 8}.{index & 0xFF}"


def star(workers_per_job: list[int], slots: int = 64, grpc_addr: str = "127.0.0.1:9559") -> Topology:
    """One switch; for each job j (ids 1, 2, ...) its workers and one optimizer node.

    Hosts are named w<j>_<i> and opt<j>; ports are numbered from 1 in that order.
    """
    hosts: dict[str, Host] = {}
    jobs = []
    port = 0
    for j, n in enumerate(workers_per_job, start=1):
        names = {}
        for i in range(n):
            port += 1
            name = f"w{j}_{i}"
            mac, ip = host_addresses(port)
            hosts[name] = Host(name, mac, ip, port)
            names[i] = name
        port += 1
        mac, ip = host_addresses(port)
        hosts[f"opt{j}"] = Host(f"opt{j}", mac, ip, port)
        jobs.append(JobSpec(j, names, f"opt{j}", slots))
    topo = Topology(SwitchSpec(grpc_addr=grpc_addr), hosts, jobs)
    topo.check()
    return topo
