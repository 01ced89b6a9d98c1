"""The committed P4 artifacts are current, and agree with mindp/protocol.py."""
import json
import pathlib
import shutil
import tempfile

import pytest

from mindp import protocol as P
from p4src import artifacts, gen_p4


def test_generated_p4_is_current():
    for name, text in gen_p4.render().items():
        assert (artifacts.HERE / "generated" / name).read_text() == text, f"run `make p4`: generated/{name} is stale"


def test_committed_artifacts_match_sources():
    assert artifacts.recorded_hash() == artifacts.source_hash(), "P4 sources changed: run `make p4` and commit"


def test_source_hash_sees_any_change():
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp) / "p4src"
        shutil.copytree(artifacts.HERE, root, ignore=shutil.ignore_patterns("compiled", "__pycache__"))
        before = artifacts.source_hash(root)
        path = root / "aggregation.p4"
        path.write_text(path.read_text() + "\n")
        assert artifacts.source_hash(root) != before


def bmv2_json():
    return json.loads(artifacts.BMV2_JSON.read_text())


def test_compiled_header_layout_matches_protocol():
    types = {t["name"]: t for t in bmv2_json()["header_types"]}
    mindp = [(f[0], f[1]) for f in types["mindp_t"]["fields"]]
    assert mindp == list(P.HEADER_FIELDS)
    assert [f[1] for f in types["fp16_chunk_t"]["fields"]] == [16] * P.K
    assert [f[1] for f in types["sum_chunk_t"]["fields"]] == [64] * P.K


def test_compiled_parser_uses_the_protocol_port_and_kinds():
    parser = bmv2_json()["parsers"][0]
    states = {s["name"]: s for s in parser["parse_states"]}
    udp_values = {int(t["value"], 16) for t in states["parse_udp"]["transitions"] if t["type"] != "default"}
    assert udp_values == {P.UDP_PORT}
    kinds = {int(t["value"], 16) for t in states["parse_mindp"]["transitions"] if t["type"] != "default"}
    assert kinds == {P.Kind.GRAD, P.Kind.PARAM, P.Kind.PARTIAL}


def test_one_accumulator_register_per_element():
    regs = {r["name"]: r for r in bmv2_json()["register_arrays"]}
    accs = [n for n in regs if n.startswith("MindpIngress.aggregation.acc_")]
    assert len(accs) == P.K
    assert {regs[n]["bitwidth"] for n in accs} == {64}
    assert {regs[n]["size"] for n in accs} == {2 * 1024}


@pytest.mark.skipif(artifacts.find_p4c() is None, reason="p4c-bm2-ss not installed (PATH or /opt/p4tools/bin)")
def test_recompiling_reproduces_the_committed_artifacts(tmp_path):
    artifacts.compile_program(artifacts.find_p4c(), artifacts.MAIN, tmp_path / "m.json", tmp_path / "m.p4info.txtpb")
    assert (tmp_path / "m.p4info.txtpb").read_text() == artifacts.P4INFO.read_text()
    fresh, committed = json.loads((tmp_path / "m.json").read_text()), bmv2_json()
    for key in ("header_types", "parsers", "deparsers", "actions", "pipelines", "register_arrays", "counter_arrays"):
        assert fresh[key] == committed[key], key
