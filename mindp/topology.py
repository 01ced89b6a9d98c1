"""Topology and jobs as data: the one description that Mininet, the controller,
the agents and the tests all read.

Single-switch JSON form (`mindp.topology.star([2]).dump(path)` writes a full example):

    {"switch": {"name": "s1", "grpc_addr": "127.0.0.1:9559", "device_id": 0},
     "hosts": {"w0": {"mac": "02:00:00:00:00:01", "ip": "10.0.0.1", "port": 1}, ...},
     "jobs": [{"job_id": 1, "workers": {"0": "w0", "1": "w1"}, "optimizer": "opt1", "slots": 64}]}

A job may also give "chunks", its chunk count: the switch then drops gradients for
chunks beyond it (0 or absent: not known).

Tree form (`mindp.topology.leafspine(2, 2, 2)` builds one; docs/SCALE.md): a
"switches" list instead of "switch", "links" between switch ports, and each host
names its "switch"; its "port" is a port of that switch:

    {"switches": [{"name": "spine", "grpc_addr": "127.0.0.1:9559", "device_id": 0, "thrift_port": 9090},
                  {"name": "leaf1", ...}, ...],
     "links": [{"a": "leaf1", "a_port": 3, "b": "spine", "b_port": 1}, ...],
     "hosts": {"w1_0": {"mac": ..., "ip": ..., "switch": "leaf1", "port": 1}, ...},
     "jobs": [{"job_id": 1, "workers": {...}, "optimizer": ["opt1_0", "opt1_1"], "chunks": 160}]}

A job's "optimizer" may be a list of hosts: optimizer shards, each owning one of
the job's chunk ranges (contiguous, equal up to one chunk, in list order); a
sharded job must give "chunks". The links form a tree; a job's optimizer shards
sit on one switch, the job's root, and every other switch on a path from a worker
to it aggregates its part and sends it up (`Topology.branches`).
"""
from __future__ import annotations

import ipaddress
import json
import pathlib
import re
from dataclasses import dataclass, field

from .layout import shard_ranges
from .protocol import MAX_WORKERS
from .switch_constants import MAX_JOB_ID, MAX_PORT, MAX_SHARDS

_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,7}$")  # short: Mininet interface names carry it


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
    switch: str = ""  # the switch's name; "" in the single-switch form: the topology's one switch


@dataclass(frozen=True)
class SwitchSpec:
    name: str = "s1"
    grpc_addr: str = "127.0.0.1:9559"
    device_id: int = 0
    thrift_port: int | None = None  # the switch's Thrift runtime port, when the topology fixes it

    def to_dict(self) -> dict:
        out = {"name": self.name, "grpc_addr": self.grpc_addr, "device_id": self.device_id}
        if self.thrift_port is not None:
            out["thrift_port"] = self.thrift_port
        return out


@dataclass(frozen=True)
class Link:
    """A cable between two switch ports."""
    a: str
    a_port: int
    b: str
    b_port: int

    def to_dict(self) -> dict:
        return {"a": self.a, "a_port": self.a_port, "b": self.b, "b_port": self.b_port}

    def end(self, switch: str) -> tuple[int, str, int]:
        """(this switch's port, the other switch, its port)."""
        return (self.a_port, self.b, self.b_port) if switch == self.a else (self.b_port, self.a, self.a_port)


@dataclass(frozen=True)
class JobSpec:
    job_id: int
    workers: dict[int, str]  # worker id -> host name
    optimizer: str | tuple[str, ...]  # host name of the optimizer node, or the hosts of its shards in order
    slots: int = 64
    chunks: int = 0  # chunks per step, if known: the switch bounds gradients' chunk index by it

    def __post_init__(self):
        if isinstance(self.optimizer, list):
            object.__setattr__(self, "optimizer", tuple(self.optimizer))

    @property
    def n_workers(self) -> int:
        return len(self.workers)

    @property
    def optimizers(self) -> tuple[str, ...]:
        """The optimizer node hosts: one, or the shards in chunk order."""
        return self.optimizer if isinstance(self.optimizer, tuple) else (self.optimizer,)

    @property
    def sharded(self) -> bool:
        return isinstance(self.optimizer, tuple)

    def shard_ranges(self) -> list[tuple[int, int, str]]:
        """(lo, hi, host) per optimizer node: contiguous inclusive chunk ranges in list order,
        sizes differing by at most one. One unsharded node owns every chunk (hi: the last
        known chunk, or 2**32 - 1 when the count is not known)."""
        hosts = self.optimizers
        if not self.sharded:
            return [(0, (self.chunks or 1 << 32) - 1, hosts[0])]
        if self.chunks < len(hosts):
            raise TopologyError(f"job {self.job_id}: {len(hosts)} optimizer shards need \"chunks\" "
                                f">= {len(hosts)} (got {self.chunks})")
        return [(lo, hi, h) for (lo, hi), h in zip(shard_ranges(self.chunks, len(hosts)), hosts)]

    def to_dict(self) -> dict:
        out = {
            "job_id": self.job_id,
            "workers": {str(w): h for w, h in sorted(self.workers.items())},
            "optimizer": list(self.optimizer) if self.sharded else self.optimizer,
            "slots": self.slots,
        }
        if self.chunks:
            out["chunks"] = self.chunks
        return out

    @classmethod
    def from_dict(cls, d: dict) -> JobSpec:
        try:
            workers = {int(w): str(h) for w, h in dict(d["workers"]).items()}
            opt = d["optimizer"]
            optimizer = tuple(str(h) for h in opt) if isinstance(opt, list) else str(opt)
            spec = cls(int(d["job_id"]), workers, optimizer, int(d.get("slots", 64)), int(d.get("chunks", 0)))
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
        opts = self.optimizers
        if not opts or not 1 <= len(opts) <= MAX_SHARDS:
            raise TopologyError(f"job {self.job_id}: 1..{MAX_SHARDS} optimizer nodes, got {len(opts)}")
        if len(set(opts)) != len(opts):
            raise TopologyError(f"job {self.job_id}: an optimizer host is listed twice")
        if self.sharded:
            self.shard_ranges()


@dataclass(frozen=True)
class JobBranch:
    """A job's part on one switch of the tree: who its members are and where its result goes.

    At the job's root (`parent` None) the result is the sum for the optimizer node(s);
    elsewhere it is a partial sum sent up `uplink_port`, as member `child_id` of the parent.
    """
    switch: str
    workers: dict[int, str]  # worker id -> host name, the workers attached to this switch
    children: dict[int, tuple[str, int]]  # child id -> (child switch, this switch's port to it)
    parent: str | None = None
    uplink_port: int = 0  # this switch's port to the parent
    parent_port: int = 0  # the parent's port to this switch
    child_id: int = 0  # this switch's member id at the parent


@dataclass(frozen=True)
class Topology:
    switches: tuple[SwitchSpec, ...]
    hosts: dict[str, Host]
    jobs: list[JobSpec] = field(default_factory=list)
    links: tuple[Link, ...] = ()

    @property
    def is_tree(self) -> bool:
        return len(self.switches) > 1

    @property
    def switch(self) -> SwitchSpec:
        """The one switch of a single-switch topology."""
        if len(self.switches) != 1:
            names = ", ".join(s.name for s in self.switches)
            raise TopologyError(f"the topology has {len(self.switches)} switches ({names}): name one")
        return self.switches[0]

    def switch_spec(self, name: str) -> SwitchSpec:
        for s in self.switches:
            if s.name == name:
                return s
        raise TopologyError(f"unknown switch {name!r} (switches: {', '.join(s.name for s in self.switches)})")

    def switch_of(self, host: Host) -> str:
        return host.switch or self.switches[0].name

    def hosts_on(self, switch: str) -> list[Host]:
        return sorted((h for h in self.hosts.values() if self.switch_of(h) == switch), key=lambda h: h.port)

    def neighbours(self, switch: str) -> list[tuple[int, str, int]]:
        """(port on `switch`, the switch behind it, that switch's port) for every link of `switch`."""
        return sorted(link.end(switch) for link in self.links if switch in (link.a, link.b))

    def toward(self, switch: str, target: str) -> int:
        """The port of `switch` on the tree path to switch `target` (0: it is `target`)."""
        if switch == target:
            return 0
        return self._parents(target)[switch][1]

    def _parents(self, root: str) -> dict[str, tuple[str, int, int] | None]:
        """Per switch, (parent, own port to it, parent's port) in the tree rooted at `root`."""
        out: dict[str, tuple[str, int, int] | None] = {root: None}
        todo = [root]
        while todo:
            s = todo.pop()
            for port, peer, peer_port in self.neighbours(s):
                if peer not in out:
                    out[peer] = (s, peer_port, port)
                    todo.append(peer)
        return out

    def job_root(self, job: JobSpec) -> str:
        return self.switch_of(self.host(job.optimizers[0]))

    def branches(self, job: JobSpec) -> dict[str, JobBranch]:
        """The job's branch on every switch it touches: those on a path from a worker to its root.

        Child ids at a switch are the lowest ids its own workers do not use, given to the
        child switches in the order of the port leading to them.
        """
        root = self.job_root(job)
        parents = self._parents(root)
        local: dict[str, dict[int, str]] = {}
        for w, name in sorted(job.workers.items()):
            local.setdefault(self.switch_of(self.host(name)), {})[w] = name
        used = {root} | set(local)
        for s in list(local):
            while parents[s] is not None:
                s = parents[s][0]
                used.add(s)
        children: dict[str, dict[int, tuple[str, int]]] = {s: {} for s in used}
        child_id: dict[str, int] = {}
        for s in sorted(used, key=lambda s: (parents[s] or ("", 0, 0))[2]):
            if parents[s] is None:
                continue
            parent, _, parent_port = parents[s]
            taken = set(local.get(parent, {})) | set(children[parent])
            cid = next(i for i in range(MAX_WORKERS + len(taken) + 1) if i not in taken)
            if cid >= MAX_WORKERS:
                raise TopologyError(f"job {job.job_id}: switch {parent} would have more than {MAX_WORKERS} members")
            children[parent][cid] = (s, parent_port)
            child_id[s] = cid
        out = {}
        for s in sorted(used):
            p = parents[s]
            out[s] = JobBranch(s, local.get(s, {}), dict(sorted(children[s].items())),
                               p[0] if p else None, p[1] if p else 0, p[2] if p else 0, child_id.get(s, 0))
        return out

    def shard_ranges(self, job: JobSpec | int) -> list[tuple[int, int, str]]:
        """(lo, hi, host) per optimizer node of the job (see JobSpec.shard_ranges)."""
        return (self.job(job) if isinstance(job, int) else job).shard_ranges()

    def check(self) -> None:
        if not self.switches:
            raise TopologyError("the topology has no switch")
        names = set()
        for s in self.switches:
            if self.is_tree and not _NAME.match(s.name):
                raise TopologyError(f"switch name {s.name!r}: 1..8 letters, digits or '_', starting with a letter")
            if s.name in names:
                raise TopologyError(f"switch name {s.name!r} used twice")
            names.add(s.name)
        for attr in ("grpc_addr", "thrift_port"):
            seen: dict = {}
            for s in self.switches:
                key = getattr(s, attr)
                if key is not None and key in seen:
                    raise TopologyError(f"switches {seen[key]} and {s.name} share {attr} {key}")
                seen[key] = s.name
        for attr in ("mac", "ip", "name"):
            seen = {}
            for h in self.hosts.values():
                key = getattr(h, attr)
                if key in seen:
                    raise TopologyError(f"hosts {seen[key]} and {h.name} share {attr} {key}")
                seen[key] = h.name
        ports: dict[tuple[str, int], str] = {}

        def take(switch: str, port: int, what: str) -> None:
            if not 1 <= port <= MAX_PORT:
                raise TopologyError(f"{what}: port {port} outside 1..{MAX_PORT}")
            if (switch, port) in ports:
                raise TopologyError(f"{what} and {ports[switch, port]} share port {port} of switch {switch}")
            ports[switch, port] = what

        for h in self.hosts.values():
            if not valid_mac(h.mac):
                raise TopologyError(f"host {h.name}: bad MAC {h.mac!r}")
            if not valid_ipv4(h.ip):
                raise TopologyError(f"host {h.name}: bad IPv4 address {h.ip!r}")
            if h.switch and h.switch not in names:
                raise TopologyError(f"host {h.name}: unknown switch {h.switch!r}")
            if not h.switch and self.is_tree:
                raise TopologyError(f"host {h.name}: no \"switch\" (the topology has {len(self.switches)})")
            take(self.switch_of(h), h.port, f"host {h.name}")
        for link in self.links:
            for s in (link.a, link.b):
                if s not in names:
                    raise TopologyError(f"link {link.a}-{link.b}: unknown switch {s!r}")
            if link.a == link.b:
                raise TopologyError(f"link {link.a}-{link.b}: a switch linked to itself")
            take(link.a, link.a_port, f"link {link.a}-{link.b}")
            take(link.b, link.b_port, f"link {link.a}-{link.b}")
        if self.switches:
            reached = self._parents(self.switches[0].name)
            if len(self.links) != len(self.switches) - 1 or len(reached) != len(self.switches):
                raise TopologyError(f"the links must join the {len(self.switches)} switches in a tree "
                                    f"({len(self.links)} links, {len(reached)} switches reachable from "
                                    f"{self.switches[0].name})")
        ids = set()
        for job in self.jobs:
            job.check()
            if job.job_id in ids:
                raise TopologyError(f"job id {job.job_id} used twice")
            ids.add(job.job_id)
            for name in [*job.workers.values(), *job.optimizers]:
                if name not in self.hosts:
                    raise TopologyError(f"job {job.job_id} names unknown host {name!r}")
            roots = {self.switch_of(self.hosts[h]) for h in job.optimizers}
            if len(roots) > 1:
                raise TopologyError(f"job {job.job_id}: its optimizer shards sit on different switches "
                                    f"({', '.join(sorted(roots))}); they must share one")
            self.branches(job)

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
        def host(h: Host) -> dict:
            out = {"mac": h.mac, "ip": h.ip, "port": h.port}
            if self.is_tree:
                out["switch"] = self.switch_of(h)
            return out

        out: dict = {"switch": self.switches[0].to_dict()} if not self.is_tree else {
            "switches": [s.to_dict() for s in self.switches], "links": [link.to_dict() for link in self.links]}
        out["hosts"] = {n: host(h) for n, h in self.hosts.items()}
        out["jobs"] = [j.to_dict() for j in self.jobs]
        return out

    @classmethod
    def from_dict(cls, d: dict) -> Topology:
        try:
            if "switches" in d and "switch" in d:
                raise TopologyError("give \"switch\" (one) or \"switches\" (a tree), not both")
            switches = tuple(SwitchSpec(**s) for s in d["switches"]) if "switches" in d else \
                (SwitchSpec(**d.get("switch", {})),)
            links = tuple(Link(str(x["a"]), int(x["a_port"]), str(x["b"]), int(x["b_port"])) for x in d.get("links", []))
            hosts = {
                str(n): Host(str(n), str(h["mac"]).lower(), str(h["ip"]), int(h["port"]), str(h.get("switch", "")))
                for n, h in dict(d["hosts"]).items()
            }
            jobs = [JobSpec.from_dict(j) for j in d.get("jobs", [])]
        except TopologyError:
            raise
        except KeyError as exc:
            raise TopologyError(f"malformed topology: {exc.args[0]!r} missing") from None
        except (TypeError, ValueError, AttributeError) as exc:
            raise TopologyError(f"malformed topology: {exc}") from None
        topo = cls(switches, hosts, jobs, links)
        topo.check()
        return topo

    @classmethod
    def load(cls, path: str | pathlib.Path) -> Topology:
        try:
            data = json.loads(pathlib.Path(path).read_text(), object_pairs_hook=_unique_keys)
        except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
            raise TopologyError(f"cannot read topology {path}: {exc}") from None
        return cls.from_dict(data)

    def dump(self, path: str | pathlib.Path) -> None:
        pathlib.Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")


def _unique_keys(pairs: list) -> dict:
    """A JSON object in which a key repeats (e.g. worker id "0" twice) is refused: json keeps only
    the last, so a job would silently lose a worker."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} given twice in one object")
        out[key] = value
    return out


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
    topo = Topology((SwitchSpec(grpc_addr=grpc_addr),), hosts, jobs)
    topo.check()
    return topo


def leafspine(leaves: int, workers_per_leaf: int, optimizers: int = 1, *, chunks: int = 0, slots: int = 64,
              grpc_port: int = 9559, thrift_port: int = 9090, host: str = "127.0.0.1") -> Topology:
    """A two-level tree for one job (id 1): `spine` and `leaf1`..`leaf<L>`.

    Leaf i has workers w1_<k> for k = (i-1)*W .. i*W-1 on its ports 1..W and its uplink on
    port W+1, cabled to spine port i; the optimizer node(s) sit on spine ports L+1..L+M
    (`opt1`, or shards `opt1_0`..). Switches listed spine first take gRPC and Thrift
    ports from `grpc_port` and `thrift_port` up, device ids from 0. A sharded job needs
    its chunk count (`chunks`).
    """
    if leaves < 1 or workers_per_leaf < 1 or optimizers < 1:
        raise TopologyError("a leaf-spine needs at least one leaf, one worker per leaf and one optimizer node")
    if leaves > MAX_WORKERS:
        raise TopologyError(f"the spine has room for {MAX_WORKERS} leaves (got {leaves})")
    names = ["spine", *(f"leaf{i}" for i in range(1, leaves + 1))]
    switches = tuple(SwitchSpec(n, f"{host}:{grpc_port + i}", i, thrift_port + i) for i, n in enumerate(names))
    hosts: dict[str, Host] = {}
    links = []
    workers: dict[int, str] = {}
    index = 0
    for i in range(1, leaves + 1):
        for k in range(workers_per_leaf):
            w = (i - 1) * workers_per_leaf + k
            index += 1
            mac, ip = host_addresses(index)
            hosts[f"w1_{w}"] = Host(f"w1_{w}", mac, ip, k + 1, f"leaf{i}")
            workers[w] = f"w1_{w}"
        links.append(Link(f"leaf{i}", workers_per_leaf + 1, "spine", i))
    opts = []
    for s in range(optimizers):
        index += 1
        name = "opt1" if optimizers == 1 else f"opt1_{s}"
        mac, ip = host_addresses(index)
        hosts[name] = Host(name, mac, ip, leaves + 1 + s, "spine")
        opts.append(name)
    job = JobSpec(1, workers, opts[0] if optimizers == 1 else tuple(opts), slots, chunks)
    topo = Topology(switches, hosts, [job], tuple(links))
    topo.check()
    return topo
