"""A hostile BMv2 JSON sent through SetForwardingPipelineConfig executes nothing.

The compiler turns the JSON into Python source; names and ids from the JSON must
never become code. Every name category is renamed to text that would run a payload
(touch a marker file, set a builtin) if it reached the source; ids, widths and sizes
are given wrong types and absurd values. Over real gRPC the switch answers a clean
INVALID_ARGUMENT (or loads the program correctly where the name is only data), the
payload never runs, and the pipeline set before keeps serving."""
import builtins
import copy
import json

import grpc
import pytest
from p4.v1 import p4runtime_pb2

from mindp import targets
from p4src import artifacts
from softswitch import compiler
from softswitch.compiler_errors import ProgramError
from softswitch.engine import Engine
from softswitch.native import cprogram
from softswitch.p4runtime_server import Server, SwitchService

from . import compiled
from .p4rt_client import L2, Client, ids, l2_update, p4info, source_update

MARK_GLOBAL = "MINDP_HOSTILE_PAYLOAD_RAN"
# v1model's fixed names: renaming them makes a program that is not v1model, tested separately
FIXED = {"standard_metadata", "ingress", "egress", "$valid$"}


def payload(marker) -> str:
    """Text that runs code if pasted into generated source after a def line or in a comment."""
    code = f"__import__('builtins').{MARK_GLOBAL} = __import__('pathlib').Path({str(marker)!r}).touch() or 1"
    return "'\"\\\n    pass\n" + code + "\ndef _hostile(*_):  #"


def program(name: str) -> dict:
    path = artifacts.BMV2_JSON if name == "mindp" else compiled.json_path(name)
    return json.loads(path.read_text())


def p4info_of(name: str):
    return p4info(artifacts.P4INFO if name == "mindp" else compiled.p4info_path(name))


def standard_fields(j) -> set:
    ht = next(h for h in j["header_types"] if h["name"] == "standard_metadata")
    return {f[0] for f in ht["fields"]}


def names_of(j, category: str) -> set:
    """The names of one category in a BMv2 JSON."""
    pipes = j["pipelines"]
    found = {
        "header_types": lambda: [h["name"] for h in j["header_types"]],
        "headers": lambda: [h["name"] for h in j["headers"]],
        "fields": lambda: [f[0] for h in j["header_types"] if h["name"] != "standard_metadata" for f in h["fields"]],
        "header_stacks": lambda: [s["name"] for s in j["header_stacks"]],
        "actions": lambda: [a["name"] for a in j["actions"]],
        "runtime_data": lambda: [r["name"] for a in j["actions"] for r in a["runtime_data"]],
        "tables": lambda: [t["name"] for p in pipes for t in p["tables"]],
        "conditionals": lambda: [c["name"] for p in pipes for c in p["conditionals"]],
        "parser_states": lambda: [s["name"] for p in j["parsers"] for s in p["parse_states"]],
        "parsers_deparsers": lambda: [p["name"] for p in j["parsers"] + j["deparsers"]],
        "registers": lambda: [r["name"] for r in j["register_arrays"]],
        "counters": lambda: [c["name"] for c in j["counter_arrays"]],
        "calculations": lambda: [c["name"] for c in j["calculations"]],
        "checksums": lambda: [c["name"] for c in j["checksums"]],
        "errors": lambda: [e[0] for e in j["errors"]],
    }[category]()
    return set(found) - FIXED - standard_fields(j)


def rename(obj, mapping: dict, keys: bool = False):
    """Every string value that is a name in `mapping` replaced, consistently (and the keys of
    next_tables, which are action names)."""
    if isinstance(obj, str):
        return mapping.get(obj, obj)
    if isinstance(obj, list):
        return [rename(x, mapping) for x in obj]
    if isinstance(obj, dict):
        return {(mapping.get(k, k) if keys else k): rename(v, mapping, k == "next_tables") for k, v in obj.items()}
    return obj


def rename_p4info(info, mapping: dict):
    info = copy.deepcopy(info)
    for group in (info.tables, info.actions, info.counters, info.direct_counters, info.registers):
        for ent in group:
            ent.preamble.name = mapping.get(ent.preamble.name, ent.preamble.name)
    return info


NAME_CASES = [("features", c) for c in ("header_types", "headers", "fields", "actions", "runtime_data", "tables",
                                        "conditionals", "parser_states", "parsers_deparsers", "registers",
                                        "counters", "calculations", "checksums", "errors")]
NAME_CASES += [("stacks", "header_stacks"), ("parser", "parser_states"), ("mindp", "actions"), ("mindp", "registers")]


def _set(path, value):
    def mutate(j):
        obj = j
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
    return mutate


def _first_action_with_params(j):
    return next(i for i, a in enumerate(j["actions"]) if a["runtime_data"])


def bad_cases(marker):
    p = payload(marker)
    return [
        ("action id with code", _set(["actions", 0, "id"], "0(f, a):" + p)),
        ("action id a string", _set(["actions", 0, "id"], "0")),
        ("action id a float", _set(["actions", 0, "id"], 1.5)),
        ("action id a bool", _set(["actions", 0, "id"], True)),
        ("action id negative", _set(["actions", 0, "id"], -1)),
        ("table id with code", lambda j: j["pipelines"][0]["tables"][0].__setitem__("id", "0" + p)),
        ("table action_ids with code", lambda j: j["pipelines"][0]["tables"][0]["action_ids"].__setitem__(0, "1" + p)),
        ("parser state id with code", _set(["parsers", 0, "parse_states", 0, "id"], "0" + p)),
        ("calculation id with code", _set(["calculations", 0, "id"], "0" + p)),
        ("header id a string", _set(["headers", 1, "id"], "1")),
        ("error code with code", _set(["errors", 1, 1], "1" + p)),
        ("runtime_data index with code", lambda j: j["actions"][_first_action_with_params(j)]["primitives"][0]
         ["parameters"][1].__setitem__("value", "0]" + p)),
        ("huge field width", _set(["header_types", 1, "fields", 0, 1], 10 ** 7)),
        ("field width 2**40", _set(["header_types", 1, "fields", 0, 1], 1 << 40)),
        ("negative field width", _set(["header_types", 1, "fields", 0, 1], -8)),
        ("field width a string", _set(["header_types", 1, "fields", 0, 1], "48" + p)),
        ("huge register size", _set(["register_arrays", 0, "size"], 1 << 40)),
        ("register width with code", _set(["register_arrays", 0, "bitwidth"], "32" + p)),
        ("huge register width", _set(["register_arrays", 0, "bitwidth"], 10 ** 6)),
        ("huge counter size", _set(["counter_arrays", 0, "size"], 1 << 40)),
        ("huge runtime_data width", lambda j: j["actions"][_first_action_with_params(j)]["runtime_data"][0]
         .__setitem__("bitwidth", 10 ** 8)),
        ("hexstr with code", lambda j: j["parsers"][0]["parse_states"][0]["transitions"][0]
         .__setitem__("value", "0x0800" + p)),
        ("huge hexstr", lambda j: j["parsers"][0]["parse_states"][0]["transitions"][0]
         .__setitem__("value", "0x" + "f" * 100000)),
        ("hash algorithm with code", _set(["calculations", 0, "algo"], "crc16" + p)),
        ("primitive op with code", lambda j: j["actions"][0]["primitives"].append({"op": "exit" + p, "parameters": []})),
        ("match kind with code", lambda j: next(t for t in j["pipelines"][0]["tables"] if t["key"])["key"][0]
         .__setitem__("match_type", "lpm" + p)),
        ("name a number", _set(["actions", 0, "name"], 12)),
        ("name a list", _set(["pipelines", 0, "tables", 0, "name"], ["a", p])),
        ("pipelines not a list", _set(["pipelines"], {"ingress": p})),
        ("deeply nested expression", lambda j: j["pipelines"][0]["conditionals"][0].__setitem__(
            "expression", json.loads('{"type": "expression", "value": ' * 500 + '{}' + "}" * 500))),
        ("pipeline name with code", _set(["pipelines", 0, "name"], "ingress" + p)),
    ]


@pytest.fixture
def marker(tmp_path):
    m = tmp_path / "payload-ran"
    yield m
    ran = m.exists() or hasattr(builtins, MARK_GLOBAL)
    if hasattr(builtins, MARK_GLOBAL):
        delattr(builtins, MARK_GLOBAL)
    assert not ran, "a payload from the JSON was executed"


@pytest.fixture
def serving():
    """An embedded switch serving the mindp program, with one L2 entry written (and the source guard
    entry of the probe frame's sender: port 1, 02:00:00:00:00:09, 0.0.0.0)."""
    srv = Server(SwitchService(Engine()), f"127.0.0.1:{targets.free_port()}")
    srv.start()
    c = Client(srv.addr, 1)
    c.set_pipeline()
    c.write(l2_update(p4info(), 0x020000000005, 5), source_update(p4info(), 1, 0x020000000009, 0))
    yield srv, c
    c.close()
    srv.stop()


def push(c: Client, info, json_bytes: bytes, action):
    req = c.eid(p4runtime_pb2.SetForwardingPipelineConfigRequest(device_id=0))
    req.action = action
    req.config.p4info.CopyFrom(info)
    req.config.p4_device_config = json_bytes
    return c.stub.SetForwardingPipelineConfig(req)


def assert_old_pipeline_serves(srv, c: Client) -> None:
    cfg = c.stub.GetForwardingPipelineConfig(p4runtime_pb2.GetForwardingPipelineConfigRequest(device_id=0)).config
    assert cfg.p4_device_config == artifacts.BMV2_JSON.read_bytes()
    tid, _ = ids(p4info())
    ent = p4runtime_pb2.Entity()
    ent.table_entry.table_id = tid
    (got,) = c.read(ent)
    assert got.table_entry.match[0].exact.value == (0x020000000005).to_bytes(6, "big")
    frame = bytes.fromhex("020000000005" "020000000009" "0800") + bytes(40)
    assert [p for p, _ in srv.service.engine.process(frame, 1)] == [5], "the L2 entry still forwards"
    assert srv.service.engine.program.tables[L2].entries


VERIFY = p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY
VERIFY_AND_COMMIT = p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT
FRAMES = [bytes.fromhex("0202020202020303030303030800" "4500001400000000400066e80a0000010a000002"),  # IPv4
          bytes.fromhex("0202020202020303030303030800" "450000140000000040fd65eb0a0000010a000002") + b"\x12\x34",
          bytes.fromhex("0202020202020303030303030806") + bytes(30)]


@pytest.mark.parametrize("prog,category", NAME_CASES, ids=[f"{p}-{c}" for p, c in NAME_CASES])
def test_hostile_names_are_data_not_code(prog, category, marker, serving):
    """Consistently renamed (JSON and P4Info), the program is valid: VERIFY accepts it without
    running anything and leaves the old pipeline; committed, it forwards as the original does."""
    srv, c = serving
    j = program(prog)
    names = names_of(j, category)
    assert names, f"{prog} has no {category}"
    mapping = {n: n + payload(marker) for n in names}
    hostile = json.dumps(rename(j, mapping)).encode()
    info = rename_p4info(p4info_of(prog), mapping)
    push(c, info, hostile, VERIFY)
    assert_old_pipeline_serves(srv, c)
    push(c, info, hostile, VERIFY_AND_COMMIT)
    reference = Engine(compiler.load(json.dumps(program(prog))))
    for port, frame in enumerate(FRAMES, start=1):
        assert srv.service.engine.process(frame, port) == reference.process(frame, port)


@pytest.mark.parametrize("prog", ["features", "mindp"])
def test_hostile_names_with_the_original_p4info_are_refused(prog, marker, serving):
    """Tables and actions renamed in the JSON only: the P4Info check refuses it, after a compile
    that ran nothing."""
    srv, c = serving
    j = program(prog)
    mapping = {n: n + payload(marker) for n in names_of(j, "tables") | names_of(j, "actions")}
    hostile = json.dumps(rename(j, mapping)).encode()
    for action in (VERIFY, VERIFY_AND_COMMIT):
        with pytest.raises(grpc.RpcError) as e:
            push(c, p4info_of(prog), hostile, action)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert_old_pipeline_serves(srv, c)


def test_malformed_programs_are_invalid_argument_over_grpc(marker, serving):
    srv, c = serving
    info = p4info(compiled.p4info_path("features"))
    for what, mutate in bad_cases(marker):
        j = program("features")
        mutate(j)
        for action in (VERIFY, VERIFY_AND_COMMIT):
            with pytest.raises(grpc.RpcError) as e:
                push(c, info, json.dumps(j).encode(), action)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (what, e.value.details())
            assert "\n" not in e.value.details(), what
        assert_old_pipeline_serves(srv, c)


# --- at the compiler -----------------------------------------------------------------
@pytest.mark.parametrize("index", range(len(bad_cases("m"))), ids=[w for w, _ in bad_cases("m")])
def test_compiler_refuses_malformed_programs(index, marker):
    what, mutate = bad_cases(marker)[index]
    j = program("features")
    mutate(j)
    with pytest.raises(ProgramError) as e:
        compiler.load(json.dumps(j))
    assert len(str(e.value)) < 400 and "\n" not in str(e.value), what


def test_generated_source_holds_no_json_text(marker):
    """Every name renamed at once: none of them, nor any piece of the payload, is in the source."""
    j = program("features")
    every = set()
    for category in ("header_types", "headers", "fields", "actions", "runtime_data", "tables", "conditionals",
                     "parser_states", "parsers_deparsers", "registers", "counters", "calculations", "checksums"):
        every |= names_of(j, category)
    mapping = {n: f"N{i}" + payload(marker) for i, n in enumerate(sorted(every))}
    prog = compiler.load(json.dumps(rename(j, mapping)))
    assert "hostile" not in prog.source and "pathlib" not in prog.source and "'\"" not in prog.source
    for i in range(len(mapping)):
        assert f"N{i}'" not in prog.source
    assert set(prog.tables) == {mapping[t] for t in names_of(j, "tables")}, "names kept as data"
    c_source, _ = cprogram.generate(prog)  # nor in the C of the compiled pipeline
    assert "hostile" not in c_source and "pathlib" not in c_source
    for i in range(len(mapping)):
        assert f"N{i}'" not in c_source


def test_registers_whose_names_differ_only_in_punctuation_are_separate():
    """`a.b` and `a_b` were one Python identifier once: two arrays must stay two."""
    j = program("features")
    reg = j["register_arrays"][0]
    twin = dict(reg, name=reg["name"].replace(".", "_"), id=reg["id"] + 1)
    j["register_arrays"].append(twin)
    prog = compiler.load(json.dumps(j))
    assert prog.registers[reg["name"]] is not prog.registers[twin["name"]]
    eng = Engine(prog)
    eng.process(FRAMES[0], 1)
    assert sum(prog.registers[reg["name"]]) == 1 and sum(prog.registers[twin["name"]]) == 0
