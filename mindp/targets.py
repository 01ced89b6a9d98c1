"""Start BMv2 `simple_switch_grpc` or the embedded switch with the same arguments.

Both targets take the simple_switch_grpc command line, so tests, Mininet and
benches start either the same way, wait until its gRPC server answers and stop
it by PID.
"""
from __future__ import annotations

import itertools
import os
import pathlib
import random
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field

from . import netutil, progress, protocol, vnet

#: embedded-python: the embedded switch on its Python pipeline only (the reference the compiled one equals)
TARGETS = ("auto", "bmv2", "embedded", "embedded-python")
P4TOOLS_BIN = pathlib.Path("/opt/p4tools/bin")


def hosts_offload(target: str) -> bool:
    """Whether the hosts of a run on `target` keep UDP segmentation offload on their links, so
    their super-frames reach the switch whole (mindp/vnet.py): the embedded switch cuts them
    itself; BMv2 cannot, so there the hosts' kernels cut them. MINDP_NO_USO=1 turns it off."""
    return target.startswith("embedded") and vnet.kernel_supports() and os.environ.get("MINDP_NO_USO") != "1"


class TargetError(RuntimeError):
    """The switch cannot be started or did not come up; the message says why."""


def find_tool(name: str) -> str | None:
    """A p4lang tool on PATH or under /opt/p4tools/bin."""
    found = shutil.which(name)
    if found:
        return found
    local = P4TOOLS_BIN / name
    return str(local) if local.exists() and os.access(local, os.X_OK) else None


def find_bmv2() -> str | None:
    return find_tool("simple_switch_grpc")


def resolve(target: str, k: int | None = None) -> str:
    """auto -> bmv2 when installed (and `k`, if given, fits it), else embedded; bmv2 must be
    installed and run `k`."""
    if target not in TARGETS:
        raise TargetError(f"unknown target {target!r}: choose one of {', '.join(TARGETS)}")
    fits = k is None or protocol.bmv2_fits(k)
    if target == "auto":
        return "bmv2" if find_bmv2() and fits else "embedded"
    if target == "bmv2" and not find_bmv2():
        raise TargetError("TARGET=bmv2 but simple_switch_grpc is not installed (PATH or /opt/p4tools/bin)")
    if target == "bmv2" and not fits:
        raise TargetError(f"BMv2 runs K up to {protocol.BMV2_MAX_K}, not {k}: it lets a packet grow by "
                          f"{protocol.BMV2_HEADROOM} bytes and a GRAD becomes a SUM 6 bytes an element longer "
                          "(TARGET=embedded runs any K)")
    return target


@dataclass
class SwitchConfig:
    ports: dict[int, str]  # switch port -> interface name
    grpc_addr: str = "127.0.0.1:9559"
    device_id: int = 0
    json_path: str | None = None  # None: start without a program (--no-p4)
    log_file: str | None = None  # the switch's own log (also its stdout/stderr)
    log_level: str | None = None  # --log-level (BMv2's -L): debug/trace log every packet; None: off on BMv2
    pcap_dir: str | None = None
    thrift_port: int | None = None  # BMv2 runtime CLI port (queue depth); None: BMv2's default 9090
    cpu_port: int | None = None
    fault_args: list[str] = field(default_factory=list)  # embedded only: --drop-prob P ...
    grpc_args: list[str] = field(default_factory=list)  # after `--`, e.g. BMv2's --grpc-server-ssl ...

    def args(self) -> list[str]:
        args = ["--device-id", str(self.device_id)]
        if self.log_file:
            args += ["--log-file", self.log_file]
        if self.log_level:
            args += ["--log-level", self.log_level]
        if self.pcap_dir:
            args += ["--pcap", self.pcap_dir]
        if self.thrift_port is not None:
            args += ["--thrift-port", str(self.thrift_port)]
        for port, iface in sorted(self.ports.items()):
            args += ["-i", f"{port}@{iface}"]
        args += [self.json_path] if self.json_path else ["--no-p4"]
        args += ["--", "--grpc-server-addr", self.grpc_addr]
        if self.cpu_port is not None:
            args += ["--cpu-port", str(self.cpu_port)]
        return args + self.grpc_args


def command(target: str, cfg: SwitchConfig, k: int | None = None) -> list[str]:
    """The switch's command line for a program of `k` elements a frame (default: this process's K,
    which its controller pushes)."""
    target = resolve(target, protocol.K if k is None else k)
    if target == "bmv2":
        return [find_bmv2(), *([] if cfg.log_level else ["--log-level", "off"]), *cfg.args()]
    pipeline = ["--pipeline", "python"] if target == "embedded-python" else []
    return [sys.executable, "-m", "softswitch", *pipeline, *cfg.fault_args, *cfg.args()]


def grpc_port_open(addr: str) -> bool:
    host, _, port = addr.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=0.2):
            return True
    except OSError:
        return False


#: "LO-HI": free_port() picks from this range only.
PORTS_ENV = "MINDP_PORTS"
#: free_port() hands out ports from blocks of this many (aligned to it) that the process claims
#: for its life (netutil.claim), so no two live processes of a network namespace (two xdist
#: workers, two test runs, a container on the host's network) hand out the same port between its
#: check and a switch's bind.
PORT_BLOCK = 64
_blocks: list[int] = []  # the first port of each block this process claimed, in claim order
_handed_out: set[int] = set()
# A forked child claims blocks of its own (its parent's claims, inherited, keep it off theirs), or
# both would hand out the same next port of a block they share.
os.register_at_fork(after_in_child=_blocks.clear)


def _ephemeral_low() -> int:
    try:
        return int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_range() -> tuple[int, int]:
    """Where free_port() picks: $MINDP_PORTS, else from 10000 to the kernel's ephemeral range."""
    spec = os.environ.get(PORTS_ENV)
    if spec:
        lo, _, hi = spec.partition("-")
        return int(lo), int(hi)
    return 10000, _ephemeral_low()


def free_port(count: int = 1) -> int:
    """The first of `count` consecutive TCP ports on 127.0.0.1 (a tree's switches take the next
    ones; at most PORT_BLOCK), each free now, in a block this process claimed and not handed out
    before by it, below the kernel's ephemeral range: a port from bind(0) is in that range, where
    any outgoing connection (a gRPC client's, say) may take it as its source port before the
    switch binds it (seen: an embedded switch's Thrift port taken so in a full test run)."""
    if not 1 <= count <= PORT_BLOCK:
        raise TargetError(f"free_port: {count} ports in a row; 1 to {PORT_BLOCK}")
    lo, hi = port_range()
    for block in itertools.chain(list(_blocks), _new_blocks(lo, hi)):
        for first in range(max(block, lo), min(block + PORT_BLOCK, hi) - count + 1):
            ports = range(first, first + count)
            if not _handed_out.intersection(ports) and all(port_free(p) for p in ports):
                _handed_out.update(ports)
                return first
    raise TargetError(f"no {count} free consecutive TCP ports on 127.0.0.1 in {lo}-{hi}")


def _new_blocks(lo: int, hi: int):
    """The blocks touching lo..hi that no live process holds, from a random one on, each claimed
    as it is reached (the caller stops at the first with room)."""
    firsts = range(lo - lo % PORT_BLOCK, hi, PORT_BLOCK)
    start = random.randrange(len(firsts)) if firsts else 0
    for first in [*firsts[start:], *firsts[:start]]:
        if first not in _blocks and _claim_block(first):
            _blocks.append(first)
            yield first


def _claim_block(first: int) -> bool:
    return netutil.claim(f"ports-{first}")


def port_free(port: int) -> bool:
    """Whether a TCP socket may bind `port` on 127.0.0.1 now."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class SwitchProcess:
    """One running switch. Use as a context manager or call start()/stop()."""

    def __init__(self, target: str, cfg: SwitchConfig, *, prefix: list[str] | None = None, k: int | None = None):
        """k: the elements a frame of the program it will run (default: this process's K)."""
        k = protocol.K if k is None else k
        self.target = resolve(target, k)
        self.cfg = cfg
        self.cmd = [*(prefix or []), *command(self.target, cfg, k)]
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, stall: float = 30.0) -> SwitchProcess:
        """Start the switch and wait until its gRPC server answers; TargetError if it exits first, or
        if it neither used CPU nor wrote its log for `stall` s (a busy machine only makes it slower)."""
        if grpc_port_open(self.cfg.grpc_addr):
            raise TargetError(f"gRPC address {self.cfg.grpc_addr} is already in use")
        log = open(self.cfg.log_file, "ab") if self.cfg.log_file else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            raise TargetError(f"cannot start {self.cmd[0]}: {exc}") from None
        finally:
            if log is not subprocess.DEVNULL:
                log.close()
        def up() -> bool:
            if self.proc.poll() is not None:
                where = f"; see {self.cfg.log_file}" if self.cfg.log_file else ""
                raise TargetError(f"{self.target} switch exited with code {self.proc.returncode} at start{where}")
            return grpc_port_open(self.cfg.grpc_addr)

        measure = progress.activity(self.proc.pid)
        if self.cfg.log_file:
            measure = progress.both(measure, progress.file_sizes(self.cfg.log_file))
        try:
            progress.wait(up, measure, stall=stall, poll=0.05, what=f"{self.target} switch start")
        except progress.Stalled as exc:
            self.stop()
            raise TargetError(f"{self.target} switch did not open gRPC {self.cfg.grpc_addr}: {exc}") from None
        except TargetError:
            self.stop()
            raise
        return self

    def set_queue_depth(self, depth: int) -> None:
        """BMv2 drops silently past 64 queued packets a port: raise the bound. No-op on the embedded switch."""
        if self.target != "bmv2":
            return
        cli = find_tool("simple_switch_CLI")
        if not cli:
            raise TargetError("simple_switch_CLI not found: cannot set BMv2 queue depth")
        port = self.cfg.thrift_port or 9090
        # BMv2 may open its Thrift port a moment after gRPC (start() waits for gRPC only).
        try:
            progress.wait(lambda: grpc_port_open(f"127.0.0.1:{port}"), progress.activity(self.proc.pid), stall=30,
                          poll=0.02, what="BMv2 opening its Thrift port")
        except progress.Stalled as exc:
            raise TargetError(f"set_queue_depth: {exc}") from None
        # The CLI is a Python script that needs `thrift`: run it with our interpreter (the venv sees
        # Debian's python3-thrift), not whichever python3 comes first on PATH.
        try:
            proc = progress.run([sys.executable, cli, "--thrift-port", str(port)], input=f"set_queue_depth {depth}\n",
                                capture_output=True, text=True, stall=30)
        except progress.Stalled as exc:
            raise TargetError(f"set_queue_depth: {exc}") from None
        if proc.returncode != 0:
            raise TargetError(cli_failure(proc.stderr or proc.stdout))

    def stop(self, timeout: float = 5.0) -> None:
        if not self.proc or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            os.killpg(self.proc.pid, signal.SIGCONT)  # a stopped (hung) switch must get to handle it
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout)
        except ProcessLookupError:
            pass

    def __enter__(self) -> SwitchProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def cli_failure(output: str) -> str:
    """One line for a simple_switch_CLI that failed: its last line (a traceback's is the exception),
    and where BMv2's Python modules cannot import thrift, what installs it."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    last = lines[-1] if lines else "no output"
    hint = " (simple_switch_CLI needs Python's thrift module: apt install python3-thrift)" if "thrift" in last and \
        ("ModuleNotFoundError" in last or "ImportError" in last) else ""
    return f"set_queue_depth failed: {last}{hint}"
