"""mindp-ctl's command line: its parser, and the argument types, each of which parses one option's text
or says, in one line, what it expects."""

from __future__ import annotations

import argparse

from .p4runtime import DEFAULT_GRPC_ADDR, MAX_SECONDS, election_text

U64_MAX = (1 << 64) - 1  # P4Runtime's device id and each half of an election id are uint64


def election_id(text: str) -> tuple[int, int]:
    try:
        parts = [int(x, 0) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad election id {text!r}: expected HIGH,LOW or LOW") from None
    if len(parts) == 1:
        parts = [0, parts[0]]
    if len(parts) != 2 or min(parts) < 0 or parts == [0, 0]:
        raise argparse.ArgumentTypeError(f"bad election id {text!r}: expected HIGH,LOW (not 0,0)")
    if max(parts) > U64_MAX:
        raise argparse.ArgumentTypeError(f"bad election id {text!r}: HIGH and LOW must be 0..{U64_MAX}")
    return parts[0], parts[1]


def device_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, not {text!r}") from None
    if not 0 <= value <= U64_MAX:
        raise argparse.ArgumentTypeError(f"must be 0..{U64_MAX}, not {text}")
    return value


def host_port(text: str) -> tuple[str, int]:
    """'HOST:PORT' (HOST default 127.0.0.1) -> (host, port)."""
    host, _, port = text.rpartition(":")
    try:
        value = int(port)
    except ValueError:
        value = 0
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"bad address {text!r}: expected HOST:PORT, PORT 1..65535")
    return host or "127.0.0.1", value


def worker_map(text: str) -> dict[int, str]:
    """'0=w1_0,1=w1_1' or 'w1_0,w1_1' (ids 0, 1, ...); every id and host once."""
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise argparse.ArgumentTypeError("no workers given")
    if "" in items:
        raise argparse.ArgumentTypeError(f"empty worker in {text!r}: expected ID=HOST,...")
    explicit = ["=" in item for item in items]
    if any(explicit) and not all(explicit):
        raise argparse.ArgumentTypeError(f"give every worker as ID=HOST or none ({text!r} mixes both)")
    out: dict[int, str] = {}
    for i, item in enumerate(items):
        wid, _, host = item.partition("=") if explicit[i] else (str(i), "=", item)
        try:
            w = int(wid)
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad worker {item!r}: expected ID=HOST with an integer ID") from None
        if w < 0 or not host:
            raise argparse.ArgumentTypeError(f"bad worker {item!r}: expected ID=HOST, ID >= 0")
        if w in out:
            raise argparse.ArgumentTypeError(f"worker id {w} given twice ({out[w]} and {host})")
        if host in out.values():
            raise argparse.ArgumentTypeError(f"host {host} given for two worker ids")
        out[w] = host
    return out


def _positive(text: str, kind: type, expected: str, must: str, most: float = float("inf")) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, not {text!r}") from None
    if not 0 < value <= most:  # NaN too
        raise argparse.ArgumentTypeError(f"must be {must}, not {text}")
    return value


def positive_float(text: str) -> float:
    return _positive(text, float, "a number of seconds", f"a positive number of seconds, at most {MAX_SECONDS:g}",
                     MAX_SECONDS)


def positive_int(text: str) -> int:
    return _positive(text, int, "a positive integer", "a positive integer")


class Parser(argparse.ArgumentParser):
    """Usage errors as one line (the full usage is one --help away)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


DEFAULT_ELECTION_ID = (0, 1)  # a controller's when it names none
DEFAULT_THRIFT_PORT = 9090  # BMv2's (and the embedded switch's) when the topology names none


def add_global_options(p: argparse.ArgumentParser, defaults: bool) -> None:
    """The options of every command. On the main parser with their defaults; on each
    subcommand without (SUPPRESS), so `mindp-ctl stats --json` means `mindp-ctl --json stats`."""
    def d(value):
        return value if defaults else argparse.SUPPRESS

    p.add_argument("--grpc-addr", default=d(None),
                   help=f"switch P4Runtime address (default: the topology's switch, else {DEFAULT_GRPC_ADDR})")
    p.add_argument("--switch", "-s", metavar="NAME", default=d(None),
                   help="one switch of a tree topology (push, jobs create/delete and topo work on all of them)")
    p.add_argument("--device-id", type=device_id, default=d(None),
                   help="P4Runtime device id (default: the topology's, else 0)")
    p.add_argument("--election-id", type=election_id, default=d(None), metavar="HIGH,LOW",
                   help=f"election id of this controller (default {election_text(DEFAULT_ELECTION_ID)}; the shell "
                   "picks a read-only session when another controller is primary)")
    p.add_argument("--topology", "-t", metavar="FILE", default=d(None),
                   help="topology JSON (mindp.topology): hosts' MAC, IP and port")
    p.add_argument("--p4info", metavar="FILE", default=d(None),
                   help="P4Info text (default p4src/compiled/k<K>/mindp.p4info.txtpb, K from MINDP_K)")
    p.add_argument("--bmv2-json", metavar="FILE", default=d(None), help="BMv2 JSON (default p4src/compiled/k<K>/mindp.json)")
    p.add_argument("--cacert", metavar="PEM", default=d(None), help="TLS: CA certificate (enables TLS)")
    p.add_argument("--cert", metavar="PEM", default=d(None), help="TLS: client certificate (enables TLS)")
    p.add_argument("--key", metavar="PEM", default=d(None), help="TLS: client private key (enables TLS)")
    p.add_argument("--timeout", type=positive_float, default=d(None),
                   help="seconds to wait for the switch (default $MINDP_CTL_TIMEOUT, else 3)")
    p.add_argument("--json", action="store_true", default=d(False), help="machine-readable output")
    p.add_argument("-v", "--verbose", action="store_true", default=d(False), help="log what the controller does")


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="mindp-ctl", description="mindp P4Runtime controller: pipeline, forwarding, "
                                "jobs, workers, slots, statistics. Global options may also follow the command.")
    add_global_options(p, defaults=True)
    common = argparse.ArgumentParser(add_help=False)
    add_global_options(common, defaults=False)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND", parser_class=Parser)

    def command(parent, name: str, **kw) -> argparse.ArgumentParser:
        return parent.add_parser(name, parents=[common], **kw)

    s = command(sub, "push", help="install the pipeline (unless already running) and, with --topology, forwarding")
    s.add_argument("--force", action="store_true", help="push even if the switch runs our program (clears all entries)")

    jobs = command(sub, "jobs", help="list, show, create, delete jobs").add_subparsers(
        dest="sub", required=True, metavar="ACTION", parser_class=Parser)
    command(jobs, "list", help="jobs on the switch")
    s = command(jobs, "show", help="one job in detail")
    s.add_argument("job_id", type=int)
    s = command(jobs, "create", help="create a job from a JobSpec file, from flags, or from the topology's jobs",
                description="Create a job. Hosts are names in --topology. Either --file JOB.json "
                "(a JobSpec: {\"job_id\", \"workers\": {\"0\": host, ...}, \"optimizer\", \"slots\", \"chunks\"}), or "
                "--job-id with --workers/--optimizer/--slots, or --job-id alone for that job of the topology.")
    s.add_argument("--file", "-f", metavar="JOB.json", help="JobSpec JSON")
    s.add_argument("--job-id", type=int)
    s.add_argument("--workers", type=worker_map, metavar="ID=HOST,...", help="e.g. 0=w1_0,1=w1_1")
    s.add_argument("--optimizer", metavar="HOST[,HOST...]", help="the optimizer node, or its shards in chunk order")
    s.add_argument("--slots", type=positive_int, help="slot count (default 64)")
    s.add_argument("--chunks", type=int, help="the job's chunks per step: the switch drops gradients beyond "
                   "(default: the topology's or file's, else not known)")
    s = command(jobs, "delete", help="remove a job's entries and group; its slots are free at once")
    s.add_argument("job_id", type=int)

    workers = command(sub, "workers", help="add, remove or replace a worker of a job (between steps)"
                      ).add_subparsers(dest="sub", required=True, metavar="ACTION", parser_class=Parser)
    for name, what in (("add", "add a worker"), ("replace", "move a worker id to another host or port")):
        s = command(workers, name, help=what, description=f"{what.capitalize()}: HOST from --topology, "
                    "or --port/--mac/--ip.")
        s.add_argument("job_id", type=int)
        s.add_argument("worker", type=int)
        s.add_argument("host", nargs="?", help="host name in the topology")
        s.add_argument("--port", type=int)
        s.add_argument("--mac")
        s.add_argument("--ip")
    s = command(workers, "remove", help="remove a worker")
    s.add_argument("job_id", type=int)
    s.add_argument("worker", type=int)

    command(sub, "slots", help="the slot pool map")
    s = command(sub, "stats", help="per-job counters; --watch for rates")
    s.add_argument("--job", type=int, action="append", help="only this job (repeatable)")
    s.add_argument("--watch", type=positive_float, nargs="?", const=1.0, metavar="SECONDS",
                   help="print rates every SECONDS (default 1) until Ctrl-C")
    s.add_argument("--count", type=positive_int, help="with --watch: stop after this many updates")
    s.add_argument("--run", metavar="DIR", help="also the step-digest counters of this make run (its workers' logs)")
    s = command(sub, "tables", help="raw dump of table entries and multicast groups")
    s.add_argument("--table", help="one table (full or short name)")
    s = command(sub, "cells", help="a job's aggregation cells, decoded (over the switch's Thrift port)",
                description="Decoded aggregation cells of a job: the use each holds (epoch, step, chunk), the "
                "workers counted, the count, the non-finite bit and the partial sums as values. Read over the "
                "switch's Thrift runtime port (BMv2's --thrift-port, or the embedded switch's), as simple_switch_CLI does.")
    s.add_argument("job_id", type=int)
    s.add_argument("slot", type=int, nargs="?", help="one slot of the job (both versions); default: all its cells")
    s.add_argument("--thrift-addr", type=host_port, metavar="HOST:PORT",
                   help="the switch's Thrift runtime address (default: the topology's thrift_port of the switch, "
                   f"else {DEFAULT_THRIFT_PORT}, on its gRPC host)")
    s.add_argument("--all", action="store_true", help="also cells that hold no use of the job's current epoch")
    s.add_argument("--elements", type=positive_int, help="sums shown per cell in text (default 4; --json has all)")
    command(sub, "topo", help="the tree: switches, ports, links, each switch's jobs and counters, per level",
            description="The topology's switches as a tree (each under its parent), their host ports, the "
            "jobs each switch holds with its role (root: sums to the optimizer node or shards; leaf: partial "
            "sums up its uplink as child N) and members, each switch's counters for the job, and the counters "
            "summed per level. Needs --topology; reads only (no arbitration).")
    command(sub, "shell", help="p4runtime-shell on the switch, with our P4Info (read-only while another "
            "controller is primary)")
    return p


# --- commands ---------------------------------------------------------------------
