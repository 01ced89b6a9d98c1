"""The executor on small compiled P4 programs: every construct, checked frame by
frame against an independent Python model of P4_16/v1model semantics."""
import json
import struct
import zlib

import numpy as np
import pytest

from mindp import codec
from mindp.fixedpoint import exact_sum
from mindp.protocol import K, Kind
from p4src import artifacts
from softswitch import compiler, hashing
from softswitch.compiler_errors import ProgramError, UnsupportedConstruct
from softswitch.engine import Engine
from softswitch.tables import TableError

from . import compiled
from .engines import MAC_A, MAC_B, engine, entry, expr_vectors, feat_engine, feat_frame, s, u


def fields(data: bytes, spec):
    """Unpack big-endian bit fields: spec = [(name, width, signed)]."""
    total = sum(w for _, w, _ in spec)
    v = int.from_bytes(data[: total // 8], "big")
    out, shift = {}, total
    for name, w, signed in spec:
        shift -= w
        x = (v >> shift) & ((1 << w) - 1)
        if signed and x >> (w - 1):
            x -= 1 << w
        out[name] = x
    return out


# --- expressions ---------------------------------------------------------------
EXPR_OUT = [("add", 16, 0), ("sub", 16, 0), ("mul", 16, 0), ("shl_c", 16, 0), ("shl_r", 16, 0),
            ("shr_r", 16, 0), ("sshr_r", 16, 1), ("cmp", 8, 0), ("tern", 16, 0), ("cat", 32, 0),
            ("slice", 8, 0), ("trunc", 8, 0), ("sext", 32, 1), ("neg", 16, 0), ("sat_add", 16, 0),
            ("ssat_sub", 16, 1), ("xor_or", 16, 0), ("sadd", 16, 1), ("wide_shl", 16, 0), ("nib", 4, 0),
            ("nib2", 4, 0)]


def expected_exprs(a, b, sv, t, n):
    return {
        "add": u(a + b, 16), "sub": u(a - b, 16), "mul": u(a * b, 16), "shl_c": u(a << 3, 16),
        "shl_r": u(a << n, 16), "shr_r": a >> n, "sshr_r": sv >> n,
        "cmp": (sv < t) | (a < b) << 1 | (sv >= 0) << 2 | (a == b) << 3,
        "tern": max(a, b), "cat": a << 16 | b, "slice": (a >> 4) & 0xFF, "trunc": b & 0xFF, "sext": sv,
        "neg": u(~a, 16), "sat_add": min(a + b, 0xFFFF), "ssat_sub": max(-32768, min(32767, sv - t)),
        "xor_or": (a ^ b) | 0x101, "sadd": s(sv + t, 16), "wide_shl": u(u(a << n, 64) >> 8, 16),
        "nib": u((a & 15) + (b & 15), 4), "nib2": u(n - 1, 4),
    }


def test_expressions_match_p4_semantics():
    eng = engine("exprs")
    for a, b, sv, t, n in expr_vectors():
        payload = struct.pack("!HHhhBB", a, b, sv, t, n, 0)
        frame = MAC_A + MAC_B + b"\x88\xb5" + payload + b"tail"
        out = eng.process(frame, 3)
        assert [p for p, _ in out] == [3]
        data = out[0][1]
        assert data[:24] == frame[:24], "input headers re-emitted unchanged"
        got = fields(data[24:], EXPR_OUT)
        assert got == expected_exprs(a, b, sv, t, n), (a, b, sv, t, n)
        assert data[24 + 40:] == b"tail", "unparsed payload follows the deparsed headers"


def test_frame_without_the_header_is_forwarded_unchanged():
    eng = engine("exprs")
    frame = MAC_A + MAC_B + b"\x08\x00" + bytes(range(40))
    assert eng.process(frame, 1) == [(1, frame)]


# --- parser ---------------------------------------------------------------------
RES = [("err", 8, 0), ("valid", 8, 0), ("mval", 8, 0), ("la", 16, 0)]
ERR_NONE, ERR_SHORT, ERR_BADLEN = 0, 1, 2


def parse_case(eng, src_low, etype, rest):
    frame = MAC_A + MAC_B[:5] + bytes([src_low]) + struct.pack("!H", etype) + rest
    out = eng.process(frame, 2)
    assert len(out) == 1 and out[0][0] == 2, "a parser error does not drop the packet"
    data = out[0][1]
    assert data[:14] == frame[:14]
    return fields(data[14:], RES), data[19:]


@pytest.mark.parametrize("src_low,etype,rest,err,valid,mval,la,tail", [
    # masked select: src low nibble 1 -> tag; kind 1 -> opt
    (0x21, 0x88B5, bytes([0x13, 7]) + b"\xbe\xef" + b"pp", ERR_NONE, 1 | 2, 8, 0, bytes([0x13, 7]) + b"\xbe\xef" + b"pp"),
    # kind 2 &&& 2 matches kind 6 -> big
    (0x01, 0x88B5, bytes([0x62, 9]) + bytes(8) + b"x", ERR_NONE, 1 | 4, 10, 0, bytes([0x62, 9]) + bytes(8) + b"x"),
    # kind 4 -> default accept, rest is payload
    (0x01, 0x88B5, bytes([0x40, 1]) + b"zz", ERR_NONE, 1, 2, 0, bytes([0x40, 1]) + b"zz"),
    # low nibble 2: no match -> accept right after ethernet
    (0x02, 0x88B5, bytes([0x13, 7]) + b"\xbe\xef", ERR_NONE, 0, 0, 0, bytes([0x13, 7]) + b"\xbe\xef"),
    # verify(len != 15) fails: BadLen, tag stays valid, mval was set before the verify
    (0x01, 0x88B5, bytes([0x1F, 4]) + b"\xbe\xef", ERR_BADLEN, 1, 5, 0, bytes([0x1F, 4]) + b"\xbe\xef"),
    # opt cut short: PacketTooShort, tag valid, opt invalid, the short byte is payload
    (0x01, 0x88B5, bytes([0x13, 7]) + b"\xbe", ERR_SHORT, 1, 8, 0, bytes([0x13, 7]) + b"\xbe"),
    # lookahead + advance: la = first 16 bits, then opt is the next 16 bits
    (0x00, 0x88B6, b"\xca\xfe\x12\x34" + b"pl", ERR_NONE, 2, 0, 0xCAFE, b"\x12\x34pl"),
    # lookahead beyond the end: PacketTooShort
    (0x00, 0x88B6, b"\xca", ERR_SHORT, 0, 0, 0, b"\xca"),
])
def test_parser(src_low, etype, rest, err, valid, mval, la, tail):
    got, after = parse_case(engine("parser"), src_low, etype, rest)
    assert got == {"err": err, "valid": valid, "mval": mval, "la": la}
    assert after == tail


def test_lookahead_error_code_belongs_to_its_program():
    """Loading another program with other error codes leaves this one's PacketTooShort alone
    (the code was once module state, set by whichever program loaded last)."""
    eng = engine("parser")
    j = json.loads(compiled.json_path("parser").read_text())
    j["errors"] = [[name, 9 if name == "PacketTooShort" else code] for name, code in j["errors"]]
    other = Engine(compiler.load(json.dumps(j)))
    assert parse_case(other, 0x00, 0x88B6, b"\xca")[0]["err"] == 3, "code 9 is none the program names"
    assert parse_case(eng, 0x00, 0x88B6, b"\xca")[0]["err"] == ERR_SHORT


def test_truncated_ethernet_is_a_parser_error_not_a_crash():
    eng = engine("parser")
    out = eng.process(b"\x02\x00\x00", 1)
    assert len(out) == 1 and fields(out[0][1], RES)["err"] == ERR_SHORT
    assert eng.stats.errors == 0


# --- header stacks ------------------------------------------------------------------
def stacks_model(labels: bytes, payload: bytes, etype: int = 0x88B6):
    """P4_16/v1model semantics of programs/stacks.p4, written out: the frame it must emit."""
    parsed, err, last, rest = [], 0, 0, labels + payload
    if etype == 0x88B6:
        while True:
            if len(parsed) == 4:
                err = 0xEE  # StackOutOfBounds: extract(next) past the end
                break
            if not rest:
                err = 0x55  # PacketTooShort
                break
            b, rest = rest[0], rest[1:]
            parsed.append((b >> 1, b & 1))
            last = len(parsed) - 1
            if b & 1:
                break
    length = 14 + len(labels) + len(payload)
    stack = parsed + [None] * (4 - len(parsed))
    first = stack[0][0] if stack[0] else None
    if first in (1, 2):
        stack = stack[first:] + [None] * first
    elif first == 3:
        stack = [(9, 0)] + stack[:3]
    src = (length << 32) | sum(1 << (16 + i) for i, e in enumerate(stack) if e) | (err << 8) | last
    body = bytes((v << 1) | bos for v, bos in (e for e in stack if e))
    return MAC_A + src.to_bytes(6, "big") + etype.to_bytes(2, "big") + body + rest


@pytest.mark.parametrize("labels,payload", [
    (bytes([0x0A, 0x0C, 0x0F]), b"data"),  # 3 labels, bos on the third; first 5: untouched
    (bytes([0x03]), b"xy"),  # one label, value 1: popped, the stack is empty
    (bytes([0x02, 0x04, 0x06, 0x09]), b"p"),  # 4 labels, value 1: pop_front(1) moves 3 up
    (bytes([0x04, 0x06, 0x08, 0x0B]), b""),  # value 2: pop_front(2)
    (bytes([0x06, 0x0B]), b"zz"),  # value 3: push_front(1) then a new first label
    (bytes([0x06, 0x08, 0x0A, 0x0D]), b"q"),  # push on a full stack: the last element falls off
    (bytes([0x0A, 0x0C, 0x0E, 0x10, 0x13]), b"!"),  # no bos within 4: StackOutOfBounds
    (bytes([0x0A, 0x0C]), b""),  # runs out of bytes: PacketTooShort
])
def test_header_stacks_next_last_push_pop(labels, payload):
    eng = engine("stacks")
    frame = MAC_A + MAC_B + b"\x88\xb6" + labels + payload
    assert eng.process(frame, 3) == [(1, stacks_model(labels, payload))]
    other = MAC_A + MAC_B + b"\x08\x00" + labels + payload  # no labels parsed
    assert eng.process(other, 3) == [(1, stacks_model(labels, payload, 0x0800))]
    assert eng.stats.errors == 0


# --- tables, registers, counters, hash, checksum, multicast ------------------------
RES_F = [("reg_old", 32, 0), ("h16", 16, 0), ("h32", 32, 0), ("path", 8, 0), ("rid", 16, 0),
         ("eport", 8, 0), ("inst", 32, 0), ("plen", 32, 0)]


@pytest.fixture
def feat():
    return feat_engine()


def out_res(data):
    return fields(data[34:], RES_F)


def test_lpm_longest_prefix_wins_and_checksum_is_updated(feat):
    out = feat.process(feat_frame(src=0x0B000001, dst=0x0A010203), 1)
    assert [p for p, _ in out] == [6]
    data = out[0][1]
    assert codec.ipv4_checksum(data[14:34]) == 0 and data[22] == 63, "ttl decremented, checksum recomputed"
    r = out_res(data)
    assert r["path"] == 1 and r["eport"] == 6 and r["inst"] == 0 and r["rid"] == 0
    assert feat.process(feat_frame(src=0x0B000001, dst=0x0A01FF01), 1)[0][0] == 5


def test_lpm_miss_runs_the_default_drop_and_hit_action_drops(feat):
    assert feat.process(feat_frame(src=0x0B000001, dst=0x0C000001), 1) == []
    assert feat.process(feat_frame(src=0x0B000001, dst=0x0A020001), 1) == []
    routes = feat.program.tables["I.routes"]
    hits = {e.match: e.counter[0] for e in routes.entries.values()}
    assert hits[((0x0A020000, 16),)] == 1 and hits[((0x0A010200, 24),)] == 0


def test_ternary_priority_range_and_action_run_switch(feat):
    # src 10.0.0.1 ttl 15: both entries match, priority 10 (set_tos 3) wins
    out = feat.process(feat_frame(src=0x0A000001, dst=0x0A010203, ttl=15), 1)
    data = out[0][1]
    assert data[15] == 3 and out_res(data)["path"] == 1 | 4
    # ttl 30 is outside [10, 20]: the /8 flood entry matches -> multicast, rid 99 dropped in egress
    out = feat.process(feat_frame(src=0x0A000001, dst=0x0A010203, ttl=30), 1)
    assert sorted(p for p, _ in out) == [1, 2]
    for port, data in out:
        r = out_res(data)
        assert r["rid"] == {1: 11, 2: 12}[port] and r["eport"] == port and r["inst"] == 5
        assert r["path"] == 1 | 8


def test_registers_counters_and_hashes(feat):
    src, dst = 0x0B000001, 0x0A010203
    seen = []
    for i in range(3):
        out = feat.process(feat_frame(src=src, dst=dst, tos=2), 1)
        seen.append(out_res(out[0][1])["reg_old"])
    assert seen == [0, 1, 2]
    assert feat.program.registers["I.hits"][2] == 3
    pk, by = feat.program.counters["I.per_tos"]
    assert pk[2] == 3 and by[2] == 3 * 34
    key = src.to_bytes(4, "big") + dst.to_bytes(4, "big")
    r = out_res(feat.process(feat_frame(src=src, dst=dst), 1)[0][1])
    assert r["h32"] == zlib.crc32(key) and r["h16"] == hashing.ALGOS["crc16"](key)


def test_crc16_is_bmv2s_crc16_arc():
    assert hashing.ALGOS["crc16"](b"123456789") == 0xBB3D
    assert hashing.ALGOS["crc32"](b"123456789") == 0xCBF43926
    assert hashing.ALGOS["csum16"](bytes.fromhex("45000073000040004011b861c0a80001c0a800c7")) == 0


def test_bad_checksum_exits_and_drops(feat):
    assert feat.process(feat_frame(src=0x0B000001, dst=0x0A010203, csum=0x1234), 1) == []
    assert list(feat.program.registers["I.hits"]) == [0] * 8, "exit stopped the pipeline before the register"


def test_set_invalid_removes_the_header_and_packet_length_follows(feat):
    frame = feat_frame(src=0x0B000001, dst=0x0A010203, proto=0xFD, extra=b"\xaa\xbb") + b"PAY"
    out = feat.process(frame, 1)
    data = out[0][1]
    assert data.endswith(b"PAY") and b"\xaa\xbbPAY" not in data
    assert len(data) == 14 + 20 + 22 + 3
    # egress sees packet_length = ingress length + res (added) - trailer (removed)
    assert out_res(data)["plen"] == len(frame) + 22 - 2


def test_multicast_group_without_replicas_drops(feat):
    feat.pre.clear()
    assert feat.process(feat_frame(src=0x0A000001, dst=0x0A010203, ttl=30), 1) == []
    assert feat.stats.mcast_empty == 1


def test_non_ipv4_is_dropped_by_exit_path(feat):
    assert feat.process(MAC_A + MAC_B + b"\x86\xdd" + bytes(40), 1) == []


def test_table_entry_errors():
    eng = engine("features")
    routes = eng.program.tables["I.routes"]
    entry(routes, [(0x0A000000, 8)], "I.route", [1])
    with pytest.raises(TableError) as e:
        entry(routes, [(0x0A000000, 8)], "I.route", [2])
    assert e.value.code == "ALREADY_EXISTS"
    with pytest.raises(TableError) as e:
        routes.delete(((0x0B000000, 8),), 0)
    assert e.value.code == "NOT_FOUND"
    with pytest.raises(TableError) as e:
        entry(eng.program.tables["I.classify"], [(1, 1), (0, 1)], "I.flood", [1], priority=0)
    assert e.value.code == "INVALID_ARGUMENT"


# --- the mindp program ----------------------------------------------------------------
def test_mindp_aggregation_offline():
    eng = Engine(compiler.load(artifacts.BMV2_JSON.read_bytes()))
    t = eng.program.tables
    entry(t["MindpIngress.admission.jobs"], [1], "MindpIngress.admission.set_job",
          [100, 4, 3, 7, 0x020000000007, 0x0A000007, 257, 1, 0, 0, 0])
    for w in range(3):
        entry(t["MindpIngress.admission.workers"], [w + 1, 1, w], "MindpIngress.admission.admit_worker")
    rng = np.random.default_rng(3)
    grads = [(rng.standard_normal(K) * 10).astype(np.float16) for _ in range(3)]
    grads[1][:4] = np.array([6e-8, -6e-8, 65504, -65504], dtype=np.float16)
    addrs = codec.Addresses("02:00:00:00:00:01", "02:00:00:00:00:07", "10.0.0.1", "10.0.0.7")
    outs = []
    for w, g in enumerate(grads):
        frame = codec.encode_tensor(Kind.GRAD, g, addrs, first_chunk=9, job=1, worker=w, step=4, slot=1, ver=0)[0]
        outs.append(eng.process(frame.tobytes(), w + 1))
    assert outs[0] == [] and outs[1] == [] and len(outs[2]) == 1
    port, data = outs[2][0]
    assert port == 7 and codec.ipv4_checksum(data[14:34]) == 0
    dec = codec.decode([data], Kind.SUM)
    assert np.array_equal(dec.elements[0], exact_sum(grads)[0])


# --- load-time rejection -------------------------------------------------------------
def test_malformed_json_is_a_clear_error():
    with pytest.raises(ProgramError, match="not valid JSON"):
        compiler.load(b"{nope")
    with pytest.raises(ProgramError, match="not a BMv2 JSON"):
        compiler.load(b"[]")
    j = json.loads(compiled.json_path("exprs").read_text())
    del j["parsers"][0]["parse_states"][0]["transitions"]
    with pytest.raises(ProgramError, match="malformed"):
        compiler.load(json.dumps(j))


@pytest.mark.parametrize("mutate,name", [
    (lambda j: j["actions"][0]["primitives"].append({"op": "clone_ingress_pkt_to_egress", "parameters": []}),
     "clone_ingress_pkt_to_egress"),
    (lambda j: j.__setitem__("meter_arrays", [{"name": "I.m", "id": 0}]), "meters"),
    (lambda j: j.__setitem__("header_unions", [{"name": "u", "id": 0}]), "header unions"),
    (lambda j: j["calculations"].append({"name": "c9", "id": 9, "algo": "crc64", "input": []}), "crc64"),
    (lambda j: j["pipelines"][0]["conditionals"][0]["expression"]["value"].__setitem__("op", "**"), r"'\*\*'"),
])
def test_unsupported_constructs_are_rejected_by_name(mutate, name):
    j = json.loads(compiled.json_path("features").read_text())
    mutate(j)
    with pytest.raises(UnsupportedConstruct, match=name):
        compiler.load(json.dumps(j))
