"""Jobs as data: the state of a job, the entries and group that express it on
the switch, the ordered changes between two states, and the reverse: jobs
rebuilt from what a switch holds (reconcile).

Pure logic, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from mindp.topology import Host, JobSpec, Topology, TopologyError, valid_ipv4, valid_mac

from . import p4info_names as n
from .model import Entry, Group, Op, OpKind, diff_entries, diff_group
from .slots import SlotPool, SlotRange


class JobError(ValueError):
    """A job request that cannot be satisfied; the message says why."""


@dataclass(frozen=True)
class AttachedHost:
    """Where a worker or optimizer node is: its switch port and addresses."""
    port: int
    mac: str
    ip: str
    host: str | None = None  # host name when known (not stored on the switch)

    @classmethod
    def of(cls, host: Host) -> AttachedHost:
        return cls(host.port, host.mac, host.ip, host.name)

    def label(self) -> str:
        return self.host or self.mac

    def to_dict(self) -> dict:
        return {"host": self.host, "port": self.port, "mac": self.mac, "ip": self.ip}


@dataclass(frozen=True)
class Shard:
    """One optimizer node of a sharded job: it owns chunks lo..hi (inclusive).

    On the switch that attaches the nodes (a single switch, or the spine), a completed
    sum for a chunk in [lo, hi] goes to `node`, and a parameter chunk in [lo, hi] is
    admitted only from `node`'s port.
    """
    lo: int
    hi: int
    node: AttachedHost

    def to_dict(self) -> dict:
        return {"lo": self.lo, "hi": self.hi, "node": self.node.to_dict()}


@dataclass(frozen=True)
class JobState:
    """A job as ONE switch holds it, whatever that switch's role in the tree.

    - Single switch (the default): `workers` are worker hosts, `optimizer` the node,
      `uplink` None, `shards` () or the nodes owning chunk ranges.
    - Leaf (`uplink` set): `workers` are this leaf's worker hosts; completed cells go
      up as PARTIAL frames (worker field = `child_id`, this leaf's index at its parent)
      out of `uplink.port`, addressed to `uplink.mac`/`uplink.ip` (the node's addresses);
      PARAM frames are admitted from `uplink.port` and multicast to the workers.
      `optimizer` is informational here (the switch stores only the uplink; `rebuild`
      returns optimizer == uplink), and a leaf has no shards.
    - Parent/spine: `workers` maps each child switch's child_id to the port towards
      it (mac/ip: any valid address; PARAM replicas to it are rewritten to them), so
      the job's worker count is the number of children; `optimizer`/`shards` as for a
      single switch. Its SUMs carry nworkers = the gradients they contain.

    Members are worker hosts (they send GRAD) or, those in `children`, child switches
    (they send PARTIAL, of at most `children[id]` gradients: the workers beneath them);
    the switch admits each only in its role. A parent may have both.

    `entries()` and `mcast_group()` are everything the switch needs for the job;
    `plan(old, new)` orders the writes.
    """
    job_id: int
    slots: SlotRange
    epoch: int
    workers: dict[int, AttachedHost]
    optimizer: AttachedHost
    chunks: int = 0  # chunks per step, 0: not known (the switch then does not bound the chunk index)
    uplink: AttachedHost | None = None  # a leaf's port to its parent, with the node's mac/ip
    child_id: int = 0  # a leaf's index at its parent (PARTIAL worker field), 0..MAX_WORKERS-1
    shards: tuple[Shard, ...] = ()  # contiguous chunk ranges -> node, sorted by lo
    children: dict[int, int] = field(default_factory=dict)  # member id of a child switch -> workers beneath it

    @property
    def group(self) -> int:
        return n.job_group(self.job_id)

    @property
    def slot_base(self) -> int:
        return self.slots.base

    @property
    def slot_count(self) -> int:
        return self.slots.count

    @property
    def endpoint(self) -> AttachedHost:
        """Where completed cells go: the uplink at a leaf, else the (default) optimizer node."""
        return self.uplink or self.optimizer

    def rid(self, worker: int) -> int:
        return n.worker_rid(self.job_id, worker)

    @property
    def rids(self) -> dict[int, int]:
        return {w: self.rid(w) for w in sorted(self.workers)}

    def node_ports(self) -> list[int]:
        """Ports a PARAM of the job may come from (admission): the endpoint's and every shard node's."""
        return sorted({self.endpoint.port} | {s.node.port for s in self.shards})

    def ports(self) -> set[int]:
        return {e.port for e in self.workers.values()} | set(self.node_ports())

    def with_workers(self, workers: dict[int, AttachedHost]) -> JobState:
        """The job with these members; those of its child switches still among them stay child switches."""
        children = {c: m for c, m in sorted(self.children.items()) if c in workers}
        return replace(self, workers=dict(sorted(workers.items())), children=children)

    def member_entry(self, member: int) -> Entry:
        """The member's admission: a worker host, or a child switch with the bound on its PARTIALs' nworkers."""
        match = {n.MF_INGRESS_PORT: self.workers[member].port, n.MF_JOB: self.job_id, n.MF_WORKER: member}
        if member in self.children:
            return Entry(n.WORKERS, match, n.ADMIT_CHILD, {"max_nworkers": self.children[member]})
        return Entry(n.WORKERS, match, n.ADMIT_WORKER)

    def job_entry(self) -> Entry:
        end = self.endpoint
        return Entry(n.JOBS, {n.MF_JOB: self.job_id}, n.SET_JOB, {
            "slot_base": self.slots.base, "slot_count": self.slots.count, "workers": len(self.workers),
            "optimizer_port": end.port, "optimizer_mac": end.mac, "optimizer_ip": end.ip,
            "mcast_group": self.group, "epoch": self.epoch, "chunks": self.chunks,
            "uplink": int(self.uplink is not None), "child_id": self.child_id,
        })

    def shard_entries(self) -> list[Entry]:
        return [Entry(n.SHARDS, {n.MF_JOB: self.job_id, n.MF_CHUNK: (s.lo, s.hi)}, n.TO_SHARD,
                      {"port": s.node.port, "mac": s.node.mac, "ip": s.node.ip, "hi": s.hi}, n.SHARD_PRIORITY)
                for s in self.shards]

    def member_entries(self) -> list[Entry]:
        """Everything but the job entry: membership, node admission, shard routes, egress rewrite."""
        out = [Entry(n.OPTIMIZERS, {n.MF_INGRESS_PORT: p, n.MF_JOB: self.job_id}, n.ADMIT) for p in self.node_ports()]
        out += self.shard_entries()
        for w, e in sorted(self.workers.items()):
            out.append(self.member_entry(w))
            out.append(Entry(n.PARAM_REWRITE, {n.MF_EGRESS_RID: self.rid(w)}, n.SET_WORKER_ADDRESS,
                             {"mac": e.mac, "ip": e.ip}))
        return out

    def entries(self) -> list[Entry]:
        return [*self.member_entries(), self.job_entry()]

    def mcast_group(self) -> Group:
        return Group(self.group, [(e.port, self.rid(w)) for w, e in self.workers.items()])

    def _role(self, member: int) -> dict:
        if member in self.children:
            return {"role": "child", "max_nworkers": self.children[member]}
        return {"role": "worker"}

    def to_dict(self) -> dict:
        out = {
            "job_id": self.job_id, "slot_base": self.slots.base, "slots": self.slots.count, "epoch": self.epoch,
            "chunks": self.chunks, "mcast_group": self.group, "optimizer": self.optimizer.to_dict(),
            "workers": {str(w): {**e.to_dict(), "rid": self.rid(w), **self._role(w)}
                        for w, e in sorted(self.workers.items())},
        }
        if self.uplink is not None:
            out["uplink"] = self.uplink.to_dict()
            out["child_id"] = self.child_id
        if self.shards:
            out["shards"] = [s.to_dict() for s in self.shards]
        return out


def check_tree(job: JobState) -> None:
    """A job's tree role is consistent: child id in range, child switches among the members with a
    16-bit positive bound, shards contiguous and disjoint, none at a leaf."""
    for c, bound in sorted(job.children.items()):
        if c not in job.workers:
            raise JobError(f"job {job.job_id}: child switch {c} is not a member")
        if not 1 <= bound < 1 << 16:
            raise JobError(f"job {job.job_id}: child switch {c} has {bound} workers beneath it, not 1..65535")
    if not 0 <= job.child_id < n.MAX_WORKERS:
        raise JobError(f"job {job.job_id}: child id {job.child_id} outside 0..{n.MAX_WORKERS - 1}")
    if job.uplink is None and job.child_id:
        raise JobError(f"job {job.job_id}: a child id without an uplink")
    if not job.shards:
        return
    if job.uplink is not None:
        raise JobError(f"job {job.job_id}: a leaf (with an uplink) routes no shards; its parent does")
    if len(job.shards) > n.MAX_SHARDS:
        raise JobError(f"job {job.job_id}: {len(job.shards)} shards, at most {n.MAX_SHARDS}")
    prev = -1
    for s in job.shards:
        if not prev < s.lo <= s.hi < 1 << 32:
            raise JobError(f"job {job.job_id}: shard chunks {s.lo}..{s.hi} not ascending, disjoint and 32-bit")
        prev = s.hi
    if job.chunks and job.shards[-1].hi != job.chunks - 1 or job.shards[0].lo != 0:
        raise JobError(f"job {job.job_id}: shards cover {job.shards[0].lo}..{job.shards[-1].hi}, "
                       f"not every chunk 0..{job.chunks - 1 if job.chunks else 'N'}")
    for a, b in zip(job.shards, job.shards[1:]):
        if a.hi + 1 != b.lo:
            raise JobError(f"job {job.job_id}: shards leave chunks {a.hi + 1}..{b.lo - 1} without a node")


def plan(old: JobState | None, new: JobState | None) -> list[Op]:
    """Ordered writes turning `old` into `new` (None: no job).

    The job entry is the switch: membership and rewrites first, then the group,
    then the job entry (insert/modify/delete), and only then what is removed.
    So a new job is admitted only once it is complete, and a deleted one stops
    being admitted before its membership goes.
    """
    member_up, member_down = diff_entries(old.member_entries() if old else [], new.member_entries() if new else [])
    job_up, job_down = diff_entries([old.job_entry()] if old else [], [new.job_entry()] if new else [])
    group_up, group_down = diff_group(old.mcast_group() if old else None, new.mcast_group() if new else None)
    return [*member_up, *group_up, *job_up, *job_down, *group_down, *member_down]


def next_epoch(last: int, live: set[int]) -> int:
    """The epoch after `last` (1..65535, cycling, never 0) that no live job uses.

    `last` is the switch's own record of the last epoch handed out (read back from it,
    docs/CONTROLLER.md), so an epoch comes round again only after 65535 creations.
    """
    if len(live - {0}) >= 0xFFFF:
        raise JobError("no free epoch left")
    epoch = last & 0xFFFF
    while True:
        epoch = epoch % 0xFFFF + 1
        if epoch not in live:
            return epoch


def endpoints_for(spec: JobSpec, topology: Topology) -> tuple[dict[int, AttachedHost], AttachedHost]:
    try:
        spec.check()
        workers = {w: AttachedHost.of(topology.host(h)) for w, h in sorted(spec.workers.items())}
        optimizer = AttachedHost.of(topology.host(spec.optimizer))
    except TopologyError as exc:
        raise JobError(str(exc)) from None
    return workers, optimizer


def check_ports(job_id: int, workers: dict[int, AttachedHost], optimizer: AttachedHost, others: dict[int, JobState],
                link_ports: frozenset[int] = frozenset(), extra: tuple[tuple[str, AttachedHost], ...] = ()) -> None:
    """Within a job every member has its own port; across jobs no port is shared (isolation),
    except `link_ports`: ports to other switches, which every job of a tree uses. `extra` are
    further (label, host) pairs of the job (shard nodes)."""
    seen: dict[int, str] = {}
    for label, e in [*((f"worker {w}", e) for w, e in sorted(workers.items())), ("optimizer", optimizer), *extra]:
        if not 1 <= e.port <= n.MAX_PORT:
            raise JobError(f"job {job_id}: {label} port {e.port} outside 1..{n.MAX_PORT}")
        if not valid_mac(e.mac):
            raise JobError(f"job {job_id}: {label} has a bad MAC {e.mac!r} (expected 02:00:00:00:00:01 form)")
        if not valid_ipv4(e.ip):
            raise JobError(f"job {job_id}: {label} has a bad IPv4 address {e.ip!r}")
        if e.port in seen and not (label.startswith("shard") and seen[e.port].startswith(("optimizer", "shard"))):
            raise JobError(f"job {job_id}: {label} and {seen[e.port]} share port {e.port}")
        seen.setdefault(e.port, label)
    for other in others.values():
        if other.job_id == job_id:
            continue
        shared = sorted((set(seen) & other.ports()) - link_ports)
        if shared:
            raise JobError(f"port {shared[0]} is already owned by job {other.job_id}")
    bad = [w for w in workers if not 0 <= w < n.MAX_WORKERS]
    if bad:
        raise JobError(f"job {job_id}: worker ids {bad} outside 0..{n.MAX_WORKERS - 1}")


def check_job(job: JobState, others: dict[int, JobState], link_ports: frozenset[int] = frozenset()) -> None:
    """Validate a job as one switch of a tree holds it (built by the caller, e.g. from a leaf-spine
    topology): ports and addresses as `check_ports` (the uplink and child-switch ports belong in
    `link_ports`), child id, shard ranges. Raises JobError."""
    if not job.workers:
        raise JobError(f"job {job.job_id} would have no members")
    extra = tuple((f"shard {s.lo}..{s.hi}", s.node) for s in job.shards)
    check_ports(job.job_id, job.workers, job.endpoint, others, link_ports, extra)
    check_tree(job)


def new_job(spec: JobSpec, topology: Topology, jobs: dict[int, JobState], pool: SlotPool,
            last_epoch: int) -> JobState:
    """Validate a job request and allocate its slots and epoch (recorded in `pool`)."""
    if not 0 <= spec.job_id < n.MAX_JOBS:
        raise JobError(f"job id {spec.job_id} outside 0..{n.MAX_JOBS - 1}")
    if spec.job_id in jobs:
        raise JobError(f"job {spec.job_id} already exists")
    workers, optimizer = endpoints_for(spec, topology)
    check_ports(spec.job_id, workers, optimizer, jobs)
    epoch = next_epoch(last_epoch, {j.epoch for j in jobs.values()})
    slots = pool.allocate(spec.job_id, spec.slots)
    return JobState(spec.job_id, slots, epoch, workers, optimizer, spec.chunks)


def changed_workers(job: JobState, workers: dict[int, AttachedHost], jobs: dict[int, JobState],
                    link_ports: frozenset[int] = frozenset()) -> JobState:
    """The job with a new worker set (or child switches, at a parent), checked like a new job (ports, ids)."""
    if not workers:
        raise JobError(f"job {job.job_id} would have no workers")
    new = job.with_workers(workers)
    check_job(new, jobs, link_ports)
    return new


# --- reconcile: jobs back from the switch's entries ------------------------------


@dataclass
class Rebuilt:
    """What a switch's entries say: jobs, entries belonging to no job, inconsistencies."""
    jobs: dict[int, JobState] = field(default_factory=dict)
    orphans: list[Entry] = field(default_factory=list)
    orphan_groups: list[Group] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def rebuild(entries: list[Entry], groups: list[Group] | None, topology: Topology | None = None) -> Rebuilt:
    """Jobs from the switch's table entries (and groups, when the target can read them).

    The tables alone determine a job: slots, epoch, optimizer (or uplink and child id,
    at a leaf) from the job entry, worker (or child switch) ports and roles from membership,
    their addresses from the rewrites, shards from the shards table.
    Anything left over or inconsistent is reported, never guessed at.
    """
    out = Rebuilt()
    by_mac = {h.mac: h.name for h in topology.hosts.values()} if topology else {}
    job_entries = {int(e.match[n.MF_JOB]): e for e in entries if e.table == n.JOBS}
    members: dict[int, dict[int, Entry]] = {}
    rewrites: dict[int, Entry] = {}
    optimizers: dict[int, dict[int, Entry]] = {}
    shards: dict[int, list[Entry]] = {}
    for e in entries:
        if e.table == n.WORKERS:
            members.setdefault(int(e.match[n.MF_JOB]), {})[int(e.match[n.MF_WORKER])] = e
        elif e.table == n.PARAM_REWRITE:
            rewrites[int(e.match[n.MF_EGRESS_RID])] = e
        elif e.table == n.OPTIMIZERS:
            optimizers.setdefault(int(e.match[n.MF_JOB]), {})[int(e.match[n.MF_INGRESS_PORT])] = e
        elif e.table == n.SHARDS:
            shards.setdefault(int(e.match[n.MF_JOB]), []).append(e)
    used_rewrites: set[int] = set()
    for job_id, je in sorted(job_entries.items()):
        p = je.params
        workers, children = {}, {}
        for w, me in sorted(members.pop(job_id, {}).items()):
            rid = n.worker_rid(job_id, w)
            rw = rewrites.get(rid)
            if rw is None:
                out.problems.append(f"job {job_id} worker {w}: no egress rewrite for rid {rid}")
                out.orphans.append(me)
                continue
            used_rewrites.add(rid)
            if me.action == n.ADMIT_CHILD:
                children[w] = int(me.params["max_nworkers"])
            mac = str(rw.params["mac"])
            workers[w] = AttachedHost(int(me.match[n.MF_INGRESS_PORT]), mac, str(rw.params["ip"]), by_mac.get(mac))
        opt_mac = str(p["optimizer_mac"])
        optimizer = AttachedHost(int(p["optimizer_port"]), opt_mac, str(p["optimizer_ip"]), by_mac.get(opt_mac))
        job_shards = []
        for se in sorted(shards.pop(job_id, []), key=lambda e: e.match[n.MF_CHUNK]):
            lo, hi = se.match[n.MF_CHUNK]
            if int(se.params.get("hi", -1)) != int(hi):
                out.problems.append(f"job {job_id}: shard {lo}..{hi} bounds multi-chunk PARAMs at {se.params['hi']}")
            mac = str(se.params["mac"])
            job_shards.append(Shard(int(lo), int(hi), AttachedHost(int(se.params["port"]), mac, str(se.params["ip"]),
                                                                  by_mac.get(mac))))
        uplink = optimizer if int(p.get("uplink", 0)) else None
        job = JobState(job_id, SlotRange(int(p["slot_base"]), int(p["slot_count"])), int(p["epoch"]), workers, optimizer,
                       int(p.get("chunks", 0)), uplink, int(p.get("child_id", 0)), tuple(job_shards), children)
        admitted = optimizers.pop(job_id, {})
        if sorted(admitted) != job.node_ports():
            out.problems.append(f"job {job_id}: node admission on ports {sorted(admitted)}, expected {job.node_ports()}")
            out.orphans.extend(oe for port, oe in sorted(admitted.items()) if port not in job.node_ports())
        if int(p["workers"]) != len(workers):
            out.problems.append(f"job {job_id}: job entry counts {p['workers']} workers, membership has {len(workers)}")
        if int(p["mcast_group"]) != job.group:
            out.problems.append(f"job {job_id}: multicast group {p['mcast_group']}, expected {job.group}")
        out.jobs[job_id] = job
    for job_id, ms in members.items():
        out.orphans.extend(ms.values())
        out.problems.append(f"membership for job {job_id}, which has no job entry")
    for job_id, oes in optimizers.items():
        out.orphans.extend(oes.values())
        out.problems.append(f"optimizer admission for job {job_id}, which has no job entry")
    for job_id, ses in shards.items():
        out.orphans.extend(ses)
        out.problems.append(f"shard routes for job {job_id}, which has no job entry")
    for rid, rw in rewrites.items():
        if rid not in used_rewrites:
            out.orphans.append(rw)
            out.problems.append(f"egress rewrite for rid {rid} belongs to no registered worker")
    if groups is not None:
        by_id = {g.group_id: g for g in groups}
        for job in out.jobs.values():
            g = by_id.pop(job.group, None)
            if g is None:
                out.problems.append(f"job {job.job_id}: multicast group {job.group} missing")
            elif g.replicas != job.mcast_group().replicas:
                out.problems.append(f"job {job.job_id}: multicast group {job.group} replicas differ from membership")
        out.orphan_groups = [g for gid, g in sorted(by_id.items()) if n.group_job(gid) is not None]
        for g in out.orphan_groups:
            out.problems.append(f"multicast group {g.group_id} belongs to no job")
    return out


def orphan_plan(job_id: int, rebuilt: Rebuilt) -> list[Op]:
    """Deletes for leftovers of `job_id` that belong to no complete job (e.g. a crashed create)."""
    ops = []
    for e in rebuilt.orphans:
        mjob = e.match.get(n.MF_JOB)
        rid_owner = n.rid_worker(int(e.match[n.MF_EGRESS_RID])) if e.table == n.PARAM_REWRITE else None
        if mjob == job_id or (rid_owner and rid_owner[0] == job_id):
            ops.append(Op(OpKind.DELETE, e))
    ops += [Op(OpKind.DELETE, g) for g in rebuilt.orphan_groups if n.group_job(g.group_id) == job_id]
    return ops
