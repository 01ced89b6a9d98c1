"""A job's part on each switch of a tree, and each switch's forwarding and source guard, from the topology.

Pure logic, no I/O: `branch_job` turns `Topology.branches` into the `JobState` one
switch holds (controller.jobs builds its entries for any role); `TreeController`
(controller/treectl.py) installs them. docs/SCALE.md describes the tree protocol.
"""
from __future__ import annotations

from mindp.topology import Host, JobBranch, JobSpec, Topology, TopologyError

from . import p4info_names as n
from .jobs import AttachedHost, JobError, JobState, Shard
from .model import Entry, Group
from .slots import SlotRange


def switch_address(topology: Topology, switch: str) -> AttachedHost:
    """The addresses a parent rewrites a PARAM copy for child `switch` to (the child rewrites them
    again for each worker): locally administered, derived from the switch's place in the list."""
    i = [s.name for s in topology.switches].index(switch) + 1
    return AttachedHost(0, f"02:ff:00:00:{i >> 8:02x}:{i & 0xFF:02x}", f"10.255.{i >> 8}.{i & 0xFF}", switch)


def link_ports(topology: Topology, switch: str) -> frozenset[int]:
    """The switch's ports to other switches: every job of the tree may use them."""
    return frozenset(port for port, _, _ in topology.neighbours(switch))


def workers_beneath(branches: dict[str, JobBranch], switch: str) -> int:
    """The job's workers on `switch` and every switch below it: the most gradients its PARTIALs carry."""
    b = branches[switch]
    return len(b.workers) + sum(workers_beneath(branches, child) for child, _ in b.children.values())


def branch_job(topology: Topology, spec: JobSpec, switch: str, slots: SlotRange | None = None,
               epoch: int = 0) -> JobState:
    """The job as `switch` holds it (slots and epoch are the switch's own, given by its controller).

    Root: its local workers and child switches are members, completed sums go to the optimizer
    node or, when sharded, to the node owning the chunk. Elsewhere: completed partial sums go up
    the uplink port as member `child_id` of the parent, addressed to the (first) node. A child
    switch is admitted with the number of the job's workers beneath it.
    """
    try:
        branches = topology.branches(spec)
        branch = branches.get(switch)
        if branch is None:
            raise JobError(f"job {spec.job_id} has no part on switch {switch}")
        members = {w: AttachedHost.of(topology.host(h)) for w, h in branch.workers.items()}
        children = {}
        for cid, (child, port) in branch.children.items():
            addr = switch_address(topology, child)
            members[cid] = AttachedHost(port, addr.mac, addr.ip, child)
            children[cid] = workers_beneath(branches, child)
        nodes = [(lo, hi, AttachedHost.of(topology.host(h))) for lo, hi, h in spec.shard_ranges()]
    except TopologyError as exc:
        raise JobError(str(exc)) from None
    first = nodes[0][2]
    uplink = shards = None
    if branch.parent is not None:
        uplink = AttachedHost(branch.uplink_port, first.mac, first.ip, branch.parent)
    elif spec.sharded:
        shards = tuple(Shard(lo, hi, node) for lo, hi, node in nodes)
    return JobState(spec.job_id, slots or SlotRange(0, spec.slots), epoch, dict(sorted(members.items())), first,
                    spec.chunks, uplink=uplink, child_id=branch.child_id, shards=shards or (), children=children)


def host_ports(topology: Topology, switch: str | None = None) -> list[tuple[int, Host]]:
    """(port of `switch` towards the host, host) for every host: its own port, or the link
    towards its switch. Both directions of ordinary traffic follow it."""
    switch = switch or topology.switches[0].name
    out = []
    for h in sorted(topology.hosts.values(), key=lambda h: (topology.switch_of(h), h.port)):
        where = topology.switch_of(h)
        out.append((h.port if where == switch else topology.toward(switch, where), h))
    return out


def forwarding_entries(topology: Topology, switch: str | None = None) -> list[Entry]:
    """Per host an l2_forward entry (out of the port towards it) and a sources entry (it may send
    from that port, with its MAC and IPv4 address); broadcast to the flood group."""
    out = []
    for port, h in host_ports(topology, switch):
        out.append(Entry(n.L2_FORWARD, {n.MF_DST_MAC: h.mac}, n.FORWARD, {"port": port}))
        out.append(Entry(n.SOURCES, {n.MF_INGRESS_PORT: port, n.MF_SRC_MAC: h.mac, n.MF_SRC_IP: h.ip}, n.ALLOW))
    out.append(Entry(n.L2_FORWARD, {n.MF_DST_MAC: "ff:ff:ff:ff:ff:ff"}, n.FLOOD, {"group": n.FLOOD_GROUP}))
    return out


def flood_group(topology: Topology, switch: str | None = None) -> Group:
    """Every host and link port of the switch with rid 0; egress drops the copy to the ingress
    port, and a tree has no loop, so a broadcast reaches every host once."""
    switch = switch or topology.switches[0].name
    ports = sorted({h.port for h in topology.hosts_on(switch)} | link_ports(topology, switch))
    return Group(n.FLOOD_GROUP, [(p, 0) for p in ports])


# --- the tree as mindp-ctl topo shows it ---------------------------------------------

LEVEL_COUNTERS = ("grad_packets", "completions", "duplicates", "resent_sums", "param_packets", "dropped")


def levels(topology: Topology) -> dict[str, int]:
    """Each switch's depth below the first listed switch (the spine of a leaf-spine)."""
    out = {topology.switches[0].name: 0}
    todo = [topology.switches[0].name]
    while todo:
        s = todo.pop(0)
        for _, peer, _ in topology.neighbours(s):
            if peer not in out:
                out[peer] = out[s] + 1
                todo.append(peer)
    return out


def role(job: JobState, topology: Topology, switch: str) -> str:
    if job.uplink is not None:
        parent = next((peer for port, peer, _ in topology.neighbours(switch) if port == job.uplink.port), "?")
        return f"leaf: child {job.child_id} of {parent} via port {job.uplink.port}"
    return "root: " + (", ".join(f"chunks {s.lo}..{s.hi} -> {s.node.label()}" for s in job.shards)
                       if job.shards else f"sums -> {job.optimizer.label()} (port {job.optimizer.port})")


def view(topology: Topology, jobs: dict[str, dict[int, JobState]], counters: dict[str, dict[int, dict]],
         problems: dict[str, list[str]] | None = None) -> dict:
    """The tree as data: switches with their ports, jobs (role, members) and counters, and per
    level the counters summed. `jobs` and `counters` (JobCounters.values() per job) per switch,
    as read from each switch; a switch missing from them could not be read."""
    depth = levels(topology)
    by_addr = {switch_address(topology, s.name).mac: s.name for s in topology.switches}

    def named(j: JobState) -> dict:
        """The job as data, its child-switch members named (the switch holds only their addresses)."""
        d = j.to_dict()
        for m in d["workers"].values():
            m["host"] = m["host"] or by_addr.get(m["mac"])
        return d

    switches = []
    for spec in topology.switches:
        ports = [{"port": h.port, "host": h.name, "mac": h.mac, "ip": h.ip} for h in topology.hosts_on(spec.name)]
        ports += [{"port": p, "link": peer, "peer_port": pp} for p, peer, pp in topology.neighbours(spec.name)]
        held = jobs.get(spec.name)
        switches.append({
            **spec.to_dict(), "level": depth[spec.name], "reachable": held is not None,
            "ports": sorted(ports, key=lambda p: p["port"]),
            "jobs": None if held is None else [
                {**named(j), "role": role(j, topology, spec.name), "counters": counters.get(spec.name, {}).get(j.job_id)}
                for j in sorted(held.values(), key=lambda j: j.job_id)],
            "problems": (problems or {}).get(spec.name, []),
        })
    per_level: dict[int, dict] = {}
    for sw in switches:
        lv = per_level.setdefault(sw["level"], {"level": sw["level"], "switches": [], "jobs": {}})
        lv["switches"].append(sw["name"])
        for j in sw["jobs"] or []:
            tot = lv["jobs"].setdefault(str(j["job_id"]), dict.fromkeys(LEVEL_COUNTERS, 0))
            for k in LEVEL_COUNTERS:
                tot[k] += (j["counters"] or {}).get(k, 0)
    return {"switches": switches, "links": [link.to_dict() for link in topology.links],
            "levels": [per_level[k] for k in sorted(per_level)]}


def text(data: dict) -> str:
    """`view` as an indented tree: each switch under its parent, its hosts, its jobs and counters."""
    by_name = {sw["name"]: sw for sw in data["switches"]}
    lines: list[str] = []

    def show(name: str, indent: str, via: str, seen: set[str]) -> None:
        sw = by_name[name]
        seen.add(name)
        thrift = f", thrift {sw['thrift_port']}" if sw.get("thrift_port") else ""
        lines.append(f"{indent}{name}{via}  [{sw['grpc_addr']}, device {sw['device_id']}{thrift}]"
                     + ("" if sw["reachable"] else "  UNREACHABLE"))
        pad = indent + "    "
        for p in sw["ports"]:
            if "host" in p:
                lines.append(f"{pad}port {p['port']:<3} host {p['host']} ({p['mac']}, {p['ip']})")
        for j in sw["jobs"] or []:
            members = " ".join(f"{w}={m['host'] or m['mac']}@{m['port']}" for w, m in j["workers"].items())
            lines.append(f"{pad}job {j['job_id']} {j['role']}; slots {j['slot_base']}..{j['slot_base'] + j['slots'] - 1}, "
                         f"epoch {j['epoch']}; members {members}")
            c = j["counters"]
            if c:
                drops = ", ".join(f"{k[5:]} {v}" for k, v in sorted(c.items()) if k.startswith("drop.")) or "none"
                lines.append(f"{pad}  in {c['grad_packets']}  completed {c['completions']}  dups {c['duplicates']}  "
                             f"resent {c['resent_sums']}  params {c['param_packets']}  drops {c['dropped']} ({drops})")
        lines.extend(f"{pad}problem: {p}" for p in sw["problems"])
        for p in sw["ports"]:
            if "link" in p and p["link"] not in seen:
                show(p["link"], pad, f" (port {p['port']} <-> its port {p['peer_port']})", seen)

    seen: set[str] = set()
    for sw in data["switches"]:
        if sw["name"] not in seen:
            show(sw["name"], "", "", seen)
    if len(data["switches"]) > 1:
        lines.append("per level (jobs: in / completed / resent / params / drops):")
        for lv in data["levels"]:
            jobs = "; ".join(f"job {j}: {c['grad_packets']} / {c['completions']} / {c['resent_sums']} / "
                             f"{c['param_packets']} / {c['dropped']}" for j, c in sorted(lv["jobs"].items()))
            lines.append(f"  level {lv['level']} ({', '.join(lv['switches'])}): {jobs or 'no jobs'}")
    return "\n".join(lines)
