"""Per-packet trace on the "softswitch.trace" logger at DEBUG, as BMv2's `--log-console -L debug`:
parser states and extracted headers, each table's hit/miss with the action and its
parameters, register and counter updates, and where the packet went or why it was dropped."""
import logging

import pytest

from softswitch.engine import Engine

from .engines import MAC_A, MAC_B, engine, entry, feat_frame

TRACE = "softswitch.trace"


def features_engine() -> Engine:
    eng = engine("features")
    t = eng.program.tables
    entry(t["I.routes"], [(0x0A010000, 16)], "I.route", [5])
    entry(t["I.routes"], [(0x0A020000, 16)], "I.drop")
    entry(t["I.classify"], [(0x0A000001, 0xFFFFFFFF), (10, 20)], "I.set_tos", [3], priority=10)
    return eng


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == TRACE]


def test_trace_names_states_tables_registers_and_the_egress_port(caplog):
    eng = features_engine()
    caplog.set_level(logging.DEBUG, logger=TRACE)
    out = eng.process(feat_frame(src=0x0A000001, dst=0x0A010203, ttl=15), 2)
    assert [p for p, _ in out] == [5]
    got = lines(caplog)
    assert got[0] == "pkt 1: 34 bytes in on port 2"
    assert "pkt 1: parser state 'start'" in got and "pkt 1: parser state 'parse_ipv4'" in got
    assert "pkt 1: extracted header 'eth'" in got and "pkt 1: extracted header 'ipv4'" in got
    assert "pkt 1: table 'I.routes': hit, action 'I.route'(port=0x5)" in got
    assert "pkt 1: table 'I.classify': hit, action 'I.set_tos'(tos=0x3)" in got
    # tos 3 -> cell 3 of I.hits goes from 0 to 1, and the per-tos counter counts it
    assert "pkt 1: register 'I.hits'[3] <- 1" in got
    assert "pkt 1: counter 'I.per_tos'[3] += 1" in got
    assert got[-1] == f"pkt 1: out on port 5, {len(out[0][1])} bytes"
    order = [got.index("pkt 1: parser state 'start'"), got.index("pkt 1: table 'I.routes': hit, action 'I.route'(port=0x5)"),
             got.index("pkt 1: register 'I.hits'[3] <- 1"), len(got) - 1]
    assert order == sorted(order), "lines in processing order"


def test_trace_gives_misses_and_drop_reasons(caplog):
    eng = features_engine()
    caplog.set_level(logging.DEBUG, logger=TRACE)
    assert eng.process(feat_frame(dst=0x0A020001), 1) == []
    got = lines(caplog)
    assert "pkt 1: table 'I.routes': hit, action 'I.drop'()" in got
    assert "pkt 1: table 'I.classify': miss, action 'NoAction'()" in got
    assert got[-1] == "pkt 1: dropped at the end of ingress (egress_spec = drop port 511)"
    caplog.clear()
    assert eng.process(MAC_A + MAC_B + b"\x86\xdd" + bytes(40), 1) == []  # not IPv4: mark_to_drop; exit
    got = lines(caplog)
    assert "pkt 2: parser state 'start'" in got and not any("parse_ipv4" in x for x in got)
    assert got[-1].startswith("pkt 2: dropped at the end of ingress")
    caplog.clear()
    assert eng.process(MAC_A[:6], 1) == []
    assert "pkt 3: parser error PacketTooShort" in lines(caplog)


def test_trace_of_multicast_names_the_ports(caplog):
    eng = engine("features")
    entry(eng.program.tables["I.classify"], [(0x0A000000, 0xFF000000), (0, 255)], "I.flood", [7], priority=5)
    eng.pre[7] = [(1, 11), (2, 12)]
    caplog.set_level(logging.DEBUG, logger=TRACE)
    assert [p for p, _ in eng.process(feat_frame(), 3)] == [1, 2]
    got = lines(caplog)
    mc = got.index("pkt 1: multicast group 7 to ports 1, 2")
    outs = [x.split(",")[0] for x in got[mc:] if "out on port" in x]
    assert outs == ["pkt 1: out on port 1", "pkt 1: out on port 2"]


def test_no_trace_and_no_traced_compile_when_disabled(caplog):
    eng = features_engine()
    caplog.set_level(logging.INFO, logger=TRACE)
    eng.process(feat_frame(), 1)
    assert lines(caplog) == []
    assert eng.program.traced_ns is None, "the traced variant is compiled only when tracing"


@pytest.mark.parametrize("frame", [feat_frame(src=0x0A000001, dst=0x0A010203, ttl=15), feat_frame(dst=0x0A020001),
                                   feat_frame(proto=0xFD, extra=b"\x12\x34"), MAC_A + MAC_B + b"\x08\x00"])
def test_traced_and_untraced_give_the_same_packets_and_state(frame, caplog):
    plain, traced = features_engine(), features_engine()
    out_plain = [plain.process(frame, 1) for _ in range(3)]
    caplog.set_level(logging.DEBUG, logger=TRACE)
    out_traced = [traced.process(frame, 1) for _ in range(3)]
    assert out_plain == out_traced
    assert plain.program.registers == traced.program.registers
    assert plain.program.counters == traced.program.counters
    assert plain.stats == traced.stats
