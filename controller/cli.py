"""mindp-ctl: the controller from the console.

    mindp-ctl [--grpc-addr A] [--topology topo.json] [--json] COMMAND ...

Every invocation connects, learns the switch's state (reconcile) and does one
thing; errors are one line on stderr and a non-zero exit. Global options may
also follow the command (`mindp-ctl stats --watch --json`). Commands that only
read (jobs list/show, slots, stats, tables) do not arbitrate, so they work next
to another primary controller; the others become primary with --election-id
(default 0,1); the shell is read-only while another controller is primary.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

# Errors reach the user as one line from us; gRPC's C core would add its own log lines on
# stderr (seen: a background thread's "pthread_create failed" racing the shell's exec).
# GRPC_VERBOSITY=info (or debug) in the environment brings them back.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

from mindp import interrupts  # noqa: E402
from mindp.topology import JobSpec, Topology, TopologyError  # noqa: E402

from . import p4info_names as n  # noqa: E402
from . import digests, stats as statsmodel  # noqa: E402
from .cliargs import DEFAULT_ELECTION_ID, DEFAULT_THRIFT_PORT, parser  # noqa: E402
from .controller import Controller, ControllerError  # noqa: E402
from .jobs import AttachedHost, JobError, JobState  # noqa: E402
from .p4runtime import (DEFAULT_GRPC_ADDR, TLS, ElectionIdInUse, PipelineMismatch, SwitchConnection,  # noqa: E402
                        SwitchError, default_timeout, election_text)
from .slots import SlotError  # noqa: E402

EXIT_ERROR = 1


class UsageError(ValueError):
    pass


# --- output -------------------------------------------------------------------


def table(rows: list[list], header: list[str]) -> str:
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def emit(args, data, text: str) -> None:
    print(json.dumps(data, indent=2, sort_keys=False) if args.json else text)


def job_summary(job: JobState) -> list:
    return [job.job_id, len(job.workers), f"{job.slot_base}..{job.slots.end - 1}", job.slot_count,
            job.epoch, job.group, f"{job.optimizer.label()} (port {job.optimizer.port})"]


JOB_HEADER = ["job", "workers", "slots", "count", "epoch", "group", "optimizer"]


def job_detail(job: JobState) -> str:
    head = (f"job {job.job_id}: slots {job.slot_base}..{job.slots.end - 1} ({job.slot_count}), epoch {job.epoch}, "
            f"multicast group {job.group}\noptimizer {job.optimizer.label()}: port {job.optimizer.port}, "
            f"{job.optimizer.mac}, {job.optimizer.ip}\n")
    rows = [[w, e.host or "-", e.port, e.mac, e.ip, job.rid(w),
             f"child switch, <= {job.children[w]} workers" if w in job.children else "worker"]
            for w, e in sorted(job.workers.items())]
    return head + table(rows, ["worker", "host", "port", "mac", "ip", "rid", "role"])


def load_topology(args) -> Topology | None:
    return Topology.load(args.topology) if args.topology else None


def tls_of(args) -> TLS | None:
    return TLS(args.cacert, args.cert, args.key) if (args.cacert or args.cert or args.key) else None


def one_switch(args, topo: Topology | None):
    """The topology's switch this command talks to: --switch, or its only one (None: no topology)."""
    if topo is None:
        if args.switch:
            raise UsageError("--switch needs --topology")
        return None
    if args.switch:
        return topo.switch_spec(args.switch)
    if topo.is_tree:
        names = ", ".join(s.name for s in topo.switches)
        raise UsageError(f"the topology has {len(topo.switches)} switches ({names}): give --switch NAME "
                         "(push, jobs create/delete and topo act on all of them)")
    return topo.switch


def connect(args, topo: Topology | None) -> Controller:
    spec = one_switch(args, topo)
    addr = args.grpc_addr or (spec.grpc_addr if spec else DEFAULT_GRPC_ADDR)
    dev = args.device_id if args.device_id is not None else (spec.device_id if spec else 0)
    return Controller(addr, dev, args.election_id or DEFAULT_ELECTION_ID, topology=topo, p4info_path=args.p4info,
                      bmv2_json_path=args.bmv2_json, tls=tls_of(args), timeout=args.timeout, read_only=read_only(args),
                      switch=spec.name if spec else None)


def tree_command(args, topo: Topology | None) -> bool:
    """Commands that act on every switch of a tree topology when no --switch picks one."""
    if topo is None or not topo.is_tree or args.switch:
        return False
    return args.cmd in ("push", "topo") or (args.cmd == "jobs" and args.sub in ("create", "delete"))


def connect_tree(args, topo: Topology, skip_unreachable: bool = False):
    from .treectl import TreeController

    if args.grpc_addr or args.device_id is not None:
        raise UsageError("--grpc-addr/--device-id name one switch: the tree's come from --topology")
    return TreeController(topo, skip_unreachable, election_id=args.election_id or DEFAULT_ELECTION_ID,
                          p4info_path=args.p4info, bmv2_json_path=args.bmv2_json, tls=tls_of(args),
                          timeout=args.timeout, read_only=read_only(args))


def read_only(args) -> bool:
    """Commands that only read need no P4Runtime session, so they never disturb the primary
    (e.g. `stats --watch` next to the controller of `make run`)."""
    return args.cmd in ("slots", "stats", "tables", "cells", "topo") or (args.cmd == "jobs" and args.sub in ("list", "show"))


def check_usage(args, topo: Topology | None) -> None:
    """Refuse, before connecting, what is wrong whatever the switch holds (a wait for the switch,
    or gRPC aborting on half a TLS key pair, would come first), and keep what a command takes from
    its arguments alone: args.spec, args.place, args.table, args.thrift_addr."""
    if bool(args.cert) != bool(args.key):
        raise UsageError("--cert and --key go together (client TLS needs both)")
    if args.switch and (args.grpc_addr or args.device_id is not None):
        raise UsageError("give --switch or --grpc-addr/--device-id, not both")
    if args.election_id is not None and read_only(args):
        what = f"jobs {args.sub}" if args.cmd == "jobs" else args.cmd
        raise UsageError(f"--election-id does not apply: {what} only reads (no session, so no election)")
    if args.cmd == "shell" and args.json:
        raise UsageError("--json does not apply to shell (p4runtime-shell prints its own output)")
    if args.cmd == "shell" and args.bmv2_json:
        raise UsageError("--bmv2-json does not apply to shell (the shell pushes nothing)")
    if args.cmd == "topo" and topo is None:
        raise UsageError("topo needs --topology (the switches, hosts and links to show)")
    if args.cmd == "jobs" and args.sub == "create":
        if topo is None:
            raise UsageError("jobs create needs --topology (host addresses and ports)")
        args.spec = job_spec(args, topo)
    if args.cmd == "workers" and args.sub != "remove":
        args.place = worker_place(args, topo)
    if args.cmd == "tables" and args.table:
        args.table = resolve_table(args.table)
    if args.cmd == "cells":
        if args.json and args.elements is not None:
            raise UsageError("--elements is for cells' text: --json gives every sum")
        args.thrift_addr = args.thrift_addr or thrift_addr(args, topo)


def thrift_addr(args, topo: Topology | None) -> tuple[str, int]:
    """cells' Thrift address without --thrift-addr: the switch's gRPC host, at the topology's
    thrift_port for that switch (unless --grpc-addr names another), else 9090."""
    spec = one_switch(args, topo)
    grpc = args.grpc_addr or (spec.grpc_addr if spec else DEFAULT_GRPC_ADDR)
    host, colon, _ = grpc.rpartition(":")
    own = spec is not None and args.grpc_addr is None and spec.thrift_port is not None
    return host if colon else grpc, spec.thrift_port if own else DEFAULT_THRIFT_PORT


def cmd_push(args, ctl: Controller, topo) -> None:
    wiped = what_a_push_wipes(ctl) if args.force else None
    pushed = ctl.push(force=args.force)
    writes = ctl.install_forwarding(topo) if topo else None
    if not pushed:
        msg = "pipeline already installed (use --force to re-push)"
    elif wiped is None:
        msg = "pushed the pipeline"
    else:
        msg = f"re-pushed the pipeline, wiping {wiped['text']}"
    if writes is not None:
        msg += f"; forwarding for {len(topo.hosts)} hosts ({writes} writes)"
    emit(args, {"pushed": pushed, "wiped": None if wiped is None else {k: v for k, v in wiped.items() if k != "text"},
                "forwarding_writes": writes}, msg)


def what_a_push_wipes(ctl: Controller) -> dict | None:
    """What the switch holds now, which a forced push clears; None when it has no pipeline."""
    info, _ = ctl.conn.installed_pipeline()
    if info is None:
        return None
    try:
        entries = ctl.conn.read_entries()
    except PipelineMismatch:
        return {"program": "another", "entries": None, "groups": None, "jobs": None,
                "text": "another program and all its entries"}
    groups = ctl._read_groups()
    jobs = sorted(int(e.match[n.MF_JOB]) for e in entries if e.table == n.JOBS)
    text = f"{len(entries)} table entries"
    if jobs:
        text += f" (job{'s' if len(jobs) > 1 else ''} {', '.join(map(str, jobs))})"
    text += " and " + (f"{len(groups)} multicast groups" if groups is not None else "the multicast groups")
    return {"program": "ours", "entries": len(entries), "groups": None if groups is None else len(groups),
            "jobs": jobs, "text": text}


def job_spec(args, topo: Topology | None) -> JobSpec:
    if args.file:
        if args.workers or args.optimizer:
            raise UsageError("give --file or --workers/--optimizer, not both")
        try:
            with open(args.file) as f:
                data = json.load(f)
        except OSError as exc:
            raise UsageError(f"cannot read job file {args.file}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise UsageError(f"malformed job file {args.file}: {exc}") from None
        if not isinstance(data, dict):
            raise UsageError(f"malformed job file {args.file}: expected a JSON object")
        if args.job_id is not None:
            data["job_id"] = args.job_id
        if args.slots is not None:
            data["slots"] = args.slots
        if args.chunks is not None:
            data["chunks"] = args.chunks
        return JobSpec.from_dict(data)
    if args.job_id is None:
        raise UsageError("jobs create needs --file JOB.json or --job-id")
    if args.workers is None and args.optimizer is None:
        try:
            spec = topo.job(args.job_id)
        except TopologyError as exc:
            raise UsageError(f"{exc}: give --workers and --optimizer") from None
        spec = JobSpec(spec.job_id, spec.workers, spec.optimizer, args.slots or spec.slots,
                       spec.chunks if args.chunks is None else args.chunks)
        spec.check()
        return spec
    if args.workers is None or args.optimizer is None:
        raise UsageError("jobs create needs both --workers and --optimizer")
    opts = tuple(h.strip() for h in args.optimizer.split(","))
    spec = JobSpec(args.job_id, args.workers, opts if len(opts) > 1 else opts[0],
                   args.slots if args.slots is not None else 64, args.chunks or 0)
    spec.check()
    return spec


def cmd_jobs(args, ctl: Controller, topo) -> None:
    if args.sub == "list":
        ctl.reconcile()
        jobs = sorted(ctl.jobs.values(), key=lambda j: j.job_id)
        text = table([job_summary(j) for j in jobs], JOB_HEADER) if jobs else "no jobs"
        problems = ctl.last_rebuild.problems if ctl.last_rebuild else []
        emit(args, {"jobs": [j.to_dict() for j in jobs], "problems": problems}, text)
    elif args.sub == "show":
        job = ctl.job(args.job_id)
        emit(args, job.to_dict(), job_detail(job))
    elif args.sub == "create":
        job = ctl.create_job(args.spec, topo)
        emit(args, job.to_dict(), f"created {job_detail(job)}")
    elif args.sub == "delete":
        gone = ctl.delete_job(args.job_id)
        job = gone.job
        text = f"deleted job {job.job_id}: slots {job.slot_base}..{job.slots.end - 1} free, group {job.group} removed"
        if gone.missing:
            text += f"; already missing on the switch: {', '.join(gone.missing)}"
        emit(args, {"deleted": job.to_dict(), "missing": gone.missing}, text)


def cmd_workers(args, ctl: Controller, topo) -> None:
    if args.sub == "remove":
        job = ctl.remove_worker(args.job_id, args.worker)
        emit(args, job.to_dict(), f"removed worker {args.worker}; job {job.job_id} has {len(job.workers)} workers")
        return
    fn = ctl.add_worker if args.sub == "add" else ctl.replace_worker
    job = fn(args.job_id, args.worker, args.place, topo)
    e = job.workers[args.worker]
    emit(args, job.to_dict(), f"worker {args.worker} of job {job.job_id} {'added' if args.sub == 'add' else 'now'} "
         f"at {e.label()} (port {e.port}); job has {len(job.workers)} workers")


def worker_place(args, topo: Topology | None) -> str | AttachedHost:
    """Where workers add/replace puts the worker: a host of the topology, or --port/--mac/--ip."""
    if args.host and any(v is not None for v in (args.port, args.mac, args.ip)):
        raise UsageError("give a host name or --port/--mac/--ip, not both")
    if args.host:
        if topo is None:
            raise UsageError("a host name needs --topology")
        return args.host
    if args.port is not None and args.mac and args.ip:
        return AttachedHost(args.port, args.mac.lower(), args.ip)
    raise UsageError(f"workers {args.sub} needs a host name or all of --port, --mac and --ip")


def cmd_slots(args, ctl: Controller, topo) -> None:
    ctl.reconcile()
    rows = ctl.pool.map()
    data = {"size": ctl.pool.size, "free": ctl.pool.free,
            "ranges": [{"base": b, "count": c, "job": j} for b, c, j in rows]}
    text = table([[f"{b}..{b + c - 1}", c, "free" if j is None else f"job {j}"] for b, c, j in rows],
                 ["slots", "count", "owner"])
    emit(args, data, f"{text}\n{ctl.pool.free} of {ctl.pool.size} slots free")


STAT_COLUMNS = [("grad", "grad_packets"), ("sums", "completions"), ("dups", "duplicates"),
                ("resent", "resent_sums"), ("params", "param_packets"), ("rw-miss", "rewrite_misses"),
                ("drops", "dropped")]


def stats_text(snap: statsmodel.Snapshot, rates: dict | None = None) -> str:
    rows = []
    for j, c in snap.jobs.items():
        vals = rates[j] if rates is not None else c.values()
        fmt = (lambda v: f"{v:.1f}") if rates is not None else str
        reasons = ", ".join(f"{r} {c.drops[r]}" for r in sorted(c.drops))
        rows.append([j, *(fmt(vals[k]) for _, k in STAT_COLUMNS), reasons or "-"])
    head = ["job", *(h + ("/s" if rates is not None else "") for h, _ in STAT_COLUMNS), "drops by reason (total)"]
    text = table(rows, head) if rows else "no jobs"
    if snap.no_job.drops:
        text += "\nwithout a valid job: " + ", ".join(f"{r} {v}" for r, v in sorted(snap.no_job.drops.items()))
    return text + digests.text(snap)


def cmd_stats(args, ctl: Controller, topo) -> None:
    jobs = args.job
    for j in jobs or ():
        ctl.job(j)
    snap = digests.attach(ctl.stats(jobs), args.run)
    if args.watch is None:
        emit(args, snap.to_dict(), stats_text(snap))
        return
    updates = 0
    try:
        while args.count is None or updates < args.count:
            time.sleep(args.watch)
            now = digests.attach(ctl.stats(jobs), args.run)
            rates = statsmodel.rates(snap, now)
            if args.json:
                print(json.dumps({"time": now.time, "interval": now.time - snap.time,
                                  "rates": {str(j): r for j, r in rates.items()}, "totals": now.to_dict()}), flush=True)
            else:
                print(time.strftime("%H:%M:%S", time.localtime(now.time)) + "\n" + stats_text(now, rates) + "\n",
                      flush=True)
            snap, updates = now, updates + 1
    except KeyboardInterrupt:
        pass


def resolve_table(name: str) -> str:
    for full in n.TABLES:
        if name in (full, full.rsplit(".", 1)[-1]):
            return full
    raise UsageError(f"unknown table {name!r}: one of {', '.join(t.rsplit('.', 1)[-1] for t in n.TABLES)}")


def cmd_tables(args, ctl: Controller, topo) -> None:
    ctl.conn.check_pipeline()
    which = args.table  # resolved by check_usage
    entries = ctl.conn.read_entries(which)
    groups = None if which else ctl._read_groups()
    if args.json:
        emit(args, {"entries": [e.to_dict() for e in entries],
                    "groups": None if groups is None else [g.to_dict() for g in groups]}, "")
        return
    lines = []
    for t in ([which] if which else n.TABLES):
        mine = [e for e in entries if e.table == t]
        lines.append(f"{t} ({len(mine)} entries)")
        for e in sorted(mine, key=lambda e: e.key()):
            m = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in e.match.items())
            p = ", ".join(f"{k}={v}" for k, v in e.params.items())
            lines.append(f"  {m} -> {e.action.rsplit('.', 1)[-1]}({p})")
    if groups is not None:
        lines.append(f"multicast groups ({len(groups)})")
        lines += [f"  {g.group_id}: " + " ".join(f"{p}/{r}" for p, r in g.replicas) for g in groups]
    elif not which:
        lines.append("multicast groups: not readable on this target")
    print("\n".join(lines))


def cmd_shell(args, topo) -> None:
    """Check the switch runs our program, then hand the terminal to p4runtime-shell.

    The shell is started without --config, so it pushes nothing; it reads the
    P4Info from the switch, which we have just checked equals ours. It never
    takes primary away silently: while another controller is primary (e.g. the
    one of `make run`) it is a read-only session, unless --election-id names a
    backup id below the primary's.
    """
    tls = tls_of(args)
    spec = one_switch(args, topo)
    addr = args.grpc_addr or (spec.grpc_addr if spec else DEFAULT_GRPC_ADDR)
    dev = args.device_id if args.device_id is not None else (spec.device_id if spec else 0)
    eid, read_only, note = shell_session(args, addr, dev, tls)
    if note:
        print(f"mindp-ctl: {note}", file=sys.stderr)
    module = "controller.readonly_shell" if read_only else "p4runtime_sh"
    cmd = [sys.executable, "-m", module, "--grpc-addr", addr, "--device-id", str(dev),
           "--election-id", election_text(eid)]
    if tls:
        cmd.append("--ssl")
        cmd += [x for flag, v in (("--cacert", tls.cacert), ("--cert", tls.cert), ("--private-key", tls.key))
                if v for x in (flag, v)]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, cmd)


def shell_session(args, addr: str, dev: int, tls) -> tuple[tuple[int, int], bool, str | None]:
    """(election id, read-only?, a note for the user) for the shell.

    A probe with the lowest election id (0,1) can never take primary away: it
    either becomes primary (nobody else is), or a backup that learns the
    primary's id, or is refused because another client holds (0,1).
    """
    def probe(eid):
        with SwitchConnection(addr, dev, eid, p4info_path=args.p4info, tls=tls, require_primary=False,
                              timeout=args.timeout) as conn:
            conn.check_pipeline()
            return conn.is_primary, conn.client.primary_election_id

    wanted = args.election_id
    try:
        alone, primary = probe(DEFAULT_ELECTION_ID)
    except ElectionIdInUse:
        if wanted is None or wanted == DEFAULT_ELECTION_ID:
            if wanted is not None:
                raise
            return DEFAULT_ELECTION_ID, True, (f"another controller holds election id "
                                               f"{election_text(DEFAULT_ELECTION_ID)}: read-only session (writes "
                                               "need --election-id)")
        got_primary, _ = probe(wanted)
        note = (f"election id {election_text(wanted)} is now primary: the controller with "
                f"{election_text(DEFAULT_ELECTION_ID)} is a backup until this shell exits") if got_primary else None
        return wanted, False, note
    if alone:
        return wanted or DEFAULT_ELECTION_ID, False, None
    p = election_text(primary) if primary else "another id"
    if wanted is None:
        return DEFAULT_ELECTION_ID, True, f"controller with election id {p} is primary: read-only session"
    if primary is not None and wanted > primary:
        raise UsageError(f"controller with election id {p} is primary: the shell's --election-id "
                         f"{election_text(wanted)} would take primary away; give one below {p}, "
                         "or none for a read-only session")
    probe(wanted)  # below the primary: a backup; refused if another client uses it
    return wanted, False, None


def cmd_cells(args, ctl: Controller, topo) -> None:
    from . import cells

    try:
        from mindp.bmthrift import ThriftClient, ThriftError
    except ImportError:
        raise UsageError("cells needs mindp.bmthrift (the Thrift client), which this installation lacks") from None
    job = ctl.job(args.job_id)
    if args.slot is not None and not 0 <= args.slot < job.slot_count:
        raise UsageError(f"slot {args.slot} outside job {job.job_id}'s slots 0..{job.slot_count - 1}")
    host, port = args.thrift_addr
    try:
        client = ThriftClient(host, port, timeout=args.timeout or default_timeout())
    except ThriftError as exc:
        raise ControllerError(f"Thrift at {host}:{port}: {exc}") from None
    try:
        decoded, prog = cells.read_job_cells(client, job, args.slot)
    except ThriftError as exc:
        raise ControllerError(f"Thrift at {host}:{port}: {exc}") from None
    finally:
        client.close()
    shown = decoded if args.all or args.slot is not None else [c for c in decoded if c.mine]
    emit(args, {"job_id": job.job_id, "epoch": job.epoch, "workers": sorted(job.workers),
                "newest_step": prog.newest_step, "cells": [c.to_dict() for c in shown]},
         cells.text(job, decoded, prog, args.all or args.slot is not None, args.elements or 4))


def cmd_tree(args, tctl, topo: Topology) -> None:
    """push, jobs create/delete and topo over every switch of a tree topology."""
    from . import tree

    if args.cmd == "topo":
        data = tctl.view()
        emit(args, data, tree.text(data))
    elif args.cmd == "push":
        pushed = tctl.push(force=args.force)
        writes = tctl.install_forwarding()
        text = "\n".join(f"{name}: {'pushed the pipeline' if pushed[name] else 'pipeline already installed'}; "
                         f"forwarding for {len(topo.hosts)} hosts ({writes[name]} writes)" for name in pushed)
        emit(args, {"switches": {n_: {"pushed": pushed[n_], "forwarding_writes": writes[n_]} for n_ in pushed}}, text)
    elif args.sub == "create":
        parts = tctl.create_job(args.spec)
        text = "\n".join(f"{name}: created {job_detail(job)}" for name, job in parts.items())
        emit(args, {name: job.to_dict() for name, job in parts.items()}, text)
    else:
        gone = tctl.delete_job(args.job_id)
        text = "\n".join(f"{name}: deleted job {d.job.job_id}, slots {d.job.slot_base}..{d.job.slots.end - 1} free"
                         + (f"; already missing: {', '.join(d.missing)}" if d.missing else "")
                         for name, d in gone.items())
        emit(args, {name: {"deleted": d.job.to_dict(), "missing": d.missing} for name, d in gone.items()}, text)


def cmd_topo_single(args, ctl: Controller, topo: Topology) -> None:
    """topo on a single switch: the same view, one switch."""
    from . import tree

    rebuilt = ctl.reconcile()
    snap = ctl.stats()
    data = tree.view(topo, {ctl.switch: dict(ctl.jobs)}, {ctl.switch: {j: c.values() for j, c in snap.jobs.items()}},
                     {ctl.switch: list(rebuilt.problems)})
    if topo.is_tree:  # --switch picked one: show only it
        data["switches"] = [s for s in data["switches"] if s["name"] == ctl.switch]
    emit(args, data, tree.text(data))


COMMANDS = {"push": cmd_push, "jobs": cmd_jobs, "workers": cmd_workers, "slots": cmd_slots, "stats": cmd_stats,
            "tables": cmd_tables, "cells": cmd_cells, "topo": cmd_topo_single}


def main(argv: list[str] | None = None) -> int:
    """mindp-ctl with `argv` -> its exit status; log lines on this call's sys.stderr (main may run again)."""
    p = parser()
    args = p.parse_args(argv)
    if args.cmd == "stats" and args.count is not None and args.watch is None:
        p.error("stats: --count needs --watch")  # a snapshot has no updates to count
    log = logging.getLogger("mindp")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("mindp-ctl: %(levelname)s: %(message)s"))
    saved = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO if args.verbose else logging.WARNING)
    log.propagate = False
    try:
        with interrupts.deferred(interrupts.CTRL_C):
            return _run(args)
    except KeyboardInterrupt:
        return 130
    finally:
        log.removeHandler(handler)
        log.level, log.propagate = saved


def _run(args: argparse.Namespace) -> int:
    ctl = None
    try:
        topo = load_topology(args)
        check_usage(args, topo)
        if args.cmd == "shell":
            cmd_shell(args, topo)
            return 0
        if tree_command(args, topo):
            ctl = connect_tree(args, topo, skip_unreachable=args.cmd == "topo")
            cmd_tree(args, ctl, topo)
            return 0
        ctl = connect(args, topo)
        COMMANDS[args.cmd](args, ctl, topo)
        return 0
    except (ControllerError, SwitchError, TopologyError, JobError, SlotError, UsageError) as exc:
        print(f"mindp-ctl: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        print(f"mindp-ctl: error: {exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        if ctl is not None:
            ctl.close()


if __name__ == "__main__":
    sys.exit(main())
