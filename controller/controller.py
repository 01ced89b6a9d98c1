"""The mindp controller: pipeline, forwarding, jobs, workers, slots, statistics.

It holds what the switch should contain (forwarding, jobs) and makes the switch
hold it: every change is a short ordered list of writes (controller.jobs.plan),
rolled back if one fails, so a failed request leaves nothing behind. A new
controller (or one whose switch restarted) learns the state from the switch
(`reconcile`) or gives the switch back what it lost (`restore`).
"""
from __future__ import annotations

import logging
import pathlib
from dataclasses import dataclass, replace
import time

from mindp.topology import JobSpec, Topology, TopologyError

from . import jobs as jobmodel
from . import p4info_names as n
from . import stats as statsmodel
from . import tree
from .tree import flood_group, forwarding_entries  # noqa: F401 (the controller's API)
from .jobs import AttachedHost, JobError, JobState, Rebuilt
from .model import Entry, Group, Op, OpKind, diff_entries, diff_group
from .p4runtime import (TLS, DEFAULT_GRPC_ADDR, EntryExists, EntryMissing, NoPipeline, SwitchConnection, SwitchError,
                        SwitchUnreachable, default_timeout, p4info_signature, pipeline_cookie)
from .slots import SlotPool

log = logging.getLogger("mindp.controller")


class ControllerError(RuntimeError):
    """A request the controller refused or could not complete; str() is one line."""


@dataclass(frozen=True)
class Deletion:
    """A deleted job, and the pieces of it that were already missing on the switch."""
    job: JobState
    missing: list[str]


class Controller:
    def __init__(self, grpc_addr: str = DEFAULT_GRPC_ADDR, device_id: int = 0,
                 election_id: tuple[int, int] = (0, 1), *, topology: Topology | None = None,
                 p4info_path: str | pathlib.Path | None = None, bmv2_json_path: str | pathlib.Path | None = None,
                 tls: TLS | None = None, timeout: float | None = None, reconnect_timeout: float = 20.0,
                 read_only: bool = False, switch: str | None = None):
        from p4src import artifacts

        self.grpc_addr = grpc_addr
        self.device_id = device_id
        self.election_id = tuple(election_id)
        self.p4info_path = pathlib.Path(p4info_path or artifacts.P4INFO)
        self.bmv2_json_path = pathlib.Path(bmv2_json_path or artifacts.BMV2_JSON)
        self.tls = tls
        self.read_only = read_only  # no arbitration: reads only, never competes with the primary
        self.timeout = default_timeout() if timeout is None else timeout  # $MINDP_CTL_TIMEOUT, else 3 s
        self.reconnect_timeout = reconnect_timeout
        self.topology = topology
        # Which switch of the topology this is (its first, the only one in the single-switch form).
        self.switch = switch or (topology.switches[0].name if topology else None)
        self.pool = SlotPool()
        self.jobs: dict[int, JobState] = {}
        self.forwarding: list[Entry] = []
        self.flood: Group | None = None
        self.last_rebuild: Rebuilt | None = None
        self._synced = False
        self.conn = self._connect()

    @classmethod
    def for_topology(cls, topology: Topology, switch: str | None = None, **kw) -> Controller:
        """Connect to the switch the topology names (gRPC address, device id): its only one, or `switch`."""
        spec = topology.switch_spec(switch) if switch else topology.switch
        kw.setdefault("grpc_addr", spec.grpc_addr)
        kw.setdefault("device_id", spec.device_id)
        return cls(topology=topology, switch=spec.name, **kw)

    def link_ports(self) -> frozenset[int]:
        """Ports to other switches of the tree (shared by every job); none on a single switch."""
        return tree.link_ports(self.topology, self.switch) if self.topology and self.topology.is_tree else frozenset()

    def _connect(self) -> SwitchConnection:
        return SwitchConnection(self.grpc_addr, self.device_id, self.election_id, p4info_path=self.p4info_path,
                                tls=self.tls, timeout=self.timeout, arbitrate=not self.read_only)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- connection and restarts ---------------------------------------------
    def reconnect(self, timeout: float | None = None) -> None:
        """A new session (the old one's stream died: the switch restarted or went away)."""
        self.conn.close()
        deadline = time.monotonic() + (self.reconnect_timeout if timeout is None else timeout)
        while True:
            try:
                self.conn = self._connect()
                return
            except SwitchUnreachable:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    def restore(self) -> list[str]:
        """Give the switch back what the controller knows and it lost; returns what was done."""
        done = []
        info, _ = self.conn.installed_pipeline()
        if info is None:
            self._push()
            done.append("pushed the pipeline")
            present_entries, present_groups = [], []
        else:
            self.conn.check_pipeline()
            present_entries, present_groups = self.conn.read_entries(), self._read_groups() or []
        have = {e.key() for e in present_entries}
        groups = {g.group_id for g in present_groups}
        ops = [Op(OpKind.INSERT, e) for e in self.forwarding if e.key() not in have]
        if self.flood and self.flood.group_id not in groups:
            ops.append(Op(OpKind.INSERT, self.flood))
        for job in self.jobs.values():
            ops += [op for op in jobmodel.plan(None, job)
                    if (isinstance(op.item, Group) and op.item.group_id not in groups)
                    or (isinstance(op.item, Entry) and op.item.key() not in have)]
        self._apply(ops, "restore")
        if ops:
            done.append(f"rewrote {len(ops)} entries and groups")
        return done

    def _ensure(self) -> None:
        """Before each request: if the switch went away, reconnect and restore it."""
        if self.conn.alive:
            return
        log.warning("P4Runtime stream to %s lost; reconnecting", self.grpc_addr)
        self.reconnect()
        for what in self.restore():
            log.warning("after reconnect: %s", what)

    # --- pipeline --------------------------------------------------------------
    def _push(self) -> int:
        return self.conn.push_pipeline(self.p4info_path, self.bmv2_json_path)

    def pipeline_installed(self) -> bool:
        """True if the switch runs exactly our compiled program (same P4Info, same cookie if it keeps one)."""
        info, cookie = self.conn.installed_pipeline()
        if info is None or p4info_signature(info) != p4info_signature(self.conn.p4info):
            return False
        return cookie in (0, pipeline_cookie(self.p4info_path, self.bmv2_json_path))

    def push(self, force: bool = False) -> bool:
        """Install our program unless the switch already runs it; `force` re-pushes,
        which clears every entry and group. Returns True if pushed."""
        self._ensure()
        if not force and self.pipeline_installed():
            return False
        if self.read_only:
            raise ControllerError("pipeline push: this controller is read-only")
        self._push()
        self.pool = SlotPool()
        self.jobs.clear()
        self.forwarding, self.flood = [], None
        self._synced = True
        return True

    # --- forwarding ------------------------------------------------------------
    def install_forwarding(self, topology: Topology | None = None) -> int:
        """Make l2_forward, the source guard (sources) and the flood group match the topology;
        returns the number of writes."""
        self._sync()
        topology = topology or self.topology
        if topology is None:
            raise ControllerError("install_forwarding needs a topology")
        self.topology = topology
        if self.switch is None or not any(sw.name == self.switch for sw in topology.switches):
            self.switch = topology.switches[0].name
        want, flood = tree.forwarding_entries(topology, self.switch), tree.flood_group(topology, self.switch)
        have = [e for table in n.FORWARDING_TABLES for e in self.conn.read_entries(table)]
        upserts, deletes = diff_entries(have, want)
        groups = self._read_groups()
        if groups is None:  # a target that cannot read groups: write it, as a modify if it exists
            try:
                self.conn.insert_group(flood)
            except EntryExists:
                self.conn.modify_group(flood)
            g_up = []
        else:
            g_up, _ = diff_group(next((g for g in groups if g.group_id == n.FLOOD_GROUP), None), flood)
        ops = [*g_up, *upserts, *deletes]
        self._apply(ops, "install forwarding")
        self.forwarding, self.flood = want, flood
        return len(ops)

    # --- state ------------------------------------------------------------------
    def _read_groups(self) -> list[Group] | None:
        """All multicast groups, or None where the target cannot read them back."""
        try:
            return self.conn.read_groups()
        except (NoPipeline, SwitchUnreachable):
            raise
        except SwitchError as exc:
            log.info("multicast groups not readable: %s", exc)
            return None

    def reconcile(self) -> Rebuilt:
        """Learn jobs, slots and forwarding from the switch; writes nothing."""
        self._ensure()
        self.conn.check_pipeline()
        entries = self.conn.read_entries()
        groups = self._read_groups()
        rebuilt = jobmodel.rebuild(entries, groups, self.topology)
        pool = SlotPool()
        for job in sorted(rebuilt.jobs.values(), key=lambda j: j.slot_base):
            try:
                pool.claim(job.job_id, job.slots)
            except ValueError as exc:
                rebuilt.problems.append(str(exc))
        self.pool = pool
        self.jobs = dict(rebuilt.jobs)
        self.forwarding = [e for e in entries if e.table in n.FORWARDING_TABLES]
        if groups is not None:
            self.flood = next((g for g in groups if g.group_id == n.FLOOD_GROUP), None)
        self.last_rebuild = rebuilt
        self._synced = True
        for p in rebuilt.problems:
            log.warning("reconcile: %s", p)
        return rebuilt

    def _sync(self) -> None:
        self._ensure()
        if not self._synced:
            self.reconcile()

    def job(self, job_id: int) -> JobState:
        self._sync()
        try:
            return self.jobs[job_id]
        except KeyError:
            raise ControllerError(f"unknown job {job_id}") from None

    # --- writes with rollback ---------------------------------------------------
    def _apply(self, ops: list[Op], what: str, missing_ok: bool = False) -> list[str]:
        """Apply in order, rolling back on a failure. With `missing_ok` a delete of something
        already gone is no failure; returns what was found missing that way."""
        if ops and self.read_only:
            raise ControllerError(f"{what}: this controller is read-only")
        done: list[Op] = []
        missing: list[str] = []
        for op in ops:
            try:
                self.conn.apply(op)
            except SwitchError as exc:
                if missing_ok and op.kind is OpKind.DELETE and isinstance(exc, EntryMissing):
                    missing.append(op.describe().removeprefix("delete "))
                    continue
                undo_errors = []
                for prev in reversed(done):
                    try:
                        self.conn.apply(prev.inverse())
                    except SwitchError as undo_exc:
                        undo_errors.append(str(undo_exc))
                note = f"rolled back {len(done)} writes" if not undo_errors else \
                    f"rollback of {len(done)} writes failed ({undo_errors[0]}): reconcile before retrying"
                raise type(exc)(f"{what}: {exc} ({note})") from None
            done.append(op)
        return missing

    # --- jobs ---------------------------------------------------------------------
    def _topology(self, topology: Topology | None) -> Topology:
        topology = topology or self.topology
        if topology is None:
            raise ControllerError("a topology is needed for host addresses")
        return topology

    def create_job(self, spec: JobSpec, topology: Topology | None = None) -> JobState:
        """Allocate slots and a never-reused epoch (the one after the switch's record of the
        last one handed out), install the job; all or nothing. In a tree (or with optimizer
        shards) the job is this switch's part of it (controller.tree.branch_job)."""
        self._sync()
        topology = self._topology(topology)
        self.switch = self.switch or topology.switches[0].name
        leftovers = jobmodel.orphan_plan(spec.job_id, self.last_rebuild) if self.last_rebuild else []
        try:
            last_epoch = self.conn.read_counter(n.EPOCH_GENERATION, 0)[0][0]
            if topology.is_tree or spec.sharded:
                job = self._new_branch(spec, topology, last_epoch)
            else:
                job = jobmodel.new_job(spec, topology, self.jobs, self.pool, last_epoch)
        except (JobError, ValueError) as exc:
            raise ControllerError(str(exc)) from None
        try:
            # Recorded on the switch before anything of the job is: a later create, by this
            # controller or another, never hands out this epoch again while the cells live.
            self.conn.write_counter(n.EPOCH_GENERATION, 0, job.epoch)
            self._apply(leftovers, f"cleanup of job {spec.job_id}'s leftovers")
            for name in n.JOB_COUNTERS:
                self.conn.reset_counter(name, job.job_id)
            for reason in n.DropReason:
                self.conn.reset_counter(n.DROPS, n.drop_cell(job.job_id, reason))
            self._apply(jobmodel.plan(None, job), f"create job {job.job_id}")
        except SwitchError:
            self.pool.release(job.job_id)
            raise
        if self.last_rebuild:
            self.last_rebuild.orphans = [e for e in self.last_rebuild.orphans if e not in [op.item for op in leftovers]]
            self.last_rebuild.orphan_groups = [g for g in self.last_rebuild.orphan_groups
                                               if n.group_job(g.group_id) != spec.job_id]
        self.jobs[job.job_id] = job
        return job

    def _new_branch(self, spec: JobSpec, topology: Topology, last_epoch: int) -> JobState:
        """This switch's part of a tree job, checked, with its slots (recorded in the pool) and epoch."""
        if not 0 <= spec.job_id < n.MAX_JOBS:
            raise JobError(f"job id {spec.job_id} outside 0..{n.MAX_JOBS - 1}")
        if spec.job_id in self.jobs:
            raise JobError(f"job {spec.job_id} already exists")
        job = tree.branch_job(topology, spec, self.switch)
        jobmodel.check_job(job, self.jobs, self.link_ports())
        epoch = jobmodel.next_epoch(last_epoch, {j.epoch for j in self.jobs.values()})
        return replace(job, slots=self.pool.allocate(spec.job_id, spec.slots), epoch=epoch)

    def delete_job(self, job_id: int) -> Deletion:
        """Remove every entry and the group of a job; its slots are free at once. Pieces already
        missing on the switch (e.g. its multicast group) are no error: the deletion lists them."""
        job = self.job(job_id)
        leftovers = jobmodel.orphan_plan(job_id, self.last_rebuild) if self.last_rebuild else []
        missing = self._apply([*jobmodel.plan(job, None), *leftovers], f"delete job {job_id}", missing_ok=True)
        for what in missing:
            log.info("delete job %d: %s was already missing", job_id, what)
        if leftovers and self.last_rebuild:
            gone = [op.item for op in leftovers]
            self.last_rebuild.orphans = [e for e in self.last_rebuild.orphans if e not in gone]
            self.last_rebuild.orphan_groups = [g for g in self.last_rebuild.orphan_groups if g not in gone]
        del self.jobs[job_id]
        self.pool.release(job_id)
        return Deletion(job, missing)

    def _endpoint(self, where: str | AttachedHost | object, topology: Topology | None) -> AttachedHost:
        if isinstance(where, AttachedHost):
            return where
        if hasattr(where, "mac") and hasattr(where, "port"):  # a mindp.topology.Host
            return AttachedHost.of(where)
        try:
            return AttachedHost.of(self._topology(topology).host(str(where)))
        except TopologyError as exc:
            raise ControllerError(str(exc)) from None

    def _change_workers(self, job: JobState, workers: dict[int, AttachedHost], what: str) -> JobState:
        try:
            new = jobmodel.changed_workers(job, workers, self.jobs, self.link_ports())
        except JobError as exc:
            raise ControllerError(str(exc)) from None
        self._apply(jobmodel.plan(job, new), what)
        self.jobs[job.job_id] = new
        return new

    def replace_worker(self, job_id: int, worker: int, where, topology: Topology | None = None) -> JobState:
        """The same worker id on another port or host (e.g. a restarted worker elsewhere)."""
        job = self.job(job_id)
        if worker not in job.workers:
            raise ControllerError(f"job {job_id} has no worker {worker}")
        ep = self._endpoint(where, topology)
        return self._change_workers(job, {**job.workers, worker: ep}, f"replace worker {worker} of job {job_id}")

    def add_worker(self, job_id: int, worker: int, where, topology: Topology | None = None) -> JobState:
        """A new worker between steps: membership, rewrite, group, then the worker count."""
        job = self.job(job_id)
        if worker in job.workers:
            raise ControllerError(f"job {job_id} already has worker {worker}")
        ep = self._endpoint(where, topology)
        return self._change_workers(job, {**job.workers, worker: ep}, f"add worker {worker} to job {job_id}")

    def remove_worker(self, job_id: int, worker: int) -> JobState:
        """Drop a worker between steps: the worker count first, then its group replica and entries."""
        job = self.job(job_id)
        if worker not in job.workers:
            raise ControllerError(f"job {job_id} has no worker {worker}")
        rest = {w: e for w, e in job.workers.items() if w != worker}
        return self._change_workers(job, rest, f"remove worker {worker} from job {job_id}")

    # --- statistics -----------------------------------------------------------------
    def check_switch(self, timeout: float) -> None:
        """One small read that the switch must answer within `timeout` s (a hung switch raises
        SwitchError naming DEADLINE_EXCEEDED; a dead one SwitchUnreachable)."""
        self._ensure()
        self.conn.read_counter(n.EPOCH_GENERATION, 0, timeout=timeout)

    def drop_cells(self, job_ids, timeout: float) -> dict[int, tuple[int, int]]:
        """The DROPS counter's cells of the jobs' rows, in one read within `timeout` s
        (statsmodel.job_drops: per job and reason). Without reconnecting first: a switch that went
        away fails it at once (a reconnect would wait up to a minute for the switch)."""
        cells = [n.drop_cell(j, r) for j in sorted(job_ids) for r in n.DropReason]
        return self.conn.read_counter_cells(n.DROPS, cells, timeout=timeout)

    def job_drops(self, job_ids, timeout: float) -> dict[int, dict[str, int]]:
        """Each job's drops by reason, read now (what a run reads after each step)."""
        return statsmodel.job_drops([self.drop_cells(job_ids, timeout)], job_ids)

    def stats(self, job_ids=None) -> statsmodel.Snapshot:
        """Counters per job (all known jobs unless given), read now."""
        self._sync()
        cells = {name: self.conn.read_counter(name) for name in statsmodel.COUNTERS}
        return statsmodel.snapshot(cells, time.time(), self.jobs if job_ids is None else job_ids)
