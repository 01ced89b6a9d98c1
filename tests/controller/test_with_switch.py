"""The controller against real P4Runtime targets: what it writes is read back from the switch."""
from __future__ import annotations

import pytest

from controller import p4info_names as n
from controller.controller import Controller, ControllerError, flood_group, forwarding_entries
from controller.model import Entry, Group
from controller.p4runtime import (ElectionIdInUse, EntryExists, NoPipeline, NotPrimary, SwitchConnection, SwitchError,
                                  SwitchUnreachable, p4info_signature)
from mindp import targets
from mindp.topology import JobSpec


def keyed(entries):
    return {e.key(): (e.action, e.params) for e in entries}


def job_entries_on_switch(conn, job_id):
    """Every entry of this job: by job match field, or by its workers' rids."""
    out = []
    for e in conn.read_entries():
        if e.match.get(n.MF_JOB) == job_id:
            out.append(e)
        elif e.table == n.PARAM_REWRITE and (n.rid_worker(e.match[n.MF_EGRESS_RID]) or (None,))[0] == job_id:
            out.append(e)
    return out


def groups(conn):
    try:
        return {g.group_id: g for g in conn.read_groups()}
    except Exception as exc:  # a target that cannot read groups says so; the tests then need it
        pytest.fail(f"multicast groups not readable: {exc}")


def test_push_and_read_back(switch, topo):
    with Controller(switch.addr, topology=topo) as c:
        with pytest.raises(NoPipeline, match="no pipeline"):
            c.reconcile()
        assert c.push() is True
        info, cookie = c.conn.installed_pipeline()
        assert p4info_signature(info) == p4info_signature(c.conn.p4info)
        assert c.pipeline_installed()
        assert c.install_forwarding() == 2 * len(topo.hosts) + 2  # forwarding and source per host, broadcast, group
        on_switch = c.conn.read_entries(n.L2_FORWARD) + c.conn.read_entries(n.SOURCES)
        assert keyed(on_switch) == keyed(forwarding_entries(topo))
        assert groups(c.conn)[n.FLOOD_GROUP] == flood_group(topo)
        assert c.install_forwarding() == 0  # idempotent
        job = c.create_job(topo.jobs[0])
        assert c.push() is False  # same program: nothing wiped
        assert c.conn.read_entries(n.JOBS) == [job.job_entry()]
        assert c.push(force=True) is True
        assert c.conn.read_entries() == [] and c.jobs == {}


def test_create_show_delete_job(ctl, topo):
    job = ctl.create_job(topo.jobs[0])
    assert (job.slot_base, job.slot_count, job.group) == (0, 16, 257)
    assert job.rids == {0: 33, 1: 34, 2: 35}
    on_switch = job_entries_on_switch(ctl.conn, 1)
    assert keyed(on_switch) == keyed(job.entries())
    assert len(on_switch) == 1 + 1 + 3 * 2
    assert groups(ctl.conn)[257] == Group(257, [(1, 33), (2, 34), (3, 35)])
    assert ctl.job(1) == job
    ctl.delete_job(1)
    assert job_entries_on_switch(ctl.conn, 1) == []
    assert 257 not in groups(ctl.conn)
    assert ctl.pool.free == n.POOL_SLOTS
    with pytest.raises(ControllerError, match="unknown job 1"):
        ctl.delete_job(1)
    again = ctl.create_job(topo.jobs[0])  # the same slots at once, a fresh epoch
    assert again.slots == job.slots and again.epoch != job.epoch


def test_two_jobs_at_once_are_isolated(ctl, topo):
    a = ctl.create_job(topo.jobs[0])
    b = ctl.create_job(topo.jobs[1])
    assert not a.slots.overlaps(b.slots) and a.epoch != b.epoch
    g = groups(ctl.conn)
    assert g[a.group] == a.mcast_group() and g[b.group] == b.mcast_group()
    before_b = keyed(job_entries_on_switch(ctl.conn, 2))
    ctl.delete_job(1)
    assert keyed(job_entries_on_switch(ctl.conn, 2)) == before_b == keyed(b.entries())
    with pytest.raises(ControllerError, match="already owned by job 2"):
        ctl.create_job(JobSpec(3, {0: "w2_1"}, "opt1"))


def test_pool_exhaustion_and_fragmentation(ctl, topo):
    ctl.create_job(JobSpec(1, {0: "w1_0"}, "opt1", slots=400))
    ctl.create_job(JobSpec(2, {0: "w2_0"}, "opt2", slots=400))
    ctl.create_job(JobSpec(3, {0: "w1_1"}, "w1_2", slots=200))
    with pytest.raises(ControllerError, match="exhausted: job 4 needs 100 slots, 24 of 1024 free"):
        ctl.create_job(JobSpec(4, {0: "w2_1"}, "spare", slots=100))
    assert job_entries_on_switch(ctl.conn, 4) == []
    ctl.delete_job(1)
    ctl.delete_job(3)  # free: 0..399 and 800..1023, 624 in all
    with pytest.raises(ControllerError, match="fragmented: .* largest gap is 400"):
        ctl.create_job(JobSpec(4, {0: "w2_1"}, "spare", slots=500))
    assert ctl.create_job(JobSpec(4, {0: "w2_1"}, "spare", slots=300)).slot_base == 0


@pytest.mark.parametrize("conflict", ["rewrite", "group"])
def test_failed_create_rolls_back(ctl, topo, conflict):
    ctl.create_job(topo.jobs[0])
    before = keyed(ctl.conn.read_entries())
    before_groups = groups(ctl.conn)
    # Someone else writes the switch after we reconciled: the create collides half way.
    if conflict == "rewrite":
        intruder = Entry(n.PARAM_REWRITE, {n.MF_EGRESS_RID: n.worker_rid(2, 1)}, n.SET_WORKER_ADDRESS,
                         {"mac": "02:99:00:00:00:01", "ip": "10.9.9.9"})
        ctl.conn.insert(intruder)
        before[intruder.key()] = (intruder.action, intruder.params)
    else:
        intruder = Group(n.job_group(2), [(9, 1)])
        ctl.conn.insert_group(intruder)
        before_groups[intruder.group_id] = intruder
    with pytest.raises(EntryExists, match=r"create job 2: .*rolled back [1-9]\d* writes"):
        ctl.create_job(topo.jobs[1])
    assert keyed(ctl.conn.read_entries()) == before
    assert groups(ctl.conn) == before_groups
    assert 2 not in ctl.jobs and ctl.pool.owner_of(2) is None and ctl.pool.free == n.POOL_SLOTS - 16


def test_lower_election_id_is_refused_writes(switch, topo):
    with Controller(switch.addr, election_id=(0, 5), topology=topo) as primary:
        primary.push()
        with pytest.raises(NotPrimary, match=r"election id 0,5 \(ours is 0,2\)"):
            Controller(switch.addr, election_id=(0, 2), topology=topo)
        with SwitchConnection(switch.addr, election_id=(0, 2), require_primary=False) as backup:
            assert not backup.is_primary
            assert backup.read_entries() == []  # a backup may read
            with pytest.raises(NotPrimary, match="refused"):
                backup.insert(Entry(n.L2_FORWARD, {n.MF_DST_MAC: "02:00:00:00:00:01"}, n.FORWARD, {"port": 1}))
            with pytest.raises(NotPrimary):
                backup.push_pipeline(primary.p4info_path, primary.bmv2_json_path)
        primary.create_job(topo.jobs[0])  # the primary still writes
        assert len(primary.conn.read_entries(n.JOBS)) == 1
        with Controller(switch.addr, election_id=(0, 5), read_only=True, topology=topo) as reader:
            assert reader.reconcile().jobs == primary.jobs  # same id as the primary: no session, reads only
            with pytest.raises(ControllerError, match="read-only"):
                reader.delete_job(1)
        with pytest.raises(ElectionIdInUse, match="election id 0,5 is in use .* choose another with --election-id"):
            Controller(switch.addr, election_id=(0, 5))  # the primary's own id, from another client
        primary.delete_job(1)


def test_restarted_controller_reconciles_without_touching_running_jobs(switch, topo):
    with Controller(switch.addr, topology=topo) as first:
        first.push()
        first.install_forwarding()
        a = first.create_job(topo.jobs[0])
        b = first.create_job(JobSpec(2, {0: "w2_0", 1: "w2_1"}, "opt2", slots=100))
        first.remove_worker(2, 1)
        b = first.jobs[2]
    with SwitchConnection(switch.addr, election_id=(0, 1)) as probe:
        entries_before, groups_before = keyed(probe.read_entries()), groups(probe)
    with Controller(switch.addr, topology=topo) as second:
        rebuilt = second.reconcile()
        assert rebuilt.problems == [] and rebuilt.orphans == []
        assert second.jobs == {1: a, 2: b}  # slots, epochs, members, addresses, host names
        assert keyed(second.forwarding) == keyed(forwarding_entries(topo))  # l2_forward and the source guard
        assert keyed(second.conn.read_entries()) == entries_before and groups(second.conn) == groups_before
        c = second.create_job(JobSpec(3, {0: "w2_1"}, "spare", slots=50))
        assert not c.slots.overlaps(a.slots) and not c.slots.overlaps(b.slots)
        assert c.epoch not in (a.epoch, b.epoch)
        assert keyed(job_entries_on_switch(second.conn, 1)) == keyed(a.entries())
    with Controller(switch.addr, topology=topo) as third:  # no explicit reconcile: requests sync first
        assert third.job(3) == c
        third.delete_job(2)
        assert set(third.jobs) == {1, 3}


def test_leftovers_of_a_crashed_create_are_reported_and_cleaned(ctl, topo):
    from controller.jobs import new_job
    from controller.slots import SlotPool

    crashed = new_job(topo.jobs[1], topo, {}, SlotPool(), 0)
    for e in crashed.member_entries()[:3]:  # a controller died half way through a create
        ctl.conn.insert(e)
    ctl.conn.insert_group(crashed.mcast_group())
    with Controller(ctl.grpc_addr, election_id=(0, 2), topology=topo) as second:
        rebuilt = second.reconcile()
        assert list(rebuilt.jobs) == [] and len(rebuilt.orphans) == 3
        assert any("job 2, which has no job entry" in p for p in rebuilt.problems)
        assert [g.group_id for g in rebuilt.orphan_groups] == [258]
        job = second.create_job(topo.jobs[1])  # removes the leftovers first, then installs
        assert keyed(job_entries_on_switch(second.conn, 2)) == keyed(job.entries())
        assert groups(second.conn)[258] == job.mcast_group()
    with Controller(ctl.grpc_addr, election_id=(0, 3), topology=topo) as third:
        assert third.reconcile().problems == []


def test_workers_replace_add_remove(ctl, topo):
    ctl.create_job(topo.jobs[0])
    job = ctl.replace_worker(1, 1, "spare")
    assert job.workers[1].port == 20 and job.job_entry().params["workers"] == 3
    assert keyed(job_entries_on_switch(ctl.conn, 1)) == keyed(job.entries())
    assert groups(ctl.conn)[257].replicas == [(1, 33), (3, 35), (20, 34)]
    job = ctl.add_worker(1, 7, "w1_1")  # the freed port
    assert ctl.conn.read_entries(n.JOBS)[0].params["workers"] == 4
    assert (2, n.worker_rid(1, 7)) in groups(ctl.conn)[257].replicas
    job = ctl.remove_worker(1, 0)
    assert keyed(job_entries_on_switch(ctl.conn, 1)) == keyed(job.entries())
    assert sorted(job.workers) == [1, 2, 7] and ctl.conn.read_entries(n.JOBS)[0].params["workers"] == 3
    with pytest.raises(ControllerError, match="already owned by job 1"):
        ctl.create_job(JobSpec(2, {0: "w2_0"}, "spare"))
    with pytest.raises(ControllerError, match="has no worker 9"):
        ctl.remove_worker(1, 9)
    with pytest.raises(ControllerError, match="already has worker 7"):
        ctl.add_worker(1, 7, "w2_0")


def test_switch_restart_is_restored(switch, topo):
    with Controller(switch.addr, topology=topo, reconnect_timeout=20) as c:
        c.push()
        c.install_forwarding()
        job = c.create_job(topo.jobs[0])
        want, want_groups = keyed(c.conn.read_entries()), groups(c.conn)
        switch.restart()
        c.conn.client.stream_recv_thread.join(5)  # the old session ends with the process
        assert not c.conn.alive
        snap = c.stats()  # the next request reconnects, re-pushes and rewrites what was lost
        assert snap.jobs[1].grad_packets == 0
        assert c.pipeline_installed()
        assert keyed(c.conn.read_entries()) == want and groups(c.conn) == want_groups
        assert c.jobs[1] == job


def test_default_action_and_counter_cells(ctl, topo):
    conn = ctl.conn
    assert conn.read_default_action(n.L2_FORWARD).action == "MindpIngress.forwarding.unknown_destination"
    conn.set_default_action(n.L2_FORWARD, n.FLOOD, {"group": n.FLOOD_GROUP})
    assert conn.read_default_action(n.L2_FORWARD) == Entry(n.L2_FORWARD, {}, n.FLOOD, {"group": 1})
    with pytest.raises(SwitchError, match="parameter group missing"):
        conn.set_default_action(n.L2_FORWARD, n.FLOOD, {})
    cells = conn.read_counter(n.DROPS)
    assert len(cells) == n.DROP_CELLS and set(cells.values()) == {(0, 0)}
    assert conn.read_counter(n.GRAD_PACKETS, 5) == {5: (0, 0)}


def test_unreachable_switch_is_one_clear_error():
    addr = f"127.0.0.1:{targets.free_port()}"
    with pytest.raises(SwitchUnreachable, match=f"cannot reach the switch at {addr}"):
        Controller(addr, timeout=0.5)


def test_delete_tolerates_and_reports_missing_pieces(ctl, topo):
    job = ctl.create_job(topo.jobs[0])
    ctl.conn.delete_group(job.group)  # someone removed pieces behind the controller's back
    ctl.conn.delete(next(e for e in job.member_entries() if e.table == n.WORKERS))
    gone = ctl.delete_job(1)
    assert sorted(gone.missing) == sorted([f"multicast group {job.group}",
                                           f"workers {{'{n.MF_INGRESS_PORT}': 1, '{n.MF_JOB}': 1, '{n.MF_WORKER}': 0}}"])
    assert job_entries_on_switch(ctl.conn, 1) == [] and job.group not in groups(ctl.conn)
    assert ctl.create_job(topo.jobs[0]).job_id == 1  # not "already exists"
    assert ctl.delete_job(1).missing == []


def test_epochs_are_never_reused_across_controllers(switch, topo):
    """Each controller process learns the last epoch from the switch, so a recreated job never
    gets an epoch its cells may still hold (issue 11.8: it was only remembered in-process)."""
    seen = []
    for i in range(3):
        with Controller(switch.addr, topology=topo) as c:  # a fresh controller each time
            if i == 0:
                c.push()
                c.install_forwarding()
            job = c.create_job(topo.jobs[0])
            other = c.create_job(JobSpec(2, {0: "w2_0"}, "opt2", slots=16))  # e.g. on the freed slots
            assert c.conn.read_counter(n.EPOCH_GENERATION, 0)[0][0] == other.epoch
            seen += [job.epoch, other.epoch]
            c.delete_job(1)
            c.delete_job(2)
    assert len(set(seen)) == len(seen) and seen == sorted(seen)
