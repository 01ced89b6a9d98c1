"""controller/p4info_names.py agrees with the compiled P4Info and p4src/constants.p4."""
import re

import pytest
from google.protobuf import text_format
from p4.config.v1 import p4info_pb2

from controller import p4info_names as n
from mindp import protocol
from p4src import artifacts


@pytest.fixture(scope="module")
def p4info():
    info = p4info_pb2.P4Info()
    text_format.Parse(artifacts.P4INFO.read_text(), info)
    return info


def generated_switch_p4():
    from p4src import gen_p4
    text = gen_p4.render()["switch.p4"]
    defs = {m[0]: int(m[1]) for m in re.findall(r"#define\s+(\w+)\s+(\d+)", text)}
    drops = {m[0]: int(m[1]) for m in re.findall(r"const bit<8> DROP_(\w+)\s*=\s*(\d+);", text)}
    return defs, drops


def test_sizes_and_drop_reasons_reach_the_p4_from_one_module():
    defs, drops = generated_switch_p4()
    assert (defs["POOL_SLOTS"], defs["POOL_CELLS"], defs["MAX_JOBS"]) == (n.POOL_SLOTS, 2 * n.POOL_SLOTS, n.MAX_JOBS)
    assert (defs["DROP_REASONS"], defs["DROP_CELLS"]) == (n.DROP_REASONS, (n.MAX_JOBS + 1) * n.DROP_REASONS)
    assert {r.name: r.value for r in n.DropReason} == drops
    assert n.MAX_WORKERS == protocol.MAX_WORKERS
    hand_written = (artifacts.HERE / "constants.p4").read_text()
    assert "DROP_" not in hand_written and not re.search(r"#define\s+\w+\s+\d", hand_written)  # no second copy


def test_compiled_program_has_the_sizes_of_the_module():
    import json
    cfg = json.loads(artifacts.BMV2_JSON.read_text())
    regs = {r["name"]: r["size"] for r in cfg["register_arrays"]}
    counters = {c["name"]: c["size"] for c in cfg["counter_arrays"]}
    assert regs[n.CELL_BITMAP] == regs[n.CELL_ACC.format(0)] == n.POOL_CELLS
    assert regs[n.JOB_NEWEST_STEP] == regs[n.JOB_PROGRESS_EPOCH] == n.MAX_JOBS
    assert counters[n.DROPS] == n.DROP_CELLS and counters[n.EPOCH_GENERATION] == 1


def test_tables_match_fields_and_actions_exist(p4info):
    actions = {a.preamble.id: a for a in p4info.actions}
    tables = {t.preamble.name: t for t in p4info.tables}
    assert set(n.TABLES) == set(tables)
    expect = {
        n.L2_FORWARD: ([n.MF_DST_MAC], {n.FORWARD: ["port"], n.FLOOD: ["group"]}),
        n.SOURCES: ([n.MF_INGRESS_PORT, n.MF_SRC_MAC, n.MF_SRC_IP], {n.ALLOW: []}),
        n.JOBS: ([n.MF_JOB], {n.SET_JOB: list(n.SET_JOB_PARAMS)}),
        n.WORKERS: ([n.MF_INGRESS_PORT, n.MF_JOB, n.MF_WORKER], {n.ADMIT_WORKER: [], n.ADMIT_CHILD: ["max_nworkers"]}),
        n.OPTIMIZERS: ([n.MF_INGRESS_PORT, n.MF_JOB], {n.ADMIT: []}),
        n.PARAM_REWRITE: ([n.MF_EGRESS_RID], {n.SET_WORKER_ADDRESS: ["mac", "ip"]}),
    }
    for name, (fields, acts) in expect.items():
        t = tables[name]
        assert [mf.name for mf in t.match_fields] == fields
        assert all(mf.match_type == p4info_pb2.MatchField.EXACT for mf in t.match_fields)
        refs = {actions[r.id].preamble.name: [p.name for p in actions[r.id].params]
                for r in t.action_refs if r.scope != p4info_pb2.ActionRef.DEFAULT_ONLY}
        assert refs == acts, name
    sizes = {name: tables[name].size for name in n.TABLES}
    assert sizes[n.JOBS] == n.MAX_JOBS


def test_shard_routes_carry_their_last_chunk_as_wide_as_the_chunk(p4info):
    """to_shard's hi bounds a PARAM of several chunks (controller.jobs writes the range's hi)."""
    table = next(t for t in p4info.tables if t.preamble.name == n.SHARDS)
    chunk = next(mf for mf in table.match_fields if mf.name == n.MF_CHUNK)
    action = next(a for a in p4info.actions if a.preamble.name == n.TO_SHARD)
    assert chunk.match_type == p4info_pb2.MatchField.RANGE
    assert [(p.name, p.bitwidth) for p in action.params] == [("port", 9), ("mac", 48), ("ip", 32), ("hi", chunk.bitwidth)]


def test_address_params_and_fields_are_48_and_32_bits(p4info):
    widths = {p.name: p.bitwidth for a in p4info.actions for p in a.params}
    widths.update({mf.name: mf.bitwidth for t in p4info.tables for mf in t.match_fields})
    assert all(widths[p] == 48 for p in n.MAC_PARAMS)
    assert all(widths[p] == 32 for p in n.IP_PARAMS)


def test_counters_exist_with_the_sizes_the_stats_index(p4info):
    counters = {c.preamble.name: c.size for c in p4info.counters}
    for name in n.JOB_COUNTERS:
        assert counters[name] == n.MAX_JOBS, name
    assert counters[n.DROPS] == n.DROP_CELLS
    assert n.drop_cell(n.NO_JOB_ROW, max(n.DropReason)) < n.DROP_CELLS


def test_group_and_rid_numbering_is_unique_and_invertible():
    rids = {n.worker_rid(j, w) for j in range(n.MAX_JOBS) for w in range(n.MAX_WORKERS)}
    assert len(rids) == n.MAX_JOBS * n.MAX_WORKERS and 0 not in rids
    assert all(n.rid_worker(n.worker_rid(j, w)) == (j, w) for j in (0, 5, 63) for w in (0, 31))
    assert n.rid_worker(0) is None and n.rid_worker(n.MAX_JOBS * n.MAX_WORKERS + 1) is None
    groups = {n.job_group(j) for j in range(n.MAX_JOBS)}
    assert n.FLOOD_GROUP not in groups and len(groups) == n.MAX_JOBS
    assert n.group_job(n.FLOOD_GROUP) is None and n.group_job(n.job_group(7)) == 7
