"""Job model: entries and group of a job, ordered changes, validation, reconcile from entries."""
import random
from dataclasses import replace

import pytest

from controller import p4info_names as n
from controller.jobs import (AttachedHost, JobError, JobState, Shard, changed_workers, check_job, new_job, next_epoch,
                             orphan_plan, plan, rebuild)
from controller.model import Group, OpKind
from controller.slots import PoolExhausted, SlotPool, SlotRange
from controller.tree import branch_job, forwarding_entries
from mindp.topology import Host, JobSpec, Link, SwitchSpec, Topology, host_addresses, star


@pytest.fixture
def topo():
    return star([3, 2], slots=16)


def make(topo, pool=None, jobs=None, spec=None, last_epoch=0):
    pool = pool or SlotPool()
    jobs = {} if jobs is None else jobs
    spec = spec or topo.jobs[0]
    job = new_job(spec, topo, jobs, pool, last_epoch)
    jobs[job.job_id] = job
    return job


def test_job_entries_and_group(topo):
    job = make(topo)
    opt = topo.hosts["opt1"]
    je = job.job_entry()
    assert je.match == {n.MF_JOB: 1}
    assert je.params == {"slot_base": 0, "slot_count": 16, "workers": 3, "optimizer_port": opt.port,
                         "optimizer_mac": opt.mac, "optimizer_ip": opt.ip, "mcast_group": 257, "epoch": job.epoch,
                         "chunks": 0, "uplink": 0, "child_id": 0}
    bounded = make(topo, spec=JobSpec(2, {0: "w2_0"}, "opt2", slots=8, chunks=100))
    assert bounded.job_entry().params["chunks"] == 100 and bounded.to_dict()["chunks"] == 100
    tables = [e.table for e in job.entries()]
    assert tables.count(n.WORKERS) == 3 and tables.count(n.PARAM_REWRITE) == 3 and tables.count(n.OPTIMIZERS) == 1
    assert tables[-1] == n.JOBS
    w1 = topo.hosts["w1_1"]
    assert job.mcast_group() == Group(257, [(topo.hosts[f"w1_{i}"].port, 1 + 32 + i) for i in range(3)])
    rw = [e for e in job.entries() if e.table == n.PARAM_REWRITE and e.match[n.MF_EGRESS_RID] == 34]
    assert rw[0].params == {"mac": w1.mac, "ip": w1.ip}


def test_create_plan_puts_job_entry_after_its_members_and_delete_before(topo):
    job = make(topo)
    create = plan(None, job)
    assert all(op.kind is OpKind.INSERT for op in create)
    kinds = [("group" if isinstance(op.item, Group) else op.item.table) for op in create]
    assert kinds[-1] == n.JOBS and kinds[-2] == "group"
    delete = plan(job, None)
    assert all(op.kind is OpKind.DELETE for op in delete)
    assert delete[0].item.table == n.JOBS and isinstance(delete[1].item, Group)
    assert len(delete) == len(create)


def test_inverse_of_a_plan_undoes_it(topo):
    job = make(topo)
    moved = job.with_workers({**job.workers, 0: AttachedHost(40, "02:00:00:00:00:40", "10.0.0.40")})
    ops = plan(job, moved)
    undo = [op.inverse() for op in reversed(ops)]
    for op, inv in zip(reversed(ops), undo):
        if op.kind is OpKind.MODIFY:
            assert inv.item == op.previous and inv.previous == op.item
        else:
            assert inv.item == op.item and inv.kind is not op.kind


def test_replace_worker_moves_membership_rewrites_address_and_group(topo):
    jobs = {}
    job = make(topo, jobs=jobs)
    spare = AttachedHost(40, "02:00:00:00:00:40", "10.0.0.40", "spare")
    moved = changed_workers(job, {**job.workers, 1: spare}, jobs)
    ops = plan(job, moved)
    got = {(op.kind, op.item.table if not isinstance(op.item, Group) else "group") for op in ops}
    assert got == {(OpKind.INSERT, n.WORKERS), (OpKind.MODIFY, n.PARAM_REWRITE), (OpKind.MODIFY, "group"),
                   (OpKind.DELETE, n.WORKERS)}
    assert ops[-1].kind is OpKind.DELETE  # the old port loses membership last
    assert moved.job_entry() == job.job_entry()  # same count, slots, epoch


def test_add_and_remove_worker_update_count_and_group(topo):
    jobs = {}
    job = make(topo, jobs=jobs)
    bigger = changed_workers(job, {**job.workers, 5: AttachedHost(40, "02:00:00:00:00:40", "10.0.0.40")}, jobs)
    assert bigger.job_entry().params["workers"] == 4
    assert (40, n.worker_rid(1, 5)) in bigger.mcast_group().replicas
    ops = plan(job, bigger)
    assert [op.kind for op in ops].count(OpKind.INSERT) == 2  # membership + rewrite
    smaller = changed_workers(job, {w: e for w, e in job.workers.items() if w != 0}, jobs)
    ops = plan(job, smaller)
    job_mod = [i for i, op in enumerate(ops) if not isinstance(op.item, Group) and op.item.table == n.JOBS][0]
    deletes = [i for i, op in enumerate(ops) if op.kind is OpKind.DELETE]
    assert ops[job_mod].item.params["workers"] == 2 and all(d > job_mod for d in deletes)
    with pytest.raises(JobError, match="no workers"):
        changed_workers(job, {}, jobs)


def test_jobs_get_disjoint_slots_and_distinct_epochs(topo):
    pool, jobs = SlotPool(), {}
    a = make(topo, pool, jobs, topo.jobs[0])
    b = make(topo, pool, jobs, topo.jobs[1])
    assert not a.slots.overlaps(b.slots)
    assert a.epoch != b.epoch and 0 not in (a.epoch, b.epoch)


def test_next_epoch_follows_the_last_one_skipping_live_ones_and_zero():
    assert next_epoch(0, set()) == 1
    assert next_epoch(41, {42, 43}) == 44
    assert next_epoch(0xFFFF, set()) == 1 and next_epoch(0xFFFE, {0xFFFF}) == 1  # cycles, never 0
    assert next_epoch(0x1_0005, set()) == 6  # a counter cell wider than 16 bits
    live = set(range(1, 0xFFFF))  # only 65535 left
    assert next_epoch(7, live) == 0xFFFF
    with pytest.raises(JobError, match="no free epoch"):
        next_epoch(7, live | {0xFFFF})


def test_bad_requests_fail_without_allocating(topo):
    pool, jobs = SlotPool(32), {}
    make(topo, pool, jobs)
    cases = [
        (JobSpec(1, {0: "w2_0"}, "opt2"), "job 1 already exists"),
        (JobSpec(3, {0: "w1_0"}, "opt2"), f"port {topo.hosts['w1_0'].port} is already owned by job 1"),
        (JobSpec(3, {0: "w2_0"}, "opt1"), "already owned by job 1"),
        (JobSpec(3, {0: "nobody"}, "opt2"), "unknown host 'nobody'"),
        (JobSpec(3, {0: "w2_0", 1: "w2_0"}, "opt2"), "share port"),
        (JobSpec(3, {0: "w2_0"}, "w2_0"), "share port"),
        (JobSpec(70, {0: "w2_0"}, "opt2"), "outside 0..63"),
    ]
    for spec, msg in cases:
        with pytest.raises(JobError, match=msg):
            new_job(spec, topo, jobs, pool, 0)
    with pytest.raises(PoolExhausted):
        new_job(JobSpec(2, {0: "w2_0"}, "opt2", slots=17), topo, jobs, pool, 0)
    assert pool.allocations == {1: SlotRange(0, 16)}


def test_rebuild_recovers_jobs_from_entries_and_groups(topo):
    pool, jobs = SlotPool(), {}
    a = make(topo, pool, jobs, topo.jobs[0])
    b = make(topo, pool, jobs, topo.jobs[1])
    entries = [*a.entries(), *b.entries()]
    random.Random(3).shuffle(entries)
    flood = Group(n.FLOOD_GROUP, [(h.port, 0) for h in topo.hosts.values()])
    got = rebuild(entries, [flood, a.mcast_group(), b.mcast_group()], topo)
    assert got.problems == [] and got.orphans == []
    assert got.jobs == {1: a, 2: b}
    anonymous = rebuild(entries, None)  # without a topology, hosts are unnamed
    assert anonymous.jobs[1].workers[0] == AttachedHost(a.workers[0].port, a.workers[0].mac, a.workers[0].ip)


def test_rebuild_reports_leftovers_of_a_half_written_job(topo):
    pool, jobs = SlotPool(), {}
    a = make(topo, pool, jobs, topo.jobs[0])
    b = make(topo, pool, jobs, topo.jobs[1])
    half = b.member_entries()[:3]  # a crash before the job entry
    got = rebuild([*a.entries(), *half], [a.mcast_group(), b.mcast_group()], topo)
    assert list(got.jobs) == [1]
    assert len(got.orphans) == 3 and got.orphan_groups == [b.mcast_group()]
    assert any("job 2, which has no job entry" in p for p in got.problems)
    ops = orphan_plan(2, got)
    assert len(ops) == 4 and all(op.kind is OpKind.DELETE for op in ops)
    assert orphan_plan(1, got) == []


def test_rebuild_flags_inconsistent_count_and_group(topo):
    job = make(topo)
    entries = job.entries()
    entries[-1].params["workers"] = 5
    got = rebuild(entries, [Group(job.group, [(1, 33)])], topo)
    assert any("counts 5 workers" in p for p in got.problems)
    assert any("replicas differ" in p for p in got.problems)


def test_endpoint_from_host():
    h = Host("a", "02:00:00:00:00:09", "10.0.0.9", 9)
    assert AttachedHost.of(h) == AttachedHost(9, h.mac, h.ip, "a")


NODE = AttachedHost(9, "02:00:00:00:00:09", "10.0.0.9", "opt")
NODE2 = AttachedHost(10, "02:00:00:00:00:0a", "10.0.0.10", "opt2")
HOSTS = {w: AttachedHost(1 + w, f"02:00:00:00:00:0{1 + w}", f"10.0.0.{1 + w}", f"w{w}") for w in range(2)}


def leaf_job(child_id=1) -> JobState:
    """Job 3 on a leaf: two workers, the uplink on port 7 with the node's addresses."""
    uplink = AttachedHost(7, NODE.mac, NODE.ip, NODE.host)
    return JobState(3, SlotRange(0, 8), 5, dict(HOSTS), uplink, chunks=40, uplink=uplink, child_id=child_id)


def spine_job() -> JobState:
    """Job 3 on a spine: two child switches (ports 1, 2; child ids 0, 1), two shard nodes."""
    children = {c: AttachedHost(1 + c, NODE.mac, NODE.ip, f"leaf{c}") for c in range(2)}
    return JobState(3, SlotRange(0, 8), 5, children, NODE, chunks=40, shards=(Shard(0, 19, NODE), Shard(20, 39, NODE2)),
                    children={0: 4, 1: 3})


def test_leaf_job_sends_partials_up_its_uplink_and_admits_params_from_it():
    job = leaf_job()
    check_job(job, {})
    p = job.job_entry().params
    assert (p["uplink"], p["child_id"], p["optimizer_port"], p["optimizer_mac"], p["workers"]) == (1, 1, 7, NODE.mac, 2)
    admits = [e for e in job.entries() if e.table == n.OPTIMIZERS]
    assert [e.match[n.MF_INGRESS_PORT] for e in admits] == [7]
    assert not [e for e in job.entries() if e.table == n.SHARDS]
    assert job.mcast_group() == Group(job.group, [(1, job.rid(0)), (2, job.rid(1))])
    assert job.to_dict()["uplink"]["port"] == 7 and job.to_dict()["child_id"] == 1


def test_spine_job_routes_shards_and_admits_each_node():
    job = spine_job()
    check_job(job, {}, link_ports=frozenset({1, 2}))
    shards = [e for e in job.entries() if e.table == n.SHARDS]
    assert [(e.match[n.MF_CHUNK], e.params["port"], e.params["hi"], e.priority) for e in shards] == \
        [((0, 19), 9, 19, 1), ((20, 39), 10, 39, 1)]  # hi: the last chunk a node's PARAM may carry
    assert [e.match[n.MF_INGRESS_PORT] for e in job.entries() if e.table == n.OPTIMIZERS] == [9, 10]
    assert job.job_entry().params["uplink"] == 0 and job.job_entry().params["workers"] == 2
    assert job.to_dict()["shards"][1] == {"lo": 20, "hi": 39, "node": NODE2.to_dict()}


def test_members_are_admitted_in_their_role():
    """Worker hosts by admit_worker, child switches by admit_child with the workers beneath them;
    a member that changes role is a modify of its entry."""
    members = {e.match[n.MF_WORKER]: (e.action, e.params) for e in spine_job().entries() if e.table == n.WORKERS}
    assert members == {0: (n.ADMIT_CHILD, {"max_nworkers": 4}), 1: (n.ADMIT_CHILD, {"max_nworkers": 3})}
    assert {e.action for e in leaf_job().entries() if e.table == n.WORKERS} == {n.ADMIT_WORKER}
    assert spine_job().to_dict()["workers"]["0"]["role"] == "child" and leaf_job().to_dict()["workers"]["0"] == \
        {**leaf_job().workers[0].to_dict(), "rid": leaf_job().rid(0), "role": "worker"}
    spine = spine_job()
    mixed = spine.with_workers({**spine.workers, 5: AttachedHost(5, NODE.mac, NODE.ip)})
    assert mixed.children == spine.children and mixed.member_entry(5).action == n.ADMIT_WORKER
    fewer = spine.with_workers({0: spine.workers[0]})
    assert fewer.children == {0: 4}
    ops = plan(spine, replace(spine, children={0: 4, 1: 5}))
    assert [(op.kind, op.item.params) for op in ops] == [(OpKind.MODIFY, {"max_nworkers": 5})]


def test_rebuild_recovers_leaf_and_sharded_spine_roles():
    for job in (leaf_job(), spine_job()):
        entries = job.entries()
        random.Random(1).shuffle(entries)
        got = rebuild(entries, [job.mcast_group()])
        assert got.problems == [] and got.orphans == []
        back = got.jobs[3]
        assert (back.uplink is None) == (job.uplink is None) and back.child_id == job.child_id
        assert back.children == job.children
        assert [(s.lo, s.hi, s.node.port, s.node.mac) for s in back.shards] == \
               [(s.lo, s.hi, s.node.port, s.node.mac) for s in job.shards]
        assert plan(back, job) == []  # nothing to write: the switch already holds the job
    half = [e for e in spine_job().entries() if e.table == n.SHARDS]
    got = rebuild(half, [])
    assert len(got.orphans) == 2 and any("shard routes for job 3" in p for p in got.problems)
    assert len(orphan_plan(3, got)) == 2
    loose = [replace(e, params={**e.params, "hi": 25}) if e.table == n.SHARDS and e.params["hi"] == 19 else e
             for e in spine_job().entries()]
    got = rebuild(loose, [spine_job().mcast_group()])
    assert got.problems == ["job 3: shard 0..19 bounds multi-chunk PARAMs at 25"]


def test_tree_roles_are_checked():
    leaf = leaf_job()
    bad = [
        (replace(leaf, child_id=32), "child id 32 outside 0..31"),
        (replace(leaf, uplink=None), "a child id without an uplink"),
        (replace(leaf, shards=(Shard(0, 39, NODE),)), "a leaf"),
        (replace(spine_job(), shards=(Shard(0, 9, NODE), Shard(20, 39, NODE2))), "without a node"),
        (replace(spine_job(), shards=(Shard(0, 19, NODE), Shard(20, 38, NODE2))), "not every chunk"),
        (replace(spine_job(), shards=(Shard(20, 39, NODE2), Shard(0, 19, NODE))), "not ascending"),
        (replace(spine_job(), shards=tuple(Shard(i * 5, i * 5 + 4, NODE) for i in range(9)), chunks=45), "at most 8"),
        (replace(spine_job(), children={0: 4, 7: 1}), "child switch 7 is not a member"),
        (replace(spine_job(), children={0: 0}), "child switch 0 has 0 workers beneath it"),
        (replace(spine_job(), children={0: 1 << 16}), "not 1..65535"),
    ]
    for job, msg in bad:
        with pytest.raises(JobError, match=msg):
            check_job(job, {}, link_ports=frozenset({1, 2}))
    other = replace(spine_job(), job_id=4)
    with pytest.raises(JobError, match="already owned by job 4"):
        check_job(spine_job(), {4: other})  # child ports shared with another job: only as link ports
    check_job(spine_job(), {4: replace(other, optimizer=AttachedHost(11, NODE.mac, NODE.ip), shards=())},
              link_ports=frozenset({1, 2}))


def three_levels() -> Topology:
    """spine (node opt on port 9) <- mid (worker w2 on port 1) <- leaf (workers w0, w1 on ports 1, 2)."""
    hosts = {name: Host(name, *host_addresses(i), port, switch)
             for i, (name, port, switch) in enumerate([("w0", 1, "leaf"), ("w1", 2, "leaf"), ("w2", 1, "mid"),
                                                        ("opt", 9, "spine")], start=1)}
    links = (Link("mid", 5, "spine", 3), Link("leaf", 7, "mid", 4))
    topo = Topology((SwitchSpec("spine"), SwitchSpec("mid", "127.0.0.1:9560", 1), SwitchSpec("leaf", "127.0.0.1:9561", 2)),
                    hosts, [JobSpec(1, {0: "w0", 1: "w1", 2: "w2"}, "opt")], links)
    topo.check()
    return topo


def test_each_child_switch_is_bounded_by_the_workers_beneath_it():
    topo = three_levels()
    spine, mid, leaf = (branch_job(topo, topo.jobs[0], s) for s in ("spine", "mid", "leaf"))
    assert (spine.children, mid.children, leaf.children) == ({0: 3}, {0: 2}, {})
    assert sorted(mid.workers) == [0, 2] and mid.workers[0].port == 4 and mid.uplink.port == 5
    roles = {e.match[n.MF_WORKER]: (e.action, e.params) for e in mid.entries() if e.table == n.WORKERS}
    assert roles == {0: (n.ADMIT_CHILD, {"max_nworkers": 2}), 2: (n.ADMIT_WORKER, {})}


def test_sources_follow_forwarding_a_host_sends_from_the_port_towards_it():
    topo = three_levels()
    for switch, expect in (("mid", {"w0": 4, "w1": 4, "w2": 1, "opt": 5}), ("leaf", {"w0": 1, "w1": 2, "w2": 7, "opt": 7}),
                           ("spine", {"w0": 3, "w1": 3, "w2": 3, "opt": 9})):
        entries = forwarding_entries(topo, switch)
        src = {(e.match[n.MF_SRC_MAC], e.match[n.MF_SRC_IP]): e.match[n.MF_INGRESS_PORT]
               for e in entries if e.table == n.SOURCES}
        assert src == {(topo.host(h).mac, topo.host(h).ip): port for h, port in expect.items()}, switch
        fwd = {e.match[n.MF_DST_MAC]: e.params["port"] for e in entries if e.action == n.FORWARD}
        assert fwd == {topo.host(h).mac: port for h, port in expect.items()}
        assert all(e.action == n.ALLOW and e.params == {} for e in entries if e.table == n.SOURCES)
