"""mindp-ctl refuses bad option combinations and values in one line before it connects: the
switch address here has no server, so a check made only after connecting would say so instead."""
from __future__ import annotations

import json

import pytest

from controller import cli
from mindp import progress, targets
from mindp.topology import leafspine

from .ctl import ctl_command, in_process

U64 = 2**64


@pytest.fixture
def paths(tmp_path, topo):
    star, tree = tmp_path / "star.json", tmp_path / "tree.json"
    topo.dump(star)
    leafspine(2, 2, 2, chunks=10).dump(tree)
    return {"STAR": str(star), "TREE": str(tree)}


def refused(argv: list[str], match: str, code: int) -> None:
    proc = in_process(argv)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code and len(lines) == 1 and "Traceback" not in proc.stderr, (argv, proc.stderr)
    assert match in lines[0], lines[0]


NOT_BOTH = "give --switch or --grpc-addr/--device-id, not both"
READS = "--election-id does not apply"


@pytest.mark.parametrize("argv, match, code", [
    (["-t", "TREE", "--switch", "leaf1", "--grpc-addr", "ADDR", "jobs", "delete", "1"], NOT_BOTH, 1),
    (["-t", "TREE", "--switch", "leaf1", "--device-id", "2", "push"], NOT_BOTH, 1),
    (["-t", "TREE", "shell", "--switch", "leaf1", "--grpc-addr", "ADDR"], NOT_BOTH, 1),
    (["--grpc-addr", "ADDR", "--device-id", str(U64), "slots"], f"must be 0..{U64 - 1}, not {U64}", 2),
    (["--grpc-addr", "ADDR", "--device-id", "-1", "slots"], f"must be 0..{U64 - 1}", 2),
    (["--grpc-addr", "ADDR", "--election-id", f"1,{U64}", "push"], f"HIGH and LOW must be 0..{U64 - 1}", 2),
    (["--grpc-addr", "ADDR", "--election-id", f"{U64},1", "push"], f"HIGH and LOW must be 0..{U64 - 1}", 2),
    (["--grpc-addr", "ADDR", "topo"], "topo needs --topology", 1),
    (["--grpc-addr", "ADDR", "jobs", "create", "--job-id", "1"], "jobs create needs --topology", 1),
    (["--grpc-addr", "ADDR", "-t", "STAR", "jobs", "create", "--job-id", "9"], "give --workers and --optimizer", 1),
    (["--grpc-addr", "ADDR", "-t", "STAR", "workers", "add", "1", "0", "w1_0", "--port", "3"], "not both", 1),
    (["--grpc-addr", "ADDR", "-t", "STAR", "workers", "replace", "1", "0", "w1_0", "--port", "0"], "not both", 1),
    (["--grpc-addr", "ADDR", "tables", "--table", "nope"], "unknown table 'nope'", 1),
    (["--grpc-addr", "ADDR", "cells", "1", "--thrift-addr", "nonsense"], "expected HOST:PORT, PORT 1..65535", 2),
    (["--grpc-addr", "ADDR", "cells", "1", "--thrift-addr", "h:65536"], "expected HOST:PORT, PORT 1..65535", 2),
    (["--grpc-addr", "ADDR", "--timeout", "1e10", "slots"], "at most 86400, not 1e10", 2),
    (["--grpc-addr", "ADDR", "stats", "--watch", "1e300"], "at most 86400, not 1e300", 2),
    (["--grpc-addr", "ADDR", "--election-id", "0,2", "stats"], f"{READS}: stats only reads", 1),
    (["--grpc-addr", "ADDR", "--election-id", "0,2", "jobs", "list"], f"{READS}: jobs list only reads", 1),
    (["-t", "TREE", "--election-id", "0,2", "topo"], f"{READS}: topo only reads", 1),
    (["--grpc-addr", "ADDR", "cells", "1", "--json", "--elements", "2"], "--json gives every sum", 1),
    (["--grpc-addr", "ADDR", "--json", "shell"], "--json does not apply to shell", 1),
    (["--grpc-addr", "ADDR", "shell", "--bmv2-json", "x.json"], "--bmv2-json does not apply to shell", 1),
])
def test_refused_before_connecting(paths, argv, match, code):
    addr = f"127.0.0.1:{targets.free_port()}"
    refused(["--timeout", "0.5", *(paths.get(a, addr if a == "ADDR" else a) for a in argv)], match, code)


@pytest.mark.parametrize("command", ["push", "shell"])
@pytest.mark.parametrize("given", ["--cert", "--key"])
def test_half_a_client_key_pair_is_refused(tmp_path, command, given):
    """gRPC aborts the process (SIGABRT) on a certificate without its key, or the reverse."""
    pem = tmp_path / "x.pem"
    pem.write_text("not checked: refused before it is read\n")
    proc = progress.run([*ctl_command(), "--grpc-addr", f"127.0.0.1:{targets.free_port()}", "--timeout", "0.5",
                         given, str(pem), command], capture_output=True, text=True)
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert proc.stderr == "mindp-ctl: error: --cert and --key go together (client TLS needs both)\n"


def thrift_addr(*argv: str) -> tuple[str, int]:
    args = cli.parser().parse_args([*argv, *(() if "cells" in argv else ("cells", "1"))])
    cli.check_usage(args, cli.load_topology(args))
    return args.thrift_addr


def test_cells_reads_the_thrift_port_of_the_switch_it_reads(tmp_path):
    tree = tmp_path / "tree.json"
    leafspine(2, 2, 2, chunks=10, host="10.0.0.7", thrift_port=9200).dump(tree)
    assert thrift_addr("-t", str(tree), "--switch", "leaf1") == ("10.0.0.7", 9201)
    assert thrift_addr("-t", str(tree), "--switch", "spine") == ("10.0.0.7", 9200)
    given = thrift_addr("-t", str(tree), "--switch", "leaf2", "cells", "1", "--thrift-addr", ":9300")
    assert given == ("127.0.0.1", 9300)
    assert thrift_addr() == ("127.0.0.1", 9090)  # no topology: the default switch, BMv2's default port
    assert thrift_addr("--grpc-addr", "10.1.2.3:9559") == ("10.1.2.3", 9090)
    single = tmp_path / "single.json"
    single.write_text(json.dumps({"switch": {"name": "s1", "grpc_addr": "10.0.0.8:9559", "device_id": 0,
                                             "thrift_port": 9401}, "hosts": {}, "jobs": []}))
    assert thrift_addr("-t", str(single)) == ("10.0.0.8", 9401)
    assert thrift_addr("-t", str(single), "--grpc-addr", "10.0.0.9:9559") == ("10.0.0.9", 9090)  # not that switch
