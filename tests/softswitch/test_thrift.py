"""The embedded switch's Thrift server and mindp.bmthrift over real TCP: simple_switch_CLI's
inspection commands (register_read, counter_read, table_dump, mc_dump) answer as on BMv2."""
import json
import re
import socket
import struct
import sys

import pytest
from p4.v1 import p4runtime_pb2

from mindp import bmthrift, progress, protocol, targets
from mindp.bmthrift import ThriftClient, ThriftError
from p4src import artifacts
from softswitch.engine import Engine
from softswitch.p4runtime_server import Server, SwitchService
from softswitch.thrift_server import ThriftServer

from .p4rt_client import L2, Client, l2_update, p4info

PROGRAM = json.loads(artifacts.BMV2_JSON.read_text())
REG64 = next(r for r in PROGRAM["register_arrays"] if r["bitwidth"] == 64)
COUNTER = next(c for c in PROGRAM["counter_arrays"] if not c.get("is_direct"))


def mcast_update(gid: int, replicas):
    u = p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT)
    g = u.entity.packet_replication_engine_entry.multicast_group_entry
    g.multicast_group_id = gid
    for port, rid in replicas:
        g.replicas.add(egress_port=port, instance=rid)
    return u


def program_switch(grpc_addr: str) -> None:
    """The mindp pipeline, one L2 entry and one multicast group, over P4Runtime."""
    c = Client(grpc_addr, 1)
    try:
        c.set_pipeline()
        c.write(l2_update(p4info(), 0x020000000005, 3), mcast_update(7, [(1, 0), (2, 0), (4, 1)]))
    finally:
        c.close()


@pytest.fixture
def switch():
    """An in-process switch: P4Runtime server and Thrift server over one service."""
    service = SwitchService(Engine())
    grpc_srv = Server(service, f"127.0.0.1:{targets.free_port()}")
    grpc_srv.start()
    thrift = ThriftServer(service, "127.0.0.1", targets.free_port())
    thrift.start()
    program_switch(grpc_srv.addr)
    yield service, thrift.server_address[1]
    thrift.stop()
    grpc_srv.stop()


def test_registers_counters_and_config(switch):
    service, port = switch
    program = service.engine.program
    cells = program.registers[REG64["name"]]
    cells[5] = 123456789
    cells[6] = (1 << 64) - 3  # a negative int64 sum, as the P4 program stores it
    pk, by = program.counters[COUNTER["name"]]
    pk[2], by[2] = 4, 600
    with ThriftClient("127.0.0.1", port) as cl:
        assert cl.get_config() == artifacts.BMV2_JSON.read_text()
        assert cl.register_read(REG64["name"], 5) == 123456789
        assert cl.register_read(REG64["name"], 6) == -3, "int64 as BMv2 returns bit<64> cells"
        short = REG64["name"].rsplit(".", 1)[1]
        assert cl.register_read(short, 5) == 123456789, "a unique suffix names the register, as in the CLI"
        values = cl.register_read_all(REG64["name"])
        assert len(values) == REG64["size"] and values[5:7] == [123456789, -3] and sum(values) == 123456789 - 3
        assert cl.counter_read(COUNTER["name"], 2) == (600, 4)
        with pytest.raises(ThriftError, match="INVALID_REGISTER_NAME"):
            cl.register_read("no_such_register", 0)
        with pytest.raises(ThriftError, match="INVALID_INDEX"):
            cl.register_read(REG64["name"], REG64["size"])
        with pytest.raises(ThriftError, match="INVALID_COUNTER_NAME"):
            cl.counter_read("no_such_counter", 0)
        # the connection still serves after errors
        assert cl.register_read(REG64["name"], 5) == 123456789


def test_table_dump_and_mc_dump(switch):
    _, port = switch
    with ThriftClient("127.0.0.1", port) as cl:
        dump = cl.table_dump(L2)
        assert cl.table_dump("l2_forward") == dump
        lines = dump.splitlines()
        assert "* ethernet.dstAddr " in dump and "EXACT     020000000005" in dump, dump
        assert "Action entry: MindpIngress.forwarding.forward - 03" in lines, dump
        assert lines[-3:-1] == ["Dumping default entry", lines[-2]] and lines[-2].startswith("Action entry: ")
        with pytest.raises(ThriftError, match="INVALID_TABLE_NAME"):
            cl.table_dump("no_such_table")
        mc = cl.mc_dump().splitlines()
        assert "mgrp(7)" in mc
        assert "  -> (L1h=0, rid=0) -> (ports=[1, 2], lags=[])" in mc
        assert "  -> (L1h=1, rid=1) -> (ports=[4], lags=[])" in mc


def test_unknown_methods_and_garbage_keep_the_server_serving(switch):
    _, port = switch
    with ThriftClient("127.0.0.1", port) as cl:
        with pytest.raises(ThriftError, match="Invalid method name"):
            cl.call("standard", "bm_register_write", [])
        with pytest.raises(ThriftError, match="Invalid method name"):
            cl.call("simple_switch", "get_time_elapsed_us", [])
        assert cl.register_read(REG64["name"], 0) == 0
    for garbage in (b"GET / HTTP/1.0\r\n\r\n", struct.pack(">I", bmthrift.VERSION_1 | 1) + b"\x7f\xff\xff\xff"):
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(garbage)
            assert s.recv(100) == b"", "the server closes a connection that does not speak Thrift"
    with ThriftClient("127.0.0.1", port) as cl:
        assert cl.register_read(REG64["name"], 0) == 0


def test_client_errors_are_one_line():
    with pytest.raises(ThriftError) as e:
        ThriftClient("127.0.0.1", targets.free_port(), timeout=1)
    assert "cannot connect" in str(e.value) and "\n" not in str(e.value)


def test_a_used_thrift_port_is_refused(switch):
    service, port = switch
    with pytest.raises(OSError, match=f"Thrift port {port} is already in use"):
        ThriftServer(service, "127.0.0.1", port)


# --- the switch as a process: the same client (and the real simple_switch_CLI) on each target ---

TARGETS = [pytest.param("embedded"),
           pytest.param("bmv2", marks=[pytest.mark.skipif(not targets.find_bmv2(), reason="BMv2 not installed"),
                                       pytest.mark.skipif(not protocol.bmv2_fits(protocol.K),
                                                          reason=f"BMv2 runs K up to {protocol.BMV2_MAX_K}")])]


def started(target: str, tmp_path) -> targets.SwitchProcess:
    cfg = targets.SwitchConfig(ports={}, grpc_addr=f"127.0.0.1:{targets.free_port()}",
                               thrift_port=targets.free_port(), json_path=str(artifacts.BMV2_JSON),
                               log_file=str(tmp_path / f"{target}.log"))
    sw = targets.SwitchProcess(target, cfg).start()
    program_switch(cfg.grpc_addr)
    return sw


@pytest.mark.net
@pytest.mark.parametrize("target", TARGETS)
def test_the_same_client_on_each_target(target, tmp_path):
    sw = started(target, tmp_path)
    try:
        with ThriftClient("127.0.0.1", sw.cfg.thrift_port) as cl:
            assert json.loads(cl.get_config())["register_arrays"] == PROGRAM["register_arrays"]
            assert cl.register_read_all(REG64["name"]) == [0] * REG64["size"]
            assert cl.counter_read(COUNTER["name"], 0) == (0, 0)
            assert "Action entry: MindpIngress.forwarding.forward - 03" in cl.table_dump(L2)
            nodes = {re.sub(r"L1h=\d+, ", "", x) for x in cl.mc_dump().splitlines()}  # handles differ by target
            assert {"  -> (rid=0) -> (ports=[1, 2], lags=[])", "  -> (rid=1) -> (ports=[4], lags=[])"} <= nodes
    finally:
        sw.stop()


def simple_switch_cli(port: int, commands: str) -> str:
    cli = targets.find_tool("simple_switch_CLI")
    proc = progress.run([sys.executable, cli, "--thrift-port", str(port)], input=commands,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.net
@pytest.mark.skipif(not targets.find_tool("simple_switch_CLI"), reason="simple_switch_CLI not installed")
def test_simple_switch_cli_against_the_embedded_switch(tmp_path):
    sw = started("embedded", tmp_path)
    try:
        out = simple_switch_cli(sw.cfg.thrift_port, f"register_read {REG64['name']} 3\n"
                                f"counter_read {COUNTER['name']} 1\ntable_dump l2_forward\nmc_dump\n"
                                f"switch_info\n")
    finally:
        sw.stop()
    assert f"{REG64['name']}[3]= 0" in out, out
    assert f"{COUNTER['name']}[1]= (0 bytes, 0 packets)" in out, out
    assert "Action entry: MindpIngress.forwarding.forward - 03" in out, out
    assert "mgrp(7)" in out and "Traceback" not in out, out


@pytest.mark.net
def test_the_switch_refuses_a_used_thrift_port(switch):
    _, port = switch
    cfg = targets.SwitchConfig(ports={}, grpc_addr=f"127.0.0.1:{targets.free_port()}", thrift_port=port)
    r = progress.run(targets.command("embedded", cfg), capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.strip() == f"mindp-softswitch: Thrift port {port} is already in use by another process"


def test_a_failing_simple_switch_cli_is_told_in_one_line():
    """BMv2 installed without Python's thrift module: simple_switch_CLI's traceback becomes one line
    that says what installs it; another failure keeps its own last line."""
    traceback = ("Traceback (most recent call last):\n  File \"/opt/p4tools/bin/simple_switch_CLI\", line 20\n"
                 "    from thrift import Thrift\nModuleNotFoundError: No module named 'thrift'\n")
    assert targets.cli_failure(traceback) == ("set_queue_depth failed: ModuleNotFoundError: No module named 'thrift' "
                                              "(simple_switch_CLI needs Python's thrift module: apt install "
                                              "python3-thrift)")
    assert targets.cli_failure("Error: could not connect to thrift server\n\n") == \
        "set_queue_depth failed: Error: could not connect to thrift server"
    assert targets.cli_failure("") == "set_queue_depth failed: no output"
