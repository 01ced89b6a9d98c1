"""Closing a session returns only once the switch has let go of it, so that the next session with
the same election id (the next mindp-ctl command) is never refused as 'in use'."""
from __future__ import annotations

import threading
import time

from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from controller.p4runtime import SwitchConnection

from .seam import p4runtime_server


class LateRelease(p4runtime_pb2_grpc.P4RuntimeServicer):
    """Seam: a P4Runtime server that lets go of a session 0.1 s after its stream ends. BMv2's (PI's)
    and the embedded switch's servers let go when the stream's handler returns, as this one does;
    a busy switch takes its time."""

    def __init__(self):
        self.sessions = 0
        self.lock = threading.Lock()

    def Capabilities(self, request, context):
        return p4runtime_pb2.CapabilitiesResponse(p4runtime_api_version="1.3.0")

    def StreamChannel(self, request_iterator, context):
        with self.lock:
            self.sessions += 1
        try:
            for req in request_iterator:
                if req.HasField("arbitration"):
                    rep = p4runtime_pb2.StreamMessageResponse()
                    rep.arbitration.CopyFrom(req.arbitration)
                    rep.arbitration.status.code = 0  # OK: primary
                    yield rep
        finally:
            time.sleep(0.1)
            with self.lock:
                self.sessions -= 1


def test_close_returns_after_the_switch_let_go_of_the_session():
    servicer = LateRelease()
    with p4runtime_server(servicer) as addr:
        for _ in range(3):
            conn = SwitchConnection(addr, timeout=10)
            assert conn.client.is_primary and servicer.sessions == 1
            conn.close()
            assert servicer.sessions == 0
