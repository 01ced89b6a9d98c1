"""A bare P4Runtime client for the embedded switch's server, and the mindp program's table entries
it writes (the l2_forward and source guard tables)."""
import queue

import grpc
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from controller.p4runtime import load_p4info
from p4src import artifacts
from softswitch.p4runtime_server import MAX_MESSAGE

L2 = "MindpIngress.forwarding.l2_forward"


def p4info(path=artifacts.P4INFO) -> p4info_pb2.P4Info:
    """A fresh message (tests change theirs); the controller's loader parses each file once."""
    return load_p4info(path)


class Client:
    """A bare P4Runtime client: one stream, one election id."""

    def __init__(self, addr: str, election: int, device_id: int = 0):
        # a large K's program (10.7 MB at K = 512) is larger than gRPC's 4 MB default message
        self.channel = grpc.insecure_channel(addr, options=[("grpc.max_receive_message_length", MAX_MESSAGE),
                                                            ("grpc.max_send_message_length", MAX_MESSAGE)])
        self.stub = p4runtime_pb2_grpc.P4RuntimeStub(self.channel)
        self.election = election
        self.requests = []
        self.q = queue.Queue()
        self.stream = self.stub.StreamChannel(iter(self.q.get, None))
        req = p4runtime_pb2.StreamMessageRequest()
        req.arbitration.device_id = device_id
        req.arbitration.election_id.low = election
        self.q.put(req)
        self.arbitration = next(self.stream).arbitration

    def eid(self, msg):
        msg.election_id.low = self.election
        return msg

    def set_pipeline(self, info=None, json_bytes=None):
        req = self.eid(p4runtime_pb2.SetForwardingPipelineConfigRequest(device_id=0))
        req.action = req.VERIFY_AND_COMMIT
        req.config.p4info.CopyFrom(info or p4info())
        req.config.p4_device_config = json_bytes if json_bytes is not None else artifacts.BMV2_JSON.read_bytes()
        return self.stub.SetForwardingPipelineConfig(req)

    def write(self, *updates):
        req = self.eid(p4runtime_pb2.WriteRequest(device_id=0))
        req.updates.extend(updates)
        return self.stub.Write(req)

    def read(self, entity):
        req = p4runtime_pb2.ReadRequest(device_id=0)
        req.entities.add().CopyFrom(entity)
        return [e for r in self.stub.Read(req) for e in r.entities]

    def close(self):
        self.q.put(None)
        self.channel.close()


def ids(info):
    t = next(t for t in info.tables if t.preamble.name == L2)
    acts = {a.preamble.name: a.preamble.id for a in info.actions}
    return t.preamble.id, acts


def l2_update(info, mac: int, port: int, utype=p4runtime_pb2.Update.INSERT, action="MindpIngress.forwarding.forward",
              field_id=1, param_value=None):
    tid, acts = ids(info)
    u = p4runtime_pb2.Update(type=utype)
    te = u.entity.table_entry
    te.table_id = tid
    m = te.match.add()
    m.field_id = field_id
    m.exact.value = mac.to_bytes(6, "big")
    te.action.action.action_id = acts[action]
    p = te.action.action.params.add()
    p.param_id = 1
    p.value = param_value if param_value is not None else port.to_bytes(2, "big")
    return u


def source_update(info, port: int, mac: int, ip: int):
    """The mindp program's source guard entry letting (port, mac, ip) send ordinary frames."""
    t = next(t for t in info.tables if t.preamble.name == "MindpIngress.forwarding.sources")
    acts = {a.preamble.name: a.preamble.id for a in info.actions}
    u = p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT)
    te = u.entity.table_entry
    te.table_id = t.preamble.id
    for field_id, value, width in ((1, port, 2), (2, mac, 6), (3, ip, 4)):
        te.match.add(field_id=field_id).exact.value = value.to_bytes(width, "big").lstrip(b"\0") or b"\0"
    te.action.action.action_id = acts["MindpIngress.forwarding.allow"]
    return u
