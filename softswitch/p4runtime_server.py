"""P4Runtime server of the embedded switch (grpcio, the p4runtime package's protos).

Behaves like BMv2's PI server where a client can tell: arbitration by election
id (only the primary writes or sets the pipeline), a Write that fails returns
gRPC UNKNOWN with one p4.v1.Error per update in grpc-status-details-bin, and the
per-update canonical codes BMv2 uses (INVALID_ARGUMENT, ALREADY_EXISTS,
NOT_FOUND, RESOURCE_EXHAUSTED, PERMISSION_DENIED); FAILED_PRECONDITION with no
pipeline; UNIMPLEMENTED for P4Runtime register access, as BMv2.

This module holds the service's unary RPCs and the gRPC server; the rest is by stage:
p4runtime_stream (StreamChannel: arbitration, packet-out/in), p4runtime_pipeline (the pipeline
a controller sets), p4runtime_write and p4runtime_read (Write and Read translated to the
engine), p4runtime_entities and p4runtime_codec (the entities' and bytestrings' codecs).
"""
from __future__ import annotations

import asyncio
import errno
import functools
import logging
import socket
import threading
from concurrent import futures
from typing import NoReturn

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from . import compiler
from .engine import Engine
from .p4runtime_codec import P4RTError
from .p4runtime_pipeline import Pipeline, build_pipeline
from .p4runtime_read import read_entity
from .p4runtime_stream import StreamService
from .p4runtime_write import apply_update
from .tables import TableError

log = logging.getLogger("softswitch")
API_VERSION = "1.4.1"
UNARY_THREADS = 16  # unary RPCs in parallel; streams run on the event loop and take none
# A pipeline's JSON grows with K (p4src/artifacts.py): gRPC's 4 MB default refused a K = 128 program.
MAX_MESSAGE = 256 << 20


class _Context:
    """A unary handler's context whose abort always ends the handler. grpcio 1.51's aio server
    (Debian 12's python3-grpcio, which a venv made with the system's packages takes) returns from a
    synchronous handler's abort where later releases raise: a non-primary's refused Write went on
    and was applied."""

    def __init__(self, context):
        self._context = context

    def __getattr__(self, name):
        return getattr(self._context, name)

    def abort(self, code, details: str) -> NoReturn:
        self._context.abort(code, details)
        raise grpc.aio.AbortError(details)


def _rpc(*, primary: bool = False, pipeline: bool = False):
    """The checks a unary RPC repeats, in BMv2's order: device id; then, under the service lock,
    the caller is the primary, a pipeline is set. A P4RTError or TableError raised by the method
    ends the call with its canonical code."""
    def wrap(method):
        @functools.wraps(method)
        def handler(self, request, context):
            context = _Context(context)
            if request.device_id != self.device_id:
                context.abort(grpc.StatusCode.NOT_FOUND, f"Invalid device id {request.device_id}")
            with self.lock:
                if primary and not self.is_primary(request.election_id):
                    context.abort(grpc.StatusCode.PERMISSION_DENIED, "Not primary")
                if pipeline and self.pipeline is None:
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION, "No forwarding pipeline config set")
                try:
                    return method(self, request, context)
                except (P4RTError, TableError) as exc:
                    context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
        return handler
    return wrap


class SwitchService(StreamService):
    """Unary RPCs run on the server's thread pool under `lock`; StreamChannel (StreamService) runs
    on its event loop and takes only `arb_lock` (held for list updates and queue puts), so idle
    streams hold no thread and a long pipeline compile does not stall them."""

    def __init__(self, engine: Engine, device_id: int = 0, drop_port: int = compiler.DEFAULT_DROP_PORT,
                 cpu_port: int | None = None, inject=None):
        super().__init__(device_id, cpu_port, inject)
        self.engine = engine
        self.drop_port = drop_port
        self.saved: Pipeline | None = None
        self.lock = engine.lock  # the compiled path syncs its tables under it: a batch sees whole writes
        self.startup_json = b""  # the program given on the command line, until a controller sets one


    def load_startup_program(self, program: compiler.CompiledProgram, json_bytes: bytes) -> bool:
        """Run the command line's program, unless a controller pushed a pipeline meanwhile (it wins)."""
        with self.lock:
            if self.pipeline is not None:
                return False
            self.engine.load(program)
            self.startup_json = json_bytes
            return True

    def running_json(self) -> bytes:
        """The BMv2 JSON the engine runs (b"" with none), as BMv2's bm_get_config returns it."""
        pl = self.pipeline
        return pl.device_config if pl is not None else self.startup_json

    # --- pipeline ---------------------------------------------------------
    @_rpc(primary=True)
    def SetForwardingPipelineConfig(self, request, context):
        A = p4runtime_pb2.SetForwardingPipelineConfigRequest
        action = request.action
        if action == A.UNSPECIFIED:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Invalid SetForwardingPipelineConfig action")
        if action == A.COMMIT:
            if self.saved is None:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, "No saved config to commit")
            self._commit(self.saved)
            self.saved = None
            return p4runtime_pb2.SetForwardingPipelineConfigResponse()
        cfg = request.config
        pl = build_pipeline(cfg.p4info, cfg.p4_device_config, cfg.cookie.cookie, self.drop_port)
        if action == A.VERIFY_AND_SAVE:
            self.saved = pl
        elif action == A.RECONCILE_AND_COMMIT and self.pipeline is not None \
                and self.pipeline.device_config == pl.device_config \
                and self.pipeline.p4info == pl.p4info:
            self.pipeline.cookie = pl.cookie  # same program: keep all state
        elif action != A.VERIFY:
            self._commit(pl)
        return p4runtime_pb2.SetForwardingPipelineConfigResponse()

    def _commit(self, pl: Pipeline) -> None:
        self.pipeline = pl
        self.engine.load(pl.program)
        log.info("pipeline set: %d tables, %d counters", len(pl.tables), len(pl.counters))

    @_rpc()
    def GetForwardingPipelineConfig(self, request, context):
        resp = p4runtime_pb2.GetForwardingPipelineConfigResponse()
        pl = self.pipeline
        if pl is None:
            return resp
        R = p4runtime_pb2.GetForwardingPipelineConfigRequest
        rt = request.response_type
        resp.config.cookie.cookie = pl.cookie
        if rt in (R.ALL, R.P4INFO_AND_COOKIE):
            resp.config.p4info.CopyFrom(pl.p4info)
        if rt in (R.ALL, R.DEVICE_CONFIG_AND_COOKIE):
            resp.config.p4_device_config = pl.device_config
        return resp

    def Capabilities(self, request, context):
        return p4runtime_pb2.CapabilitiesResponse(p4runtime_api_version=API_VERSION)

    # --- write ---------------------------------------------------------------
    @_rpc(primary=True, pipeline=True)
    def Write(self, request, context):
        if request.atomicity != p4runtime_pb2.WriteRequest.CONTINUE_ON_ERROR:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Only CONTINUE_ON_ERROR atomicity is supported")
        results = []
        for u in request.updates:
            try:
                apply_update(self.pipeline, self.engine.pre, u)
                results.append(None)
            except (P4RTError, TableError) as exc:
                results.append((exc.code, str(exc)))
        if any(results):
            status = status_pb2.Status(code=code_pb2.UNKNOWN, message="Write failure.")
            for r in results:
                err = p4runtime_pb2.Error()
                if r is None:
                    err.canonical_code = code_pb2.OK
                else:
                    err.canonical_code = getattr(code_pb2, r[0])
                    err.message = r[1]
                    err.space = "ALL-sswitch-p4org"
                a = any_pb2.Any()
                a.Pack(err)
                status.details.append(a)
            context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
            first = next(r for r in results if r)
            context.abort(grpc.StatusCode.UNKNOWN, f"Write failure: {first[1]}")
        return p4runtime_pb2.WriteResponse()

    # --- read ------------------------------------------------------------------
    @_rpc(pipeline=True)
    def Read(self, request, context):
        resp = p4runtime_pb2.ReadResponse()
        for ent in request.entities:
            read_entity(self.pipeline, ent, resp)
        return iter((resp,))


def server_credentials(cert: str, key: str, cacert: str | None = None,
                       client_auth: bool = False) -> grpc.ServerCredentials:
    """TLS as BMv2's --grpc-server-ssl options give it; with client_auth, clients must present a
    certificate signed by cacert. OSError names a file that cannot be read or holds no PEM
    (gRPC itself would only say that it failed to bind)."""
    def read(path: str) -> bytes:
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError as exc:
            raise OSError(f"cannot read {path}: {exc.strerror}") from None
        if b"-----BEGIN " not in data:
            raise OSError(f"{path} is not a PEM file")
        return data

    return grpc.ssl_server_credentials([(read(key), read(cert))], root_certificates=read(cacert) if cacert else None,
                                       require_client_auth=client_auth)


def check_address_free(addr: str) -> None:
    """OSError naming `addr` if another process listens there. gRPC alone would say only that it
    failed to bind, and without SO_REUSEADDR-only binding two switches could share the port."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or host.startswith("unix"):
        return
    try:
        infos = socket.getaddrinfo(host.strip("[]") or None, int(port), type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"cannot listen on {addr}: {exc.strerror}") from None
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC: TIME_WAIT is no conflict
            try:
                s.bind(sockaddr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise OSError(f"{addr} is already in use by another process") from None
                raise OSError(f"cannot listen on {addr}: {exc.strerror}") from None


class Server:
    """The gRPC server around a SwitchService; plaintext unless given TLS credentials.

    An asyncio server on its own thread: StreamChannel calls are coroutines on its event loop, so
    any number of idle streams leave the unary RPCs (run on a thread pool) free. The port is
    bound without SO_REUSEPORT: a second switch on the same address fails instead of sharing it."""

    def __init__(self, service: SwitchService, addr: str, credentials: grpc.ServerCredentials | None = None):
        self.service = service
        self.addr = addr
        check_address_free(addr)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="p4rt-loop", daemon=True)
        self._thread.start()
        try:
            self.grpc = self._call(self._create(credentials))
        except BaseException:
            self._close_loop()
            raise

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _create(self, credentials):
        srv = grpc.aio.server(futures.ThreadPoolExecutor(max_workers=UNARY_THREADS, thread_name_prefix="p4rt"),
                              options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", MAX_MESSAGE),
                                       ("grpc.max_send_message_length", MAX_MESSAGE)])
        p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(self.service, srv)
        try:
            port = srv.add_secure_port(self.addr, credentials) if credentials else srv.add_insecure_port(self.addr)
        except RuntimeError:
            port = 0
        if port == 0:
            raise OSError(f"cannot listen on {self.addr}")
        return srv

    def start(self) -> None:
        self._call(self.grpc.start())

    def stop(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._call(asyncio.wait_for(self.grpc.stop(grace=0.5), 2))
        except (asyncio.TimeoutError, futures.TimeoutError):
            pass
        self._close_loop()

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(2)
        if not self._loop.is_running():
            self._loop.close()
