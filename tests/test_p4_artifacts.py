"""The committed P4 programs (one per committed K) are current, and agree with mindp/protocol.py."""
import json
import pathlib
import shutil
import tempfile

import pytest

from mindp import protocol as P
from p4src import artifacts, gen_p4

COMMITTED = [artifacts.program(k) for k in artifacts.COMMITTED_K]
ids = [f"k{p.k}" for p in COMMITTED]


def test_committed_ks_are_the_hardware_size_and_the_default():
    assert artifacts.COMMITTED_K == tuple(sorted({P.HARDWARE_K, P.DEFAULT_K}))


@pytest.mark.parametrize("prog", COMMITTED, ids=ids)
def test_committed_artifacts_match_sources(prog):
    assert artifacts.recorded_hash(k=prog.k) == artifacts.source_hash(k=prog.k), \
        f"P4 sources changed: run `make p4 K={prog.k}` and commit p4src/compiled/k{prog.k}/"


def test_source_hash_sees_any_change():
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp) / "p4src"
        shutil.copytree(artifacts.HERE, root, ignore=shutil.ignore_patterns("compiled", "build", "__pycache__"))
        before = artifacts.source_hash(root, 32)
        assert artifacts.source_hash(root, 64) != before  # K is part of the program
        path = root / "aggregation.p4"
        path.write_text(path.read_text() + "\n")
        assert artifacts.source_hash(root, 32) != before


def test_p4c_options_follow_k_and_are_part_of_the_hash(monkeypatch):
    # LocalCopyPropagation stays where BMv2 runs the program and goes above (its time grows ~K^2.8)
    assert "P4::LocalCopyPropagation" not in artifacts.p4c_flags(P.BMV2_MAX_K)
    assert "P4::LocalCopyPropagation" in artifacts.p4c_flags(P.BMV2_MAX_K + 8)
    assert "SimplifyDefUse" in artifacts.p4c_flags(P.HARDWARE_K)
    before = artifacts.source_hash(k=P.HARDWARE_K)
    monkeypatch.setattr(artifacts, "P4C_FLAGS", artifacts.P4C_FLAGS + ("--Wdisable",))
    assert artifacts.source_hash(k=P.HARDWARE_K) != before  # other options, another program


def test_generator_refuses_a_k_beyond_the_protocol_bound(capsys, tmp_path):
    with pytest.raises(SystemExit):
        gen_p4.main(["--k", str(P.MAX_K + 1), "--out", str(tmp_path)])
    assert "--k must be between 1 and" in capsys.readouterr().err


def bmv2_json(prog):
    return json.loads(prog.json.read_text())


@pytest.mark.parametrize("prog", COMMITTED, ids=ids)
def test_compiled_header_layout_matches_protocol(prog):
    cfg = bmv2_json(prog)
    types = {t["name"]: t for t in cfg["header_types"]}
    mindp = [(f[0], f[1]) for f in types["mindp_t"]["fields"]]
    assert mindp == list(P.HEADER_FIELDS)
    assert [f[1] for f in types["fp16_chunk_t"]["fields"]] == [16] * prog.k
    assert [f[1] for f in types["sum_chunk_t"]["fields"]] == [64] * prog.k
    assert artifacts.program_k(cfg) == prog.k


@pytest.mark.parametrize("prog", COMMITTED, ids=ids)
def test_compiled_parser_uses_the_protocol_port_and_kinds(prog):
    parser = bmv2_json(prog)["parsers"][0]
    states = {s["name"]: s for s in parser["parse_states"]}
    udp_values = {int(t["value"], 16) for t in states["parse_udp"]["transitions"] if t["type"] != "default"}
    assert udp_values == {P.UDP_PORT}
    kinds = {int(t["value"], 16) for t in states["parse_mindp"]["transitions"] if t["type"] != "default"}
    assert kinds == {P.Kind.GRAD, P.Kind.PARAM, P.Kind.PARTIAL}


@pytest.mark.parametrize("prog", COMMITTED, ids=ids)
def test_one_accumulator_register_per_element(prog):
    regs = {r["name"]: r for r in bmv2_json(prog)["register_arrays"]}
    accs = [n for n in regs if n.startswith("MindpIngress.aggregation.acc_")]
    assert len(accs) == prog.k
    assert {regs[n]["bitwidth"] for n in accs} == {64}
    assert {regs[n]["size"] for n in accs} == {2 * 1024}


@pytest.mark.skipif(artifacts.find_p4c() is None, reason="p4c-bm2-ss not installed (PATH or /opt/p4tools/bin)")
def test_recompiling_reproduces_the_committed_artifacts(tmp_path):
    prog = artifacts.program(P.HARDWARE_K)
    artifacts.compile_program(artifacts.find_p4c(), artifacts.MAIN, tmp_path / "m.json", tmp_path / "m.p4info.txtpb",
                              prog.k)
    assert (tmp_path / "m.p4info.txtpb").read_text() == prog.p4info.read_text()
    fresh, committed = json.loads((tmp_path / "m.json").read_text()), bmv2_json(prog)
    for key in ("header_types", "parsers", "deparsers", "actions", "pipelines", "register_arrays", "counter_arrays"):
        assert fresh[key] == committed[key], key
