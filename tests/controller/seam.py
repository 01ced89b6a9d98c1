"""A P4Runtime server of a test's own servicer (a seam: what a real switch does not do on demand)."""
from __future__ import annotations

from concurrent import futures
from contextlib import contextmanager

import grpc
from p4.v1 import p4runtime_pb2_grpc

from mindp import targets


@contextmanager
def p4runtime_server(servicer: p4runtime_pb2_grpc.P4RuntimeServicer):
    """`servicer` served on a free 127.0.0.1 port; yields the address."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(servicer, server)
    addr = f"127.0.0.1:{targets.free_port()}"
    server.add_insecure_port(addr)
    server.start()
    try:
        yield addr
    finally:
        server.stop(None)
