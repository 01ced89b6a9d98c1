"""A request's deadline follows the connection's timeout (--timeout, MINDP_CTL_TIMEOUT) where that is
longer than the request's own least: on a loaded machine the switch gets the time the user gave it."""
from __future__ import annotations

import grpc
import pytest
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from controller.p4runtime import OpKind, SwitchConnection

from .seam import p4runtime_server


class Deadlines(p4runtime_pb2_grpc.P4RuntimeServicer):
    """Seam: a P4Runtime server that grants arbitration and notes the time each request had left."""

    def __init__(self):
        self.left: dict[str, float] = {}

    def Capabilities(self, request, context):
        return p4runtime_pb2.CapabilitiesResponse(p4runtime_api_version="1.3.0")

    def StreamChannel(self, request_iterator, context):
        for req in request_iterator:
            if req.HasField("arbitration"):
                rep = p4runtime_pb2.StreamMessageResponse()
                rep.arbitration.CopyFrom(req.arbitration)
                yield rep

    def GetForwardingPipelineConfig(self, request, context):
        self.left["pipeline read"] = context.time_remaining()
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no pipeline")

    def Write(self, request, context):
        self.left["write"] = context.time_remaining()
        return p4runtime_pb2.WriteResponse()

    def Read(self, request, context):
        self.left["read"] = context.time_remaining()
        yield p4runtime_pb2.ReadResponse()


@pytest.fixture
def server():
    servicer = Deadlines()
    with p4runtime_server(servicer) as addr:
        yield addr, servicer


@pytest.mark.parametrize("timeout, least", [(120.0, {"pipeline read": 120, "write": 120, "read": 120}),
                                            (3.0, {"pipeline read": 10, "write": 10, "read": 30})])
def test_each_request_waits_the_longer_of_its_least_and_the_connection_timeout(server, timeout, least):
    addr, servicer = server
    with SwitchConnection(addr, timeout=timeout) as conn:
        assert conn.installed_pipeline() == (None, 0)
        conn._write(OpKind.INSERT, p4runtime_pb2.Entity(), "a write")
        conn.read_entries()
    # Time left when the server saw it: the deadline less what the request took to arrive (long on a
    # loaded machine: half the bound is room) plus gRPC's rounding of it on the wire (up to a second).
    for what, bound in least.items():
        assert bound / 2 < servicer.left[what] <= bound + 2, (what, servicer.left)
