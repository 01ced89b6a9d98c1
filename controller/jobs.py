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
class JobState:
    job_id: int
    slots: SlotRange
    epoch: int
    workers: dict[int, AttachedHost]
    optimizer: AttachedHost
    chunks: int = 0  # chunks per step, 0: not known (the switch then does not bound the chunk index)

    @property
    def group(self) -> int:
        return n.job_group(self.job_id)

    @property
    def slot_base(self) -> int:
        return self.slots.base

    @property
    def slot_count(self) -> int:
        return self.slots.count

    def rid(self, worker: int) -> int:
        return n.worker_rid(self.job_id, worker)

    @property
    def rids(self) -> dict[int, int]:
        return {w: self.rid(w) for w in sorted(self.workers)}

    def ports(self) -> set[int]:
        return {e.port for e in self.workers.values()} | {self.optimizer.port}

    def with_workers(self, workers: dict[int, AttachedHost]) -> JobState:
        return replace(self, workers=dict(sorted(workers.items())))

    def job_entry(self) -> Entry:
        opt = self.optimizer
        return Entry(n.JOBS, {n.MF_JOB: self.job_id}, n.SET_JOB, {
            "slot_base": self.slots.base, "slot_count": self.slots.count, "workers": len(self.workers),
            "optimizer_port": opt.port, "optimizer_mac": opt.mac, "optimizer_ip": opt.ip,
            "mcast_group": self.group, "epoch": self.epoch, "chunks": self.chunks,
        })

    def member_entries(self) -> list[Entry]:
        """Everything but the job entry: membership, optimizer admission, egress rewrite."""
        out = [Entry(n.OPTIMIZERS, {n.MF_INGRESS_PORT: self.optimizer.port, n.MF_JOB: self.job_id}, n.ADMIT)]
        for w, e in sorted(self.workers.items()):
            out.append(Entry(n.WORKERS, {n.MF_INGRESS_PORT: e.port, n.MF_JOB: self.job_id, n.MF_WORKER: w}, n.ADMIT))
            out.append(Entry(n.PARAM_REWRITE, {n.MF_EGRESS_RID: self.rid(w)}, n.SET_WORKER_ADDRESS,
                             {"mac": e.mac, "ip": e.ip}))
        return out

    def entries(self) -> list[Entry]:
        return [*self.member_entries(), self.job_entry()]

    def mcast_group(self) -> Group:
        return Group(self.group, [(e.port, self.rid(w)) for w, e in self.workers.items()])

    def to_dict(self) -> dict:
        return {
            "job_id": self.job_id, "slot_base": self.slots.base, "slots": self.slots.count, "epoch": self.epoch,
            "chunks": self.chunks, "mcast_group": self.group, "optimizer": self.optimizer.to_dict(),
            "workers": {str(w): {**e.to_dict(), "rid": self.rid(w)} for w, e in sorted(self.workers.items())},
        }


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


def check_ports(job_id: int, workers: dict[int, AttachedHost], optimizer: AttachedHost, others: dict[int, JobState]) -> None:
    """Within a job every member has its own port; across jobs no port is shared (isolation)."""
    seen: dict[int, str] = {}
    for label, e in [*((f"worker {w}", e) for w, e in sorted(workers.items())), ("optimizer", optimizer)]:
        if not 1 <= e.port <= n.MAX_PORT:
            raise JobError(f"job {job_id}: {label} port {e.port} outside 1..{n.MAX_PORT}")
        if not valid_mac(e.mac):
            raise JobError(f"job {job_id}: {label} has a bad MAC {e.mac!r} (expected 02:00:00:00:00:01 form)")
        if not valid_ipv4(e.ip):
            raise JobError(f"job {job_id}: {label} has a bad IPv4 address {e.ip!r}")
        if e.port in seen:
            raise JobError(f"job {job_id}: {label} and {seen[e.port]} share port {e.port}")
        seen[e.port] = label
    for other in others.values():
        if other.job_id == job_id:
            continue
        shared = sorted(set(seen) & other.ports())
        if shared:
            raise JobError(f"port {shared[0]} is already owned by job {other.job_id}")
    bad = [w for w in workers if not 0 <= w < n.MAX_WORKERS]
    if bad:
        raise JobError(f"job {job_id}: worker ids {bad} outside 0..{n.MAX_WORKERS - 1}")


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


def changed_workers(job: JobState, workers: dict[int, AttachedHost], jobs: dict[int, JobState]) -> JobState:
    """The job with a new worker set, checked like a new job (ports, ids)."""
    if not workers:
        raise JobError(f"job {job.job_id} would have no workers")
    check_ports(job.job_id, workers, job.optimizer, jobs)
    return job.with_workers(workers)


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

    The tables alone determine a job: slots, epoch and optimizer from the job
    entry, worker ports from membership, worker addresses from the rewrites.
    Anything left over or inconsistent is reported, never guessed at.
    """
    out = Rebuilt()
    by_mac = {h.mac: h.name for h in topology.hosts.values()} if topology else {}
    job_entries = {int(e.match[n.MF_JOB]): e for e in entries if e.table == n.JOBS}
    members: dict[int, dict[int, Entry]] = {}
    rewrites: dict[int, Entry] = {}
    optimizers: dict[int, Entry] = {}
    for e in entries:
        if e.table == n.WORKERS:
            members.setdefault(int(e.match[n.MF_JOB]), {})[int(e.match[n.MF_WORKER])] = e
        elif e.table == n.PARAM_REWRITE:
            rewrites[int(e.match[n.MF_EGRESS_RID])] = e
        elif e.table == n.OPTIMIZERS:
            optimizers[int(e.match[n.MF_JOB])] = e
    used_rewrites: set[int] = set()
    for job_id, je in sorted(job_entries.items()):
        p = je.params
        workers = {}
        for w, me in sorted(members.pop(job_id, {}).items()):
            rid = n.worker_rid(job_id, w)
            rw = rewrites.get(rid)
            if rw is None:
                out.problems.append(f"job {job_id} worker {w}: no egress rewrite for rid {rid}")
                out.orphans.append(me)
                continue
            used_rewrites.add(rid)
            mac = str(rw.params["mac"])
            workers[w] = AttachedHost(int(me.match[n.MF_INGRESS_PORT]), mac, str(rw.params["ip"]), by_mac.get(mac))
        opt_mac = str(p["optimizer_mac"])
        optimizer = AttachedHost(int(p["optimizer_port"]), opt_mac, str(p["optimizer_ip"]), by_mac.get(opt_mac))
        job = JobState(job_id, SlotRange(int(p["slot_base"]), int(p["slot_count"])), int(p["epoch"]), workers, optimizer,
                       int(p.get("chunks", 0)))
        oe = optimizers.pop(job_id, None)
        if oe is None or int(oe.match[n.MF_INGRESS_PORT]) != optimizer.port:
            out.problems.append(f"job {job_id}: optimizer admission does not match port {optimizer.port}")
            if oe is not None:
                out.orphans.append(oe)
        if int(p["workers"]) != len(workers):
            out.problems.append(f"job {job_id}: job entry counts {p['workers']} workers, membership has {len(workers)}")
        if int(p["mcast_group"]) != job.group:
            out.problems.append(f"job {job_id}: multicast group {p['mcast_group']}, expected {job.group}")
        out.jobs[job_id] = job
    for job_id, ms in members.items():
        out.orphans.extend(ms.values())
        out.problems.append(f"membership for job {job_id}, which has no job entry")
    for job_id, oe in optimizers.items():
        out.orphans.append(oe)
        out.problems.append(f"optimizer admission for job {job_id}, which has no job entry")
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
