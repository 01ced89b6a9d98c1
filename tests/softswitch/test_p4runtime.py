"""P4Runtime server over real gRPC: p4runtime-shell works against it, and bad
requests get BMv2's status codes while the server keeps serving."""
import asyncio
import queue
import socket

import grpc
import pytest
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

import p4runtime_sh.shell as sh
from mindp import progress, targets
from p4src import artifacts
from softswitch.engine import Engine
from softswitch.p4runtime_server import Server, SwitchService
from softswitch.p4runtime_stream import STREAM_QUEUE, Outbox

from . import compiled
from .p4rt_client import L2, Client, ids, l2_update, p4info


@pytest.fixture
def server():
    addr = f"127.0.0.1:{targets.free_port()}"
    srv = Server(SwitchService(Engine()), addr)
    srv.start()
    yield srv
    srv.stop()


def write_errors(exc: grpc.RpcError):
    """Per-update canonical codes from grpc-status-details-bin, as BMv2 sends them."""
    assert exc.code() == grpc.StatusCode.UNKNOWN
    md = dict(exc.trailing_metadata())
    st = status_pb2.Status.FromString(md["grpc-status-details-bin"])
    out = []
    for d in st.details:
        err = p4runtime_pb2.Error()
        d.Unpack(err)
        out.append(code_pb2.Code.Name(err.canonical_code))
    return out


def test_p4runtime_shell_against_the_server(server):
    sh.setup(device_id=0, grpc_addr=server.addr, election_id=(0, 1),
             config=sh.FwdPipeConfig(str(artifacts.P4INFO), str(artifacts.BMV2_JSON)))
    try:
        te = sh.TableEntry(L2)(action="MindpIngress.forwarding.forward")
        te.match["hdr.ethernet.dstAddr"] = "02:00:00:00:00:05"
        te.action["port"] = "5"
        te.insert()
        got = list(sh.TableEntry(L2).read())
        assert len(got) == 1 and got[0].action["port"].value == b"\x05"
        g = sh.MulticastGroupEntry(3)
        g.add(1, 0).add(2, 7)
        g.insert()
        (rg,) = list(sh.MulticastGroupEntry(3).read())
        assert [(r.egress_port, r.instance) for r in rg.replicas] == [(1, 0), (2, 7)]
        ce = sh.CounterEntry("MindpIngress.drops")
        ce.index = 10
        (c,) = list(ce.read())
        assert c.data.packet_count == 0
        server.service.pipeline.program.counters["MindpIngress.drops"][0][10] = 4
        (c,) = list(ce.read())
        assert c.data.packet_count == 4
        te.delete()
        assert list(sh.TableEntry(L2).read()) == []
    finally:
        sh.teardown()


def test_status_codes_of_bad_writes(server):
    c = Client(server.addr, 1)
    try:
        with pytest.raises(grpc.RpcError) as e:
            c.write(l2_update(p4info(), 5, 1))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, "no pipeline yet"
        c.set_pipeline()
        info = p4info()
        c.write(l2_update(info, 5, 1))
        U = p4runtime_pb2.Update
        with pytest.raises(grpc.RpcError) as e:
            c.write(l2_update(info, 6, 2),                                   # OK
                    l2_update(info, 5, 1),                                   # duplicate
                    l2_update(info, 7, 1, utype=U.MODIFY),                   # missing
                    l2_update(info, 7, 1, utype=U.DELETE),                   # missing
                    l2_update(info, 8, 1, field_id=9),                       # bad key field
                    l2_update(info, 8, 1, action="MindpIngress.forwarding.unknown_destination"),  # default-only
                    l2_update(info, 8, 1, param_value=b"\x7f\xff"))          # param beyond 9 bits
        assert write_errors(e.value) == ["OK", "ALREADY_EXISTS", "NOT_FOUND", "NOT_FOUND", "INVALID_ARGUMENT",
                                         "INVALID_ARGUMENT", "INVALID_ARGUMENT"]
        tid, _ = ids(info)
        ent = p4runtime_pb2.Entity()
        ent.table_entry.table_id = tid
        assert len(c.read(ent)) == 2, "the good update of the failed batch was applied"
    finally:
        c.close()


def test_only_the_primary_writes(server):
    a = Client(server.addr, 5)
    b = Client(server.addr, 3)
    try:
        assert a.arbitration.status.code == code_pb2.OK
        assert b.arbitration.status.code == code_pb2.ALREADY_EXISTS
        a.set_pipeline()
        a.write(l2_update(p4info(), 6, 2))
        with pytest.raises(grpc.RpcError) as e:
            b.write(l2_update(p4info(), 5, 1))
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.RpcError) as e:
            b.set_pipeline()
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # Refused is not applied (grpcio 1.51's aio server applied both): a's entry alone, in a's pipeline.
        ent = p4runtime_pb2.Entity()
        ent.table_entry.table_id = ids(p4info())[0]
        assert [int.from_bytes(e.table_entry.match[0].exact.value, "big") for e in a.read(ent)] == [6]
        a.close()
        # the old primary left: b is promoted and may write
        for _ in range(20):
            msg = next(b.stream)
            if msg.arbitration.status.code == code_pb2.OK:
                break
        b.write(l2_update(p4info(), 5, 1))
    finally:
        b.close()


def test_bad_pipelines_are_rejected_and_the_server_keeps_running(server):
    c = Client(server.addr, 1)
    try:
        with pytest.raises(grpc.RpcError) as e:
            c.set_pipeline(json_bytes=b"{ not json")
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "JSON" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            c.set_pipeline(info=p4info(compiled.p4info_path("features")))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "does not match" in e.value.details()
        c.set_pipeline()
        req = p4runtime_pb2.GetForwardingPipelineConfigRequest(device_id=0)
        cfg = c.stub.GetForwardingPipelineConfig(req).config
        assert cfg.p4_device_config == artifacts.BMV2_JSON.read_bytes() and cfg.p4info == p4info()
    finally:
        c.close()


def test_wildcard_reads_and_default_action(server):
    c = Client(server.addr, 1)
    try:
        info = p4info(compiled.p4info_path("features"))
        c.set_pipeline(info, compiled.json_path("features").read_bytes())
        ent = p4runtime_pb2.Entity()
        ent.counter_entry.counter_id = 0
        cells = c.read(ent)
        assert len(cells) == 8 and all(x.counter_entry.data.byte_count == 0 for x in cells)
        routes = next(t for t in info.tables if t.preamble.name == "I.routes")
        acts = {a.preamble.name: a.preamble.id for a in info.actions}
        u = p4runtime_pb2.Update(type=p4runtime_pb2.Update.MODIFY)
        te = u.entity.table_entry
        te.table_id = routes.preamble.id
        te.is_default_action = True
        te.action.action.action_id = acts["I.route"]
        te.action.action.params.add(param_id=1, value=b"\x04")
        c.write(u)
        frame = b"\x02" * 12 + b"\x08\x00" + bytes.fromhex("4500001400000000400000000a0000010a000002")
        import struct
        from mindp import codec
        hdr = bytearray(frame[14:])
        hdr[10:12] = struct.pack("!H", codec.ipv4_checksum(bytes(hdr)))
        out = server.service.engine.process(frame[:14] + bytes(hdr), 1)
        assert [p for p, _ in out] == [4], "the new default action forwards to port 4"
        rd = p4runtime_pb2.Entity()
        rd.table_entry.table_id = routes.preamble.id
        rd.table_entry.is_default_action = True
        (d,) = c.read(rd)
        assert d.table_entry.action.action.action_id == acts["I.route"]
    finally:
        c.close()


def test_packet_out_and_packet_in_through_the_cpu_port():
    """Packet-out enters ingress on the CPU port; exprs.p4 reflects it, so it comes back as packet-in."""
    engine = Engine()
    service = SwitchService(engine, cpu_port=64)

    def inject(frame, port):  # the data plane's part, without sockets
        for out_port, out in engine.process(frame, port):
            if out_port == service.cpu_port:
                service.packet_in(out)

    service.inject = inject
    srv = Server(service, f"127.0.0.1:{targets.free_port()}")
    srv.start()
    c = Client(srv.addr, 1)
    try:
        c.set_pipeline(p4info(compiled.p4info_path("exprs")), compiled.json_path("exprs").read_bytes())
        frame = b"\x02" * 12 + b"\x88\xb5" + bytes.fromhex("0001000200000000" + "0000")
        req = p4runtime_pb2.StreamMessageRequest()
        req.packet.payload = frame
        c.q.put(req)
        msg = next(c.stream)
        assert msg.WhichOneof("update") == "packet"
        assert msg.packet.payload[:24] == frame and msg.packet.payload[24:26] == b"\x00\x03"
    finally:
        c.close()
        srv.stop()


def test_idle_streams_hold_no_thread(server):
    """64 idle StreamChannels (4x the unary pool) and Write, Read and Capabilities still answer."""
    c = Client(server.addr, 1)
    idle = []
    try:
        c.set_pipeline()
        for _ in range(64):
            ch = grpc.insecure_channel(server.addr)
            q = queue.Queue()
            call = p4runtime_pb2_grpc.P4RuntimeStub(ch).StreamChannel(iter(q.get, None))
            idle.append((ch, q, call))
        progress.wait(lambda: len(server.service.streams) >= 65, lambda: len(server.service.streams),
                      stall=progress.STALL, what="streams opening")
        assert len(server.service.streams) == 65, "every idle stream is open on the server"
        info = p4info()
        req = c.eid(p4runtime_pb2.WriteRequest(device_id=0))
        req.updates.append(l2_update(info, 5, 1))
        # A call stuck behind the idle streams would never answer: any bound shows it; a generous one
        # keeps a busy machine from looking like that.
        c.stub.Write(req, timeout=30)
        ent = p4runtime_pb2.Entity()
        ent.table_entry.table_id = ids(info)[0]
        rreq = p4runtime_pb2.ReadRequest(device_id=0)
        rreq.entities.add().CopyFrom(ent)
        assert sum(len(r.entities) for r in c.stub.Read(rreq, timeout=30)) == 1
        assert c.stub.Capabilities(p4runtime_pb2.CapabilitiesRequest(), timeout=30).p4runtime_api_version
    finally:
        for ch, q, _ in idle:
            q.put(None)
            ch.close()
        c.close()


def test_stream_queue_is_bounded():
    """A client that does not read its stream: packet-ins beyond the bound are dropped and counted,
    and an arbitration message that finds the queue full ends that stream instead of growing it."""
    async def scenario():
        box = Outbox(asyncio.get_running_loop(), 4)
        kept = [box.put(i, droppable=True) for i in range(6)]
        assert kept == [True] * 4 + [False] * 2 and len(box.items) == 4
        assert box.put("arbitration") and list(box.items) == [
            (grpc.StatusCode.RESOURCE_EXHAUSTED, "stream closed: the client does not read its messages")]
        assert not box.put("later"), "nothing after the end"
        return await box.get()

    assert asyncio.run(scenario())[0] == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_packet_ins_to_a_client_that_does_not_read_are_counted_not_queued():
    engine = Engine()
    service = SwitchService(engine, cpu_port=64)
    srv = Server(service, f"127.0.0.1:{targets.free_port()}")
    srv.start()
    c = Client(srv.addr, 1)
    try:
        c.set_pipeline(p4info(compiled.p4info_path("exprs")), compiled.json_path("exprs").read_bytes())
        frame = b"\x02" * 12 + b"\x88\xb5" + bytes(16000)
        n = 3 * STREAM_QUEUE
        for _ in range(n):
            service.packet_in(frame)
        (s,) = service.streams
        assert len(s.outbox.items) <= STREAM_QUEUE
        assert service.packet_in_dropped > 0, "the client read nothing: some packet-ins had no room"
        received = 0
        for msg in c.stream:
            received += msg.WhichOneof("update") == "packet"
            if received + service.packet_in_dropped == n:
                break
        assert received + service.packet_in_dropped == n, "each packet-in delivered or counted"
    finally:
        c.close()
        srv.stop()


def test_a_second_server_on_a_used_address_is_refused(server):
    with pytest.raises(OSError, match="already in use"):
        Server(SwitchService(Engine()), server.addr)
    # a listener with SO_REUSEPORT (as the switch had before): still refused, not shared
    port = targets.free_port()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
        with pytest.raises(OSError, match="already in use"):
            Server(SwitchService(Engine()), f"127.0.0.1:{port}")


def test_the_switch_refuses_to_start_on_a_used_grpc_port(server):
    cmd = targets.command("embedded", targets.SwitchConfig(ports={}, grpc_addr=server.addr))
    r = progress.run(cmd, capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip() == f"mindp-softswitch: gRPC: {server.addr} is already in use by another process"
