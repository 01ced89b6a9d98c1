"""One controller for a tree of switches: a `Controller` (one P4Runtime session) per switch.

Every switch runs the same pipeline; a job is installed on each switch it touches as that
switch's part (controller.tree.branch_job): the root first, so that the partial sums the
leaves send up find their job there, and removed leaves first. docs/SCALE.md.
"""
from __future__ import annotations

import contextlib
import logging

from mindp.topology import JobSpec, Topology, TopologyError

from . import stats as statsmodel
from . import tree
from .controller import Controller, ControllerError, Deletion
from .jobs import JobState, Rebuilt
from .p4runtime import SwitchError, SwitchUnreachable

log = logging.getLogger("mindp.controller")


class TreeController:
    def __init__(self, topology: Topology, skip_unreachable: bool = False, **kw):
        """`kw` as for `Controller` (election_id, p4info_path, bmv2_json_path, tls, timeout, read_only).
        With `skip_unreachable` a switch that does not answer is left out (`unreachable` says why)."""
        self.topology = topology
        self.switches: dict[str, Controller] = {}
        self.unreachable: dict[str, str] = {}
        try:
            for spec in topology.switches:
                try:
                    self.switches[spec.name] = Controller.for_topology(topology, spec.name, **kw)
                except SwitchUnreachable as exc:
                    if not skip_unreachable:
                        raise type(exc)(f"switch {spec.name}: {exc}") from None
                    self.unreachable[spec.name] = str(exc)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for ctl in self.switches.values():
            with contextlib.suppress(Exception):
                ctl.close()

    def __enter__(self) -> TreeController:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def check_switch(self, timeout: float) -> None:
        """Every switch answers a small read within `timeout` s (Controller.check_switch), naming the one that does not."""
        for name, ctl in self.switches.items():
            try:
                ctl.check_switch(timeout)
            except SwitchError as exc:
                raise type(exc)(f"switch {name}: {exc}") from None

    def push(self, force: bool = False) -> dict[str, bool]:
        """The same program on every switch (each skipped if it already runs it, unless `force`)."""
        return {name: ctl.push(force) for name, ctl in self.switches.items()}

    def install_forwarding(self) -> dict[str, int]:
        return {name: ctl.install_forwarding(self.topology) for name, ctl in self.switches.items()}

    def _order(self, spec: JobSpec) -> list[str]:
        """The job's switches, root first, then by depth below it."""
        try:
            branches = self.topology.branches(spec)
        except TopologyError as exc:
            raise ControllerError(str(exc)) from None
        depth: dict[str, int] = {}

        def level(s: str) -> int:
            if s not in depth:
                p = branches[s].parent
                depth[s] = 0 if p is None else level(p) + 1
            return depth[s]

        return sorted(branches, key=lambda s: (level(s), s))

    def create_job(self, spec: JobSpec) -> dict[str, JobState]:
        """The job on every switch it touches; all or nothing (switches done are undone)."""
        done: dict[str, JobState] = {}
        try:
            for name in self._order(spec):
                done[name] = self.switches[name].create_job(spec, self.topology)
        except (ControllerError, SwitchError) as exc:
            for name in reversed(list(done)):
                try:
                    self.switches[name].delete_job(spec.job_id)
                except (ControllerError, SwitchError) as undo:
                    log.warning("undo of job %d on %s failed: %s", spec.job_id, name, undo)
            where = next((n for n in self._order(spec) if n not in done), "?")
            raise type(exc)(f"switch {where}: {exc}" + (f" (undone on {', '.join(done)})" if done else "")) from None
        return done

    def delete_job(self, job_id: int) -> dict[str, Deletion]:
        """The job from every switch that holds it, leaves first."""
        holders = [name for name, jobs in self.jobs().items() if job_id in jobs]
        if not holders:
            raise ControllerError(f"unknown job {job_id} (on no switch of the tree)")
        holders.sort(key=lambda s: self.switches[s].jobs[job_id].uplink is None)
        return {name: self.switches[name].delete_job(job_id) for name in holders}

    def reconcile(self) -> dict[str, Rebuilt]:
        return {name: ctl.reconcile() for name, ctl in self.switches.items()}

    def jobs(self) -> dict[str, dict[int, JobState]]:
        """Per switch, the jobs it holds (learned from it once, then kept current)."""
        out = {}
        for name, ctl in self.switches.items():
            ctl._sync()
            out[name] = dict(ctl.jobs)
        return out

    def job_drops(self, job_ids, timeout: float) -> dict[int, dict[str, int]]:
        """Each job's drops by reason summed over every switch, each read within `timeout` s."""
        cells = []
        for name, ctl in self.switches.items():
            try:
                cells.append(ctl.drop_cells(job_ids, timeout))
            except SwitchError as exc:
                raise type(exc)(f"switch {name}: {exc}") from None
        return statsmodel.job_drops(cells, job_ids)

    def stats(self) -> dict[str, statsmodel.Snapshot]:
        return {name: ctl.stats() for name, ctl in self.switches.items()}

    def view(self) -> dict:
        """controller.tree.view of what every switch holds now (a switch that cannot be read is
        shown unreachable, with the reason as its problem)."""
        jobs: dict[str, dict[int, JobState]] = {}
        counters: dict[str, dict[int, dict]] = {}
        problems: dict[str, list[str]] = {name: [why] for name, why in self.unreachable.items()}
        for name, ctl in self.switches.items():
            try:
                rebuilt = ctl.reconcile()
                snap = ctl.stats()
            except (ControllerError, SwitchError) as exc:
                problems[name] = [str(exc)]
                continue
            jobs[name] = dict(ctl.jobs)
            counters[name] = {j: c.values() for j, c in snap.jobs.items()}
            problems[name] = list(rebuilt.problems)
        return tree.view(self.topology, jobs, counters, problems)
