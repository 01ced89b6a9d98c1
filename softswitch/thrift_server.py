"""Thrift server of the embedded switch on `--thrift-port`: the read-only part of BMv2's runtime
API that simple_switch_CLI's inspection commands call, so `register_read`, `counter_read`,
`table_dump`, `mc_dump` and `switch_info` give the same answers as on BMv2 (and
mindp.bmthrift.ThriftClient works against either target).

Served: standard: bm_get_config, bm_get_config_md5, bm_mgmt_get_info, bm_register_read,
bm_register_read_all, bm_counter_read, bm_mt_get_num_entries, bm_mt_get_entries,
bm_mt_get_default_entry; simple_pre_lag: bm_mc_get_entries. Anything else is answered with
Thrift's UNKNOWN_METHOD application exception (the CLI prints it; state changes go through
P4Runtime). Entry handles are positions in the table, valid for one dump.
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import socket
import socketserver
import threading
from typing import Callable

from mindp.bmthrift import (ACTION_DATA, ACTION_NONE, INTERNAL_ERROR, MATCH_EXACT, MATCH_LPM, MATCH_RANGE,
                            MATCH_TERNARY, MATCH_VALID, REPLY, T_BOOL, T_I32, T_I64, T_LIST, T_STRING, T_STRUCT, UNKNOWN_METHOD, ThriftWireError, app_exception, int64, message,
                            read_message)

from .p4runtime_server import SwitchService

log = logging.getLogger("softswitch")
MAX_CONNECTIONS = 16
INVALID_TABLE_NAME = 7
INVALID_NAME, INVALID_INDEX = 1, 2  # counter and register exceptions share these codes


class _Ouch(Exception):
    """The method's declared exception (result field 1) with its code."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def _nbytes(width: int) -> int:
    return max(1, (width + 7) // 8)


def _bytes(v: int, width: int) -> bytes:
    return (v & ((1 << width) - 1)).to_bytes(_nbytes(width), "big")


class RuntimeAPI:
    """The methods, over a SwitchService's engine and pipeline. Each returns the result fields."""

    def __init__(self, service: SwitchService, thrift_port: int):
        self.service = service
        self.thrift_port = thrift_port
        self.methods: dict[str, Callable[[dict], list]] = {
            "standard:bm_get_config": self.get_config,
            "standard:bm_get_config_md5": self.get_config_md5,
            "standard:bm_mgmt_get_info": self.mgmt_get_info,
            "standard:bm_register_read": self.register_read,
            "standard:bm_register_read_all": self.register_read_all,
            "standard:bm_counter_read": self.counter_read,
            "standard:bm_mt_get_num_entries": self.mt_get_num_entries,
            "standard:bm_mt_get_entries": self.mt_get_entries,
            "standard:bm_mt_get_default_entry": self.mt_get_default_entry,
            "simple_pre_lag:bm_mc_get_entries": self.mc_get_entries,
        }

    def call(self, name: str, seqid: int, args: dict) -> bytes:
        """The reply message to one call."""
        method = self.methods.get(name)
        short = name.partition(":")[2] or name
        if method is None:
            return app_exception(short, seqid, UNKNOWN_METHOD, f"Invalid method name: '{name}'")
        try:
            fields = method(args)
        except _Ouch as exc:
            fields = [(1, T_STRUCT, [(1, T_I32, exc.code)])]
        except (KeyError, TypeError, ValueError, UnicodeDecodeError) as exc:  # an argument missing or mistyped
            return app_exception(short, seqid, INTERNAL_ERROR, f"{short}: bad arguments ({type(exc).__name__})")
        return message(short, REPLY, seqid, fields)

    # --- program ----------------------------------------------------------
    def get_config(self, args: dict) -> list:
        return [(0, T_STRING, self.service.running_json())]

    def get_config_md5(self, args: dict) -> list:
        return [(0, T_STRING, hashlib.md5(self.service.running_json()).digest())]

    def mgmt_get_info(self, args: dict) -> list:
        return [(0, T_STRUCT, [(1, T_I64, self.service.device_id), (2, T_I32, self.thrift_port)])]

    def _program(self):
        program = self.service.engine.program
        if program is None:
            raise _Ouch(INVALID_NAME)
        return program

    # --- registers and counters ---------------------------------------------
    def _register(self, args: dict) -> list:
        cells = self._program().registers.get(args[2].decode())
        if cells is None:
            raise _Ouch(INVALID_NAME)
        return cells

    def register_read(self, args: dict) -> list:
        cells = self._register(args)
        i = args[3]
        if not 0 <= i < len(cells):
            raise _Ouch(INVALID_INDEX)
        return [(0, T_I64, int64(cells[i]))]

    def register_read_all(self, args: dict) -> list:
        return [(0, T_LIST, (T_I64, [int64(v) for v in list(self._register(args))]))]

    def counter_read(self, args: dict) -> list:
        program = self._program()
        name = args[2].decode()
        cells = program.counters.get(name)
        if cells is None or name in program.counter_direct:  # BMv2 reads direct counters by entry
            raise _Ouch(INVALID_NAME)
        packets, nbytes = cells
        i = args[3]
        if not 0 <= i < len(packets):
            raise _Ouch(INVALID_INDEX)
        return [(0, T_STRUCT, [(1, T_I64, nbytes[i]), (2, T_I64, packets[i])])]

    # --- tables ---------------------------------------------------------------
    def _table(self, args: dict):
        program = self.service.engine.program
        table = program.tables.get(args[2].decode()) if program is not None else None
        if table is None:
            raise _Ouch(INVALID_TABLE_NAME)
        return table

    def mt_get_num_entries(self, args: dict) -> list:
        return [(0, T_I64, len(self._table(args).entries))]

    def mt_get_entries(self, args: dict) -> list:
        table = self._table(args)
        with self.service.lock:  # P4Runtime writes hold it
            entries = list(table.entries.values())
        prioritized = any(k.kind in ("ternary", "range", "optional") for k in table.keys)
        out = []
        for handle, e in enumerate(entries):
            key = [self._match_param(k.kind, k.width, m) for k, m in zip(table.keys, e.match)]
            out.append([(1, T_LIST, (T_STRUCT, key)),
                        (2, T_STRUCT, [(1, T_I32, e.priority if prioritized else -1)]),
                        (3, T_I32, handle),
                        (4, T_STRUCT, self._action_entry(table, e.action_id, e.args))])
        return [(0, T_LIST, (T_STRUCT, out))]

    def mt_get_default_entry(self, args: dict) -> list:
        table = self._table(args)
        with self.service.lock:
            aid, params = table.default_action_id, table.default_args
        return [(0, T_STRUCT, self._action_entry(table, aid, params))]

    @staticmethod
    def _match_param(kind: str, width: int, m) -> list:
        if kind == "exact":
            return [(1, T_I32, MATCH_EXACT), (2, T_STRUCT, [(1, T_STRING, _bytes(m, width))])]
        if kind == "valid":
            return [(1, T_I32, MATCH_VALID), (5, T_STRUCT, [(1, T_BOOL, bool(m))])]
        if kind == "lpm":
            return [(1, T_I32, MATCH_LPM), (3, T_STRUCT, [(1, T_STRING, _bytes(m[0], width)), (2, T_I32, m[1])])]
        if kind == "range":
            return [(1, T_I32, MATCH_RANGE),
                    (6, T_STRUCT, [(1, T_STRING, _bytes(m[0], width)), (2, T_STRING, _bytes(m[1], width))])]
        return [(1, T_I32, MATCH_TERNARY),  # ternary and optional, as BMv2 stores optional
                (4, T_STRUCT, [(1, T_STRING, _bytes(m[0], width)), (2, T_STRING, _bytes(m[1], width))])]

    @staticmethod
    def _action_entry(table, action_id: int, params: tuple) -> list:
        spec = table.actions.get(action_id)
        if spec is None:
            return [(1, T_I32, ACTION_NONE)]
        # BMv2 returns action data without leading zero bytes (Data::get_string), keys at full width
        data = [(v & ((1 << w) - 1)).to_bytes(max(1, (v.bit_length() + 7) // 8), "big")
                for v, w in zip(params, spec.param_widths)]
        return [(1, T_I32, ACTION_DATA), (2, T_STRING, spec.name), (3, T_LIST, (T_STRING, data))]

    # --- multicast --------------------------------------------------------------
    def mc_get_entries(self, args: dict) -> list:
        """BMv2's SimplePreLAG JSON: one L1 node per (group, rid) holding that rid's ports, as
        BMv2's P4Runtime server builds groups; L2 handle = L1 handle."""
        with self.service.lock:
            groups = {gid: list(replicas) for gid, replicas in self.service.engine.pre.items()}
        mgrps, l1, l2 = [], [], []
        for gid in sorted(groups):
            by_rid: dict[int, set] = {}
            for port, rid in groups[gid]:
                by_rid.setdefault(rid, set()).add(port)
            handles = []
            for rid, ports in by_rid.items():
                h = len(l1)
                handles.append(h)
                l1.append({"handle": h, "rid": rid, "l2_handle": h})
                l2.append({"handle": h, "ports": sorted(ports), "lags": []})
            mgrps.append({"id": gid, "l1_handles": handles})
        doc = {"mgrps": mgrps, "l1_handles": l1, "l2_handles": l2, "lags": []}
        return [(0, T_STRING, json.dumps(doc))]


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        server: ThriftServer = self.server  # type: ignore[assignment]
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def read(n: int) -> bytes:
            data = self.rfile.read(n)
            if len(data) != n:
                raise EOFError
            return data

        while True:
            try:
                name, _, seqid, args = read_message(read)
            except (EOFError, OSError):
                return
            except ThriftWireError as exc:
                server.bad_requests += 1
                log.warning("Thrift: closed a connection from %s: %s", self.client_address[0], exc)
                return
            self.wfile.write(server.api.call(name, seqid, args))
            self.wfile.flush()


class ThriftServer(socketserver.ThreadingTCPServer):
    """One thread per connection, at most MAX_CONNECTIONS (more are closed at once). Bound with
    SO_REUSEADDR only, so a port another process listens on is refused."""

    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False

    def __init__(self, service: SwitchService, host: str, port: int):
        self.api = RuntimeAPI(service, port)
        self.bad_requests = 0
        self._active = threading.BoundedSemaphore(MAX_CONNECTIONS)
        try:
            super().__init__((host, port), _Handler)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise OSError(f"Thrift port {port} is already in use by another process") from None
            raise OSError(f"cannot listen on {host}:{port} for Thrift: {exc.strerror}") from None
        self._thread: threading.Thread | None = None

    def verify_request(self, request, client_address) -> bool:
        return self._active.acquire(blocking=False)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._active.release()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="thrift", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self.shutdown()
            self._thread.join(2)
        self.server_close()
