"""Command line shaped like simple_switch_grpc:

  mindp-softswitch [--device-id N] [--log-file F] [--log-console] [-L LEVEL] [--pcap DIR]
      [--thrift-port N] [--rx-usecs US --rx-frames N] [-i PORT@IFACE ...] [--drop-prob P --dup-prob P
      --reorder-prob P --seed S] (JSON | --no-p4)
      [-- --grpc-server-addr HOST:PORT --cpu-port N --drop-port N
          --grpc-server-ssl --grpc-server-cacert F --grpc-server-cert F --grpc-server-key F
          --grpc-server-with-client-auth]
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from mindp.switch_constants import MAX_PORT

DEFAULT_GRPC = "127.0.0.1:9559"
DEFAULT_THRIFT = 9090  # as BMv2
# receive coalescing (dataplane.RxCoalesce), off by default: it trades latency for fewer wake-ups,
# and whether that pays depends on the load (docs/SOFTSWITCH.md). Re-measured with make run's gpt
# (11/2026, 2 and 4 workers): 100-500 us cut the switch's wake-ups 3-5 fold and its CPU ~15%, but
# steps/s moved from -20% to +50% round to round on the loaded 2-core host: no win shown, so off
RX_USECS = 0
RX_FRAMES = 1
# v1model's ports are 9 bits: 0..511, the last BMv2's default drop port (mindp's hosts take ports up to
# MAX_PORT, just below it)
LAST_PORT = MAX_PORT + 1
FAULTS = ("drop_prob", "dup_prob", "reorder_prob")
# BMv2's -L values (and two Python spellings); debug and trace turn on the per-packet lines that
# the engine logs on "softswitch.trace", as BMv2 logs them at debug
LEVELS = {"off": None, "critical": logging.CRITICAL, "error": logging.ERROR, "warn": logging.WARNING,
          "warning": logging.WARNING, "info": logging.INFO, "debug": logging.DEBUG, "trace": logging.DEBUG}


class SwitchUsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise SwitchUsageError(message)


def parse_port(spec: str) -> tuple[int, str]:
    num, sep, iface = spec.partition("@")
    if not sep or not num.isdecimal() or not iface:
        raise SwitchUsageError(f"bad interface {spec!r}: expected PORT@IFACE, e.g. 1@veth1")
    if int(num) > LAST_PORT:
        raise SwitchUsageError(f"bad interface {spec!r}: port {int(num)} is not within 0..{LAST_PORT} (9 bits)")
    return int(num), iface


def parse_args(argv: list[str]) -> argparse.Namespace:
    if "--" in argv:
        i = argv.index("--")
        main, target = argv[:i], argv[i + 1:]
    else:
        main, target = argv, []
    p = _Parser(prog="mindp-softswitch", description="Embedded P4 switch running a BMv2 JSON (v1model).")
    p.add_argument("json", nargs="?", help="BMv2 JSON program (p4c-bm2-ss output)")
    p.add_argument("--no-p4", action="store_true", help="start without a program; wait for P4Runtime")
    p.add_argument("-i", "--interface", action="append", default=[], metavar="PORT@IFACE")
    p.add_argument("--device-id", type=int, default=0)
    p.add_argument("--log-file", help="log to this file (as BMv2: nothing is logged without it or --log-console)")
    p.add_argument("-L", "--log-level", default="info", choices=sorted(LEVELS),
                   help="debug/trace: one line per parser state, table, register effect and egress of each packet")
    p.add_argument("--log-console", action="store_true", help="log to stderr")
    p.add_argument("--pcap", nargs="?", const=".", metavar="DIR")
    p.add_argument("--thrift-port", type=int, help=f"simple_switch_CLI's port (read-only subset; default "
                   f"{DEFAULT_THRIFT}, on the gRPC address's host)")
    p.add_argument("--rx-usecs", type=int, default=RX_USECS, metavar="US",
                   help="receive coalescing: after a serve of --rx-frames frames or more, the next serve waits "
                        "until US microseconds have passed (fewer, larger batches; e.g. 100; default %(default)s: off)")
    p.add_argument("--rx-frames", type=int, metavar="N", help="with --rx-usecs: the frames a serve takes to hold "
                   f"the next one back (default {RX_FRAMES})")
    for name in FAULTS:
        p.add_argument(f"--{name.replace('_', '-')}", type=float, metavar="P", help="default 0")
    p.add_argument("--seed", type=int, help="the fault injection's random numbers (default 0)")
    p.add_argument("--drop-port", type=int, metavar="N", help=f"default {LAST_PORT}; or after --, as BMv2's")
    p.add_argument("--pipeline", choices=("compiled", "python"), default=None,
                   help="compiled: batches run as native code built from the JSON (the default; "
                        "MINDP_SOFTSWITCH_PIPELINE sets it too); python: the generated Python pipeline only")
    args = p.parse_args(main)
    t = _Parser(prog="mindp-softswitch ... --")
    t.add_argument("--grpc-server-addr", default=DEFAULT_GRPC)
    t.add_argument("--cpu-port", type=int)
    t.add_argument("--drop-port", type=int)
    t.add_argument("--grpc-server-ssl", action="store_true")
    t.add_argument("--grpc-server-cacert")
    t.add_argument("--grpc-server-cert")
    t.add_argument("--grpc-server-key")
    t.add_argument("--grpc-server-with-client-auth", action="store_true")
    targs = t.parse_args(target)
    args.tls = None
    if targs.grpc_server_ssl:
        if not (targs.grpc_server_cert and targs.grpc_server_key):
            raise SwitchUsageError("--grpc-server-ssl needs --grpc-server-cert and --grpc-server-key")
        if targs.grpc_server_with_client_auth and not targs.grpc_server_cacert:
            raise SwitchUsageError("--grpc-server-with-client-auth needs --grpc-server-cacert")
        args.tls = (targs.grpc_server_cert, targs.grpc_server_key, targs.grpc_server_cacert,
                    targs.grpc_server_with_client_auth)
    elif targs.grpc_server_cacert or targs.grpc_server_cert or targs.grpc_server_key \
            or targs.grpc_server_with_client_auth:
        raise SwitchUsageError("TLS options need --grpc-server-ssl")
    args.grpc_server_addr = targs.grpc_server_addr
    if args.thrift_port is not None and not 0 < args.thrift_port < 65536:
        raise SwitchUsageError(f"--thrift-port {args.thrift_port}: not a TCP port")
    if args.device_id not in range(2**64):
        raise SwitchUsageError(f"--device-id {args.device_id}: must be within 0..2^64-1 (P4Runtime's uint64)")
    if args.drop_port is not None and targs.drop_port is not None:
        raise SwitchUsageError("--drop-port given before and after --: give it once")
    args.drop_port = next((n for n in (args.drop_port, targs.drop_port) if n is not None), LAST_PORT)
    args.cpu_port = targs.cpu_port
    for name, num in (("--drop-port", args.drop_port), ("--cpu-port", args.cpu_port)):
        if num is not None and num not in range(LAST_PORT + 1):
            raise SwitchUsageError(f"{name} {num}: not within 0..{LAST_PORT} (v1model's ports are 9 bits)")
    if args.cpu_port == 0:  # BMv2 exits on it: 0 is its "no CPU port"
        raise SwitchUsageError(f"--cpu-port 0: BMv2 reads 0 as no CPU port; give 1..{LAST_PORT}")
    if args.cpu_port == args.drop_port:
        raise SwitchUsageError(f"--cpu-port {args.cpu_port} is the drop port (give --drop-port another)")
    if args.json and args.no_p4:
        raise SwitchUsageError("give a JSON program or --no-p4, not both")
    if not args.json and not args.no_p4:
        raise SwitchUsageError("missing JSON program (or --no-p4)")
    ports = {}
    for spec in args.interface:
        num, iface = parse_port(spec)
        if num in ports:
            raise SwitchUsageError(f"port {num} given twice")
        if iface in ports.values():  # two ports on one link: each frame received twice
            raise SwitchUsageError(f"interface {iface} given twice")
        if num == args.drop_port:
            raise SwitchUsageError(f"port {num} is the drop port")
        if num == args.cpu_port:  # as BMv2: the CPU port is the controller's (packet-in/out), no interface
            raise SwitchUsageError(f"port {num} is the CPU port")
        ports[num] = iface
    args.ports = ports
    if args.rx_usecs < 0:
        raise SwitchUsageError(f"--rx-usecs {args.rx_usecs}: must be 0 (off) or more")
    if args.rx_frames is not None and not args.rx_usecs:
        raise SwitchUsageError("--rx-frames needs --rx-usecs (receive coalescing is off without it)")
    args.rx_frames = RX_FRAMES if args.rx_frames is None else args.rx_frames
    if args.rx_frames < 1:
        raise SwitchUsageError(f"--rx-frames {args.rx_frames}: must be 1 or more")
    if args.pipeline is None:
        from .engine import default_pipeline  # (numpy and the compiler: imported by the start anyway)

        try:
            default_pipeline()
        except ValueError as exc:
            raise SwitchUsageError(str(exc)) from None
    # An explicit 0 counts as given (tools/soak.py passes --dup-prob 0.0 --reorder-prob 0.0 --seed S)
    if args.seed is not None and all(getattr(args, name) is None for name in FAULTS):
        raise SwitchUsageError("--seed seeds the fault injection: give it with --drop-prob, --dup-prob or "
                               "--reorder-prob")
    args.seed = args.seed or 0
    for name in FAULTS:
        v = getattr(args, name) or 0.0
        if not 0.0 <= v <= 1.0:
            raise SwitchUsageError(f"--{name.replace('_', '-')} must be within [0, 1]")
        setattr(args, name, v)
    return args


def thrift_host(grpc_addr: str) -> str:
    """Thrift listens where gRPC does (loopback by default), not on every interface."""
    host, sep, _ = grpc_addr.rpartition(":")
    if not sep or host.startswith("unix"):
        return "127.0.0.1"
    return host.strip("[]") or "0.0.0.0"


def _same_file(stream, path: str) -> bool:
    try:
        a, b = os.fstat(stream.fileno()), os.stat(path)
    except (OSError, ValueError, AttributeError):
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def setup_logging(args) -> None:
    level = LEVELS[args.log_level]
    root = logging.getLogger("softswitch")
    root.propagate = False
    fmt = logging.Formatter("%(asctime)s softswitch %(levelname)s: %(message)s")
    to_file = bool(args.log_file and level is not None)
    if to_file:
        h = logging.FileHandler(args.log_file)
        h.setFormatter(fmt)
        root.addHandler(h)
        root.setLevel(level)
    else:
        root.setLevel(level if args.log_console and level is not None else logging.WARNING)
    # errors always reach stderr, whatever the log file says (unless stderr is that file: once is enough)
    if not (to_file and _same_file(sys.stderr, args.log_file)):
        err = logging.StreamHandler(sys.stderr)
        err.setLevel(logging.WARNING if not args.log_console else (level or logging.WARNING))
        err.setFormatter(logging.Formatter("softswitch: %(message)s"))
        root.addHandler(err)
    if root.level > logging.WARNING:
        root.setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_args(argv)
    except SwitchUsageError as exc:
        print(f"mindp-softswitch: {exc}", file=sys.stderr)
        return 2
    try:
        setup_logging(args)
    except OSError as exc:
        print(f"mindp-softswitch: cannot write the log file {args.log_file}: {exc.strerror}", file=sys.stderr)
        return 1
    log = logging.getLogger("softswitch")

    # imported here so that --help and usage errors are instant
    from . import compiler
    from .compiler_errors import ProgramError
    from .dataplane import DataPlane, RxCoalesce
    from .engine import Engine
    from .faults import FaultConfig, LinkFaults
    from .p4runtime_server import Server, SwitchService, server_credentials
    from .ports import Port, PortError
    from .thrift_server import ThriftServer

    engine = Engine(pipeline=args.pipeline, settle_gc=True)
    if args.json and not os.path.isfile(args.json):
        print(f"mindp-softswitch: cannot read {args.json}: no such file", file=sys.stderr)
        return 1
    if args.pcap:
        try:
            os.makedirs(args.pcap, exist_ok=True)
        except OSError as exc:
            print(f"mindp-softswitch: --pcap {args.pcap}: cannot create the directory: {exc.strerror}",
                  file=sys.stderr)
            return 1
    ports = {}
    for num, iface in sorted(args.ports.items()):
        try:
            ports[num] = Port(num, iface, args.pcap)
        except PortError as exc:
            log.error("%s; port not added (frames to it are counted as dropped)", exc)
    faults = LinkFaults(FaultConfig(args.drop_prob, args.dup_prob, args.reorder_prob, args.seed))
    service = SwitchService(engine, args.device_id, args.drop_port, args.cpu_port)
    dp = DataPlane(engine, ports, faults, args.cpu_port, service.packet_in, RxCoalesce(args.rx_usecs, args.rx_frames))
    service.inject = dp.inject
    try:
        server = Server(service, args.grpc_server_addr, server_credentials(*args.tls) if args.tls else None)
    except (OSError, RuntimeError) as exc:
        print(f"mindp-softswitch: gRPC: {exc}", file=sys.stderr)
        return 1
    thrift_port = args.thrift_port or DEFAULT_THRIFT
    try:
        thrift = ThriftServer(service, thrift_host(args.grpc_server_addr), thrift_port)
    except OSError as exc:
        if args.thrift_port is not None:
            print(f"mindp-softswitch: {exc}", file=sys.stderr)
            return 1
        thrift = None  # only the default port is busy (say, a BMv2 next to us): run without Thrift
        log.warning("%s; running without a Thrift server (give --thrift-port)", exc)
    server.start()  # listening before the JSON is compiled: ready fast
    if thrift:
        thrift.start()
    if args.json:
        try:
            with open(args.json, "rb") as fh:
                json_bytes = fh.read()
            program = compiler.load(json_bytes, args.drop_port)
        except (OSError, ProgramError) as exc:
            server.stop()
            if thrift:
                thrift.stop()
            print(f"mindp-softswitch: {args.json}: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
            return 1
        service.load_startup_program(program, json_bytes)
    signal.signal(signal.SIGTERM, lambda *_: dp.stop())
    signal.signal(signal.SIGINT, lambda *_: dp.stop())
    log.info("ready: gRPC %s, Thrift %s, device %d, ports %s%s", args.grpc_server_addr,
             thrift_port if thrift else "off", args.device_id, {n: p.iface for n, p in ports.items()},
             "" if args.json else ", waiting for a pipeline")
    try:
        dp.run()
    finally:
        server.stop()
        if thrift:
            thrift.stop()
        s = engine.stats
        # The program consumes frames too (mindp absorbs gradients into sums): not all of these are drops.
        log.info("stopped: rx %d tx %d not forwarded %d errors %d faults %s%s", s.rx, s.tx, s.dropped, s.errors,
                 faults.stats, "".join(f", pcap errors on port {n}: {p.pcap_errors}"
                                       for n, p in ports.items() if p.pcap_errors)
                 + "".join(f", frames too long for a slot on port {n}: {p.rx_truncated}"
                           for n, p in ports.items() if p.rx_truncated)
                 + "".join(f", super-frames cut on port {n}: {p.rx_cut}" for n, p in ports.items() if p.rx_cut)
                 + "".join(f", frames dropped by the kernel on port {n} (receive ring full): {d}"
                           for n, d in ((n, p.ring.dropped()) for n, p in ports.items()) if d))
        dp.close()
    return 0
