"""BMv2's Thrift runtime API, the read-only part `simple_switch_CLI` uses to inspect a switch.

The wire format (Thrift's strict binary protocol over a plain TCP stream, calls multiplexed as
"service:method" as BMv2's TMultiplexedProcessor expects) is written once here: `ThriftClient`
talks to BMv2's `--thrift-port` and to the embedded switch's Thrift server alike, and that server
(softswitch/thrift_server.py) decodes and encodes with the same functions. The service and
method names, argument ids and result structs follow BMv2's thrift_src/standard.thrift and
simple_pre_lag.thrift.
"""
from __future__ import annotations

import json
import socket
import struct
from typing import Any, Callable

# Thrift wire types
T_STOP, T_BOOL, T_BYTE, T_DOUBLE, T_I16, T_I32, T_I64 = 0, 2, 3, 4, 6, 8, 10
T_STRING, T_STRUCT, T_MAP, T_SET, T_LIST = 11, 12, 13, 14, 15
# message types
CALL, REPLY, EXCEPTION, ONEWAY = 1, 2, 3, 4
VERSION_1 = 0x80010000
VERSION_MASK = 0xFFFF0000
# TApplicationException types
UNKNOWN_METHOD, PROTOCOL_ERROR, INTERNAL_ERROR = 1, 7, 6
MAX_STRING = 64 << 20  # a BMv2 JSON is a few MB at most; anything larger is a broken stream
MAX_ITEMS = 1 << 24

# BmMatchParamType and BmActionEntryType
MATCH_EXACT, MATCH_LPM, MATCH_TERNARY, MATCH_VALID, MATCH_RANGE = 0, 1, 2, 3, 4
MATCH_NAMES = {MATCH_EXACT: "EXACT", MATCH_LPM: "LPM", MATCH_TERNARY: "TERNARY", MATCH_VALID: "VALID",
               MATCH_RANGE: "RANGE"}
ACTION_NONE, ACTION_DATA = 0, 1

# the `code` of each service exception, by name (the subset this module reports)
TABLE_ERRORS = {1: "TABLE_FULL", 2: "INVALID_HANDLE", 7: "INVALID_TABLE_NAME", 8: "INVALID_ACTION_NAME",
                9: "WRONG_TABLE_TYPE", 18: "BAD_MATCH_KEY", 22: "NO_DEFAULT_ENTRY", 100: "ERROR"}
COUNTER_ERRORS = {1: "INVALID_COUNTER_NAME", 2: "INVALID_INDEX", 3: "ERROR"}
REGISTER_ERRORS = {1: "INVALID_REGISTER_NAME", 2: "INVALID_INDEX", 3: "ERROR"}
MC_ERRORS = {1: "TABLE_FULL", 2: "INVALID_MGID", 3: "INVALID_MGRP_HANDLE", 4: "INVALID_L1_HANDLE", 5: "ERROR"}


class ThriftError(Exception):
    """A call failed: the switch said why, or the connection did. One line."""


class ThriftWireError(ValueError):
    """Bytes that are not a Thrift message of the strict binary protocol."""


# --- encoding ---------------------------------------------------------------
# A value to encode is given with its type: (T_I32, 5), (T_STRING, "x"), (T_STRUCT, [(field id,
# type, value), ...]) (None values are omitted: optional fields), (T_LIST, (element type, [values])),
# (T_MAP, (key type, value type, {k: v})).

def encode(ttype: int, value: Any) -> bytes:
    if ttype == T_BOOL:
        return b"\x01" if value else b"\x00"
    if ttype == T_BYTE:
        return struct.pack(">b", value)
    if ttype == T_I16:
        return struct.pack(">h", value)
    if ttype == T_I32:
        return struct.pack(">i", value)
    if ttype == T_I64:
        return struct.pack(">q", value)
    if ttype == T_DOUBLE:
        return struct.pack(">d", value)
    if ttype == T_STRING:
        data = value.encode() if isinstance(value, str) else bytes(value)
        return struct.pack(">i", len(data)) + data
    if ttype == T_STRUCT:
        out = [struct.pack(">bh", ft, fid) + encode(ft, v) for fid, ft, v in value if v is not None]
        return b"".join(out) + b"\x00"
    if ttype in (T_LIST, T_SET):
        etype, items = value
        return struct.pack(">bi", etype, len(items)) + b"".join(encode(etype, v) for v in items)
    if ttype == T_MAP:
        ktype, vtype, items = value
        return struct.pack(">bbi", ktype, vtype, len(items)) + b"".join(
            encode(ktype, k) + encode(vtype, v) for k, v in items.items())
    raise ValueError(f"unknown Thrift type {ttype}")


def message(name: str, mtype: int, seqid: int, fields: list) -> bytes:
    """One message: header, then the arguments (CALL) or the result (REPLY) as a struct."""
    return struct.pack(">I", VERSION_1 | mtype) + encode(T_STRING, name) + struct.pack(">i", seqid) \
        + encode(T_STRUCT, fields)


def app_exception(name: str, seqid: int, kind: int, text: str) -> bytes:
    return message(name, EXCEPTION, seqid, [(1, T_STRING, text), (2, T_I32, kind)])


# --- decoding ---------------------------------------------------------------
# Decoded structs are {field id: value}; strings stay bytes (binary and string share a wire type).

def read_value(read: Callable[[int], bytes], ttype: int) -> Any:
    """One value of `ttype` from `read(n)`, which returns exactly n bytes or raises."""
    if ttype == T_BOOL:
        return read(1) != b"\x00"
    if ttype == T_BYTE:
        return struct.unpack(">b", read(1))[0]
    if ttype == T_I16:
        return struct.unpack(">h", read(2))[0]
    if ttype == T_I32:
        return struct.unpack(">i", read(4))[0]
    if ttype == T_I64:
        return struct.unpack(">q", read(8))[0]
    if ttype == T_DOUBLE:
        return struct.unpack(">d", read(8))[0]
    if ttype == T_STRING:
        n = struct.unpack(">i", read(4))[0]
        if not 0 <= n <= MAX_STRING:
            raise ThriftWireError(f"string of {n} bytes")
        return read(n)
    if ttype == T_STRUCT:
        out = {}
        while True:
            ft = read(1)[0]
            if ft == T_STOP:
                return out
            fid = struct.unpack(">h", read(2))[0]
            out[fid] = read_value(read, ft)
    if ttype in (T_LIST, T_SET):
        etype, n = struct.unpack(">bi", read(5))
        if not 0 <= n <= MAX_ITEMS:
            raise ThriftWireError(f"list of {n} items")
        return [read_value(read, etype) for _ in range(n)]
    if ttype == T_MAP:
        ktype, vtype, n = struct.unpack(">bbi", read(6))
        if not 0 <= n <= MAX_ITEMS:
            raise ThriftWireError(f"map of {n} items")
        return {_hashable(read_value(read, ktype)): read_value(read, vtype) for _ in range(n)}
    raise ThriftWireError(f"unknown Thrift type {ttype}")


def _hashable(v):
    return tuple(v) if isinstance(v, list) else v


def read_message(read: Callable[[int], bytes]) -> tuple[str, int, int, dict]:
    """(name, message type, seqid, struct fields) of the next message."""
    head = struct.unpack(">I", read(4))[0]
    if head & VERSION_MASK != VERSION_1:
        raise ThriftWireError("not the strict binary protocol (TBinaryProtocol)")
    name = read_value(read, T_STRING).decode(errors="replace")
    seqid = struct.unpack(">i", read(4))[0]
    return name, head & 0xFF, seqid, read_value(read, T_STRUCT)


def int64(v: int) -> int:
    """A register cell as BMv2 returns it (`Data::get<int64_t>`): the low 64 bits, signed."""
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >> 63 else v


# --- client -----------------------------------------------------------------

class ThriftClient:
    """simple_switch_CLI's inspection commands, over one connection to BMv2 or the embedded switch.

    Names may be given in full or by a unique suffix (`acc` for `MindpIngress.aggregation.acc`),
    resolved against the switch's own JSON as the CLI does."""

    def __init__(self, host: str = "127.0.0.1", port: int = 9090, timeout: float = 3.0):
        self.where = f"{host}:{port}"
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise ThriftError(f"cannot connect to the Thrift server at {self.where}: "
                              f"{exc.strerror or exc}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rfile = self.sock.makefile("rb")
        self.seqid = 0
        self._config: dict | None = None

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()

    def __enter__(self) -> ThriftClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- transport ------------------------------------------------------
    def _read(self, n: int) -> bytes:
        data = self.rfile.read(n)
        if len(data) != n:
            raise ThriftError(f"the Thrift server at {self.where} closed the connection")
        return data

    def call(self, service: str, method: str, args: list, errors: dict | None = None) -> Any:
        """Result (field 0) of `service:method`; the service's exception (field 1) or a
        TApplicationException raises ThriftError naming the method and the error."""
        self.seqid += 1
        try:
            self.sock.sendall(message(f"{service}:{method}", CALL, self.seqid, args))
            _, mtype, _, fields = read_message(self._read)
        except socket.timeout:
            raise ThriftError(f"{method}: no answer from the Thrift server at {self.where}") from None
        except ThriftWireError as exc:
            raise ThriftError(f"{method}: bad answer from the Thrift server at {self.where}: {exc}") from None
        except OSError as exc:
            raise ThriftError(f"{method}: Thrift server at {self.where}: {exc.strerror or exc}") from None
        if mtype == EXCEPTION:
            text = fields.get(1, b"").decode(errors="replace")
            raise ThriftError(f"{method}: {text or 'failed'}")
        if 1 in fields:
            code = fields[1].get(1) if isinstance(fields[1], dict) else None
            raise ThriftError(f"{method}: {(errors or {}).get(code, f'error code {code}')}")
        return fields.get(0)

    def _standard(self, method: str, args: list, errors: dict | None = None) -> Any:
        return self.call("standard", method, args, errors)

    # --- program ------------------------------------------------------
    def get_config(self) -> str:
        """The BMv2 JSON the switch runs ("" with none)."""
        return (self._standard("bm_get_config", []) or b"").decode()

    def config(self) -> dict:
        if self._config is None:
            text = self.get_config()
            try:
                self._config = json.loads(text) if text else {}
            except ValueError:
                raise ThriftError(f"the switch at {self.where} returned a JSON config that does not parse") from None
        return self._config

    def _resolve(self, kind: str, name: str) -> str:
        """The full name for a unique suffix, as simple_switch_CLI resolves them; else `name`."""
        cfg = self.config()
        if kind == "tables":
            names = [t["name"] for p in cfg.get("pipelines", []) for t in p.get("tables", [])]
        else:
            names = [x["name"] for x in cfg.get(kind, [])]
        if name in names:
            return name
        found = [n for n in names if n.endswith("." + name)]
        return found[0] if len(found) == 1 else name

    # --- registers and counters -----------------------------------------
    def register_read(self, name: str, index: int) -> int:
        full = self._resolve("register_arrays", name)
        return self._standard("bm_register_read", [(1, T_I32, 0), (2, T_STRING, full), (3, T_I32, index)],
                              REGISTER_ERRORS)

    def register_read_all(self, name: str) -> list[int]:
        full = self._resolve("register_arrays", name)
        return self._standard("bm_register_read_all", [(1, T_I32, 0), (2, T_STRING, full)], REGISTER_ERRORS)

    def counter_read(self, name: str, index: int) -> tuple[int, int]:
        """(bytes, packets) of an indirect counter cell."""
        full = self._resolve("counter_arrays", name)
        value = self._standard("bm_counter_read", [(1, T_I32, 0), (2, T_STRING, full), (3, T_I32, index)],
                               COUNTER_ERRORS)
        return value.get(1, 0), value.get(2, 0)

    # --- tables and multicast, as the CLI prints them --------------------
    def table_dump(self, table: str) -> str:
        full = self._resolve("tables", table)
        args = [(1, T_I32, 0), (2, T_STRING, full)]
        entries = self._standard("bm_mt_get_entries", args, TABLE_ERRORS)
        default = self._standard("bm_mt_get_default_entry", args, TABLE_ERRORS)
        keys = next((t.get("key", []) for p in self.config().get("pipelines", []) for t in p.get("tables", [])
                     if t["name"] == full), [])
        names = [_key_name(k) for k in keys]
        width = max([20, *map(len, names)])
        out = ["==========", "TABLE ENTRIES"]
        for e in entries:
            out += ["**********", f"Dumping entry {hex(e.get(3, 0))}", "Match key:"]
            for name, p in zip(names, e.get(1, [])):
                kind = p.get(1, MATCH_EXACT)
                out.append(f"* {name:{width}}: {MATCH_NAMES.get(kind, '?'):10}{_match_text(kind, p)}")
            priority = e.get(2, {}).get(1, -1)
            if priority >= 0:
                out.append(f"Priority: {priority}")
            out.append(_action_text(e.get(4, {})))
        out += ["==========", "Dumping default entry", _action_text(default or {}), "=========="]
        return "\n".join(out)

    def mc_dump(self) -> str:
        text = self.call("simple_pre_lag", "bm_mc_get_entries", [(1, T_I32, 0)], MC_ERRORS)
        try:
            mc = json.loads(text)
            l1 = {h["handle"]: (h["rid"], h["l2_handle"]) for h in mc["l1_handles"]}
            l2 = {h["handle"]: (h["ports"], h["lags"]) for h in mc["l2_handles"]}
            out = ["==========", "MC ENTRIES"]
            for g in mc["mgrps"]:
                out += ["**********", f"mgrp({g['id']})"]
                for h in g["l1_handles"]:
                    rid, l2h = l1[h]
                    ports, lags = l2[l2h]
                    out.append(f"  -> (L1h={h}, rid={rid}) -> (ports=[{', '.join(map(str, ports))}], "
                               f"lags=[{', '.join(map(str, lags))}])")
        except (ValueError, KeyError, TypeError):
            raise ThriftError(f"bm_mc_get_entries: the switch at {self.where} returned malformed JSON") from None
        out += ["==========", "LAGS"]
        if "lags" in mc:
            out += [f"lag({lag['id']}) -> ports=[{', '.join(map(str, lag.get('ports', [])))}]" for lag in mc["lags"]]
        else:
            out.append("None for this PRE type")
        out.append("==========")
        return "\n".join(out)


def _key_name(key: dict) -> str:
    """A key field as the CLI names it: header.field, or header_valid."""
    target = key.get("target", [])
    if not isinstance(target, list):
        return f"{target}_valid"
    if key.get("match_type") == "valid" or target[-1:] == ["$valid$"]:
        return f"{target[0]}_valid"
    return ".".join(map(str, target))


def _match_text(kind: int, p: dict) -> str:
    if kind == MATCH_EXACT:
        return p.get(2, {}).get(1, b"").hex()
    if kind == MATCH_LPM:
        lpm = p.get(3, {})
        return f"{lpm.get(1, b'').hex()}/{lpm.get(2, 0)}"
    if kind == MATCH_TERNARY:
        t = p.get(4, {})
        return f"{t.get(1, b'').hex()} &&& {t.get(2, b'').hex()}"
    if kind == MATCH_VALID:
        return "01" if p.get(5, {}).get(1) else "00"
    r = p.get(6, {})
    return f"{r.get(1, b'').hex()} -> {r.get(2, b'').hex()}"


def _action_text(a: dict) -> str:
    if a.get(1, ACTION_NONE) != ACTION_DATA:
        return "EMPTY"
    return f"Action entry: {a.get(2, b'').decode()} - {', '.join(d.hex() for d in a.get(3, []))}"
