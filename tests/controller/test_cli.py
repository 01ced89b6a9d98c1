"""mindp-ctl end to end against a real switch: a session, and bad input as one line and a non-zero exit."""
from __future__ import annotations

import json
import os

import pytest

from controller import p4info_names as n
from controller.controller import Controller
from controller.p4runtime import TIMEOUT_ENV, SwitchConnection
from mindp import progress, targets
from p4src import artifacts

from .ctl import Ctl, ctl_command


@pytest.fixture
def cli(switch, topo, tmp_path):
    path = tmp_path / "topo.json"
    topo.dump(path)
    return Ctl(switch.addr, path)


def test_session_end_to_end(cli, tmp_path, switch):
    cli.fails("jobs", "list", match="has no pipeline (run `mindp-ctl push`)")
    assert "pushed the pipeline; forwarding for 8 hosts" in cli.run("push").stdout
    assert "already installed" in cli.run("push").stdout
    job_file = tmp_path / "job1.json"
    job_file.write_text(json.dumps({"job_id": 1, "workers": {"0": "w1_0", "1": "w1_1", "2": "w1_2"},
                                    "optimizer": "opt1", "slots": 32}))
    j1 = cli.json("jobs", "create", "--file", str(job_file))
    assert (j1["slot_base"], j1["slots"], j1["mcast_group"]) == (0, 32, 257)
    assert j1["workers"]["2"] == {"host": "w1_2", "port": 3, "mac": "02:00:00:00:00:03", "ip": "10.0.0.3", "rid": 35,
                                "role": "worker"}
    out = cli.run("jobs", "create", "--job-id", "2", "--workers", "0=w2_0,1=w2_1", "--optimizer", "opt2",
                  "--slots", "100").stdout
    assert "created job 2: slots 32..131 (100)" in out
    listed = cli.json("jobs", "list")
    assert [j["job_id"] for j in listed["jobs"]] == [1, 2] and listed["problems"] == []
    assert listed["jobs"][0]["epoch"] == j1["epoch"]
    text = cli.run("jobs", "list").stdout
    assert "1    3        0..31    32" in text
    slots = cli.json("slots")
    assert slots["free"] == 1024 - 132
    assert slots["ranges"] == [{"base": 0, "count": 32, "job": 1}, {"base": 32, "count": 100, "job": 2},
                               {"base": 132, "count": 892, "job": None}]
    assert "132..1023  892    free" in cli.run("slots").stdout
    stats = cli.json("stats")
    assert set(stats["jobs"]) == {"1", "2"} and stats["jobs"]["1"]["grad_packets"] == 0
    watch = cli.run("--json", "stats", "--watch", "0.2", "--count", "2").stdout.splitlines()
    assert len(watch) == 2 and json.loads(watch[1])["rates"]["2"]["completions"] == 0.0
    tables = cli.json("tables")
    assert sum(e["table"] == n.WORKERS for e in tables["entries"]) == 5
    assert {g["group_id"] for g in tables["groups"]} == {1, 257, 258}
    assert "egress_rid=34 -> set_worker_address(mac=02:00:00:00:00:02, ip=10.0.0.2)" in \
        cli.run("tables", "--table", "param_rewrite").stdout
    moved = cli.json("workers", "replace", "1", "1", "spare")
    assert moved["workers"]["1"]["port"] == 20
    added = cli.json("workers", "add", "1", "5", "--port", "21", "--mac", "02:00:00:00:00:15", "--ip", "10.0.0.21")
    assert len(added["workers"]) == 4
    assert "job 1 has 3 workers" in cli.run("workers", "remove", "1", "0").stdout
    shown = cli.json("jobs", "show", "1")
    assert sorted(shown["workers"]) == ["1", "2", "5"]
    assert "deleted job 2: slots 32..131 free" in cli.run("jobs", "delete", "2").stdout
    with SwitchConnection(switch.addr, election_id=(0, 9), require_primary=False) as probe:
        jobs_table = probe.read_entries(n.JOBS)
        assert [e.match[n.MF_JOB] for e in jobs_table] == [1]
        assert jobs_table[0].params["workers"] == 3
        assert n.job_group(2) not in {g.group_id for g in probe.read_groups()}
    shell = cli.run("shell", stdin='print("JOBS", len(list(table_entry["MindpIngress.admission.jobs"].read())))\n')
    assert "JOBS 1" in shell.stdout


def test_bad_input_is_one_line_and_nonzero(cli, tmp_path, switch, topo):
    cli.run("push")
    cli.run("jobs", "create", "--job-id", "1")
    cli.fails("jobs", "create", "--job-id", "1", match="job 1 already exists")
    cli.fails("jobs", "show", "9", match="unknown job 9")
    cli.fails("jobs", "delete", "9", match="unknown job 9")
    cli.fails("jobs", "create", "--job-id", "2", "--workers", "w2_0", "--optimizer", "opt2", "--slots", "1020",
              match="slot pool exhausted: job 2 needs 1020 slots, 1008 of 1024 free")
    cli.fails("jobs", "create", "--job-id", "2", "--workers", "w1_0", "--optimizer", "opt2",
              match="port 1 is already owned by job 1")
    cli.fails("jobs", "create", "--job-id", "2", "--workers", "nobody", "--optimizer", "opt2",
              match="unknown host 'nobody'")
    bad = tmp_path / "bad.json"
    for content, msg in (("{not json", "malformed job file"), ('{"job_id": 2}', "malformed job description"),
                         ("[1, 2]", "expected a JSON object"),
                         ('{"job_id": 2, "workers": {"x": "w2_0"}, "optimizer": "opt2"}', "malformed job description")):
        bad.write_text(content)
        cli.fails("jobs", "create", "--file", str(bad), match=msg)
    cli.fails("jobs", "create", "--file", str(tmp_path / "missing.json"), match="cannot read job file")
    cli.fails("workers", "add", "1", "3", match="needs a host name or all of --port, --mac and --ip")
    cli.fails("tables", "--table", "nope", match="unknown table 'nope'")
    assert cli.run("jobs", "create", "--job-id", "2", "--workers", "w2_0", "--optimizer", "opt2", "--slots", "2000",
                   ok=False).returncode == 1
    # Nothing half-installed: only job 1 on the switch.
    with SwitchConnection(switch.addr, election_id=(0, 9), require_primary=False) as probe:
        assert [e.match[n.MF_JOB] for e in probe.read_entries(n.JOBS)] == [1]
        assert all(e.match[n.MF_JOB] == 1 for e in probe.read_entries(n.WORKERS))
        assert {g.group_id for g in probe.read_groups()} == {1, 257}
    # Another controller is primary: writes are refused naming its election id; reads need no session.
    with Controller(switch.addr, election_id=(0, 7)):
        cli.fails("jobs", "delete", "1", match="another controller holds election id 0,7 (ours is 0,1)")
        assert [j["job_id"] for j in cli.json("jobs", "list")["jobs"]] == [1]
    with Controller(switch.addr, election_id=(0, 1)):  # e.g. make run's controller, with our default id
        assert cli.json("stats")["jobs"]["1"]["grad_packets"] == 0
        cli.fails("jobs", "delete", "1", match="election id 0,1 is in use by another controller")
        cli.fails("jobs", "delete", "1", match="choose another with --election-id")
    cli.fails("--cacert", str(tmp_path / "ca.pem"), "push", match="TLS credential")
    # A program other than ours (a P4Info with a renamed table).
    other = tmp_path / "other.p4info.txtpb"
    other.write_text(artifacts.P4INFO.read_text().replace('"MindpIngress.admission.jobs"', '"MindpIngress.x.jobs"'))
    cli.fails("--p4info", str(other), "jobs", "list", match="runs another program")
    cli.fails("--p4info", str(tmp_path / "none.txtpb"), "jobs", "list", match="cannot read P4Info")
    cli.fails("--topology", str(bad), "jobs", "list", match="malformed topology")


def test_unreachable_switch_and_usage(tmp_path, topo):
    path = tmp_path / "topo.json"
    topo.dump(path)
    cli = Ctl(f"127.0.0.1:{targets.free_port()}", path)
    for cmd in (["jobs", "list"], ["push"], ["stats"], ["shell"]):
        cli.fails("--timeout", "0.3", *cmd, match="cannot reach the switch at 127.0.0.1:")
    cli.fails("--election-id", "x", "push", match="bad election id", code=2)
    for cmd in ([], ["jobs"], ["jobs", "create"], ["workers", "replace"], ["stats"], ["shell"]):
        proc = cli.run(*cmd, "--help")
        assert proc.stdout.startswith("usage: mindp-ctl")


@pytest.mark.parametrize("value, message", [("0.3", "no gRPC server answered within 0.3 s"),
                                            ("soon", "MINDP_CTL_TIMEOUT must be a positive number of seconds, at "
                                                     "most 86400, not 'soon'"),
                                            ("-2", "MINDP_CTL_TIMEOUT must be a positive number of seconds, at most "
                                                   "86400, not '-2'"),
                                            # gRPC's deadline then lay in the past: 'no server answered' at once
                                            ("1e10", "MINDP_CTL_TIMEOUT must be a positive number of seconds, at "
                                                     "most 86400, not '1e10'")])
def test_the_default_timeout_comes_from_the_environment(tmp_path, topo, value, message):
    """$MINDP_CTL_TIMEOUT replaces the 3 s default (this suite sets a hang guard there); a bad one is one line."""
    path = tmp_path / "topo.json"
    topo.dump(path)
    proc = progress.run([*ctl_command(), "--grpc-addr", f"127.0.0.1:{targets.free_port()}", "--topology", str(path),
                         "jobs", "list"], capture_output=True, text=True, env={**os.environ, TIMEOUT_ENV: value})
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_global_options_after_the_command(cli, switch):
    cli.run("push")
    cli.run("jobs", "create", "--job-id", "1")
    watch = cli.run("stats", "--watch", "0.2", "--count", "2", "--json").stdout.splitlines()
    assert len(watch) == 2 and json.loads(watch[0])["totals"]["jobs"]["1"]["grad_packets"] == 0
    bare = [*ctl_command(), "jobs", "list", "--json", "--grpc-addr", switch.addr, "--timeout", "5"]
    proc = progress.run(bare, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert [j["job_id"] for j in json.loads(proc.stdout)["jobs"]] == [1]
    assert json.loads(cli.run("jobs", "show", "1", "--json").stdout)["job_id"] == 1


@pytest.mark.parametrize("workers,message", [
    ("0=w2_0,0=w2_1", "worker id 0 given twice"),
    ("w2_0,1=w2_1", "mixes both"),
    ("0=w2_0,,1=w2_1", "empty worker"),
    ("0=", "expected ID=HOST"),
    ("0=w2_0,-1=w2_1", "ID >= 0"),
    ("x=w2_0", "integer ID"),
    ("0=w2_0,1=w2_0", "host w2_0 given for two worker ids"),
])
def test_bad_worker_lists_are_refused(tmp_path, topo, workers, message):
    path = tmp_path / "topo.json"
    topo.dump(path)
    cli = Ctl(f"127.0.0.1:{targets.free_port()}", path)  # refused before any connection
    cli.fails("jobs", "create", "--job-id", "2", "--workers", workers, "--optimizer", "opt2", match=message, code=2)


def test_usage_values_are_checked_before_connecting(tmp_path, topo):
    path = tmp_path / "topo.json"
    topo.dump(path)
    cli = Ctl(f"127.0.0.1:{targets.free_port()}", path)
    cli.fails("--timeout", "-1", "stats", match="must be a positive number of seconds", code=2)
    cli.fails("stats", "--timeout", "nan", match="must be a positive number of seconds", code=2)
    cli.fails("stats", "--watch", "0", match="must be a positive number", code=2)
    cli.fails("stats", "--watch", "1", "--count", "0", match="must be a positive integer", code=2)
    cli.fails("stats", "--count", "5", match="--count needs --watch", code=2)
    cli.fails("jobs", "create", "--job-id", "2", "--slots", "-3", match="must be a positive integer", code=2)


def test_bad_addresses_are_refused_before_any_write(cli, switch):
    cli.run("push")
    cli.run("jobs", "create", "--job-id", "1")
    with SwitchConnection(switch.addr, arbitrate=False) as probe:
        before = sorted(e.key() for e in probe.read_entries())
        for mac, ip, message in (("zz", "10.0.0.21", "bad MAC 'zz'"),
                                 ("02:00:00:00:00:15", "10.0.0.300", "bad IPv4 address '10.0.0.300'")):
            cli.fails("workers", "add", "1", "5", "--port", "21", "--mac", mac, "--ip", ip, match=message)
            cli.fails("workers", "replace", "1", "0", "--port", "21", "--mac", mac, "--ip", ip, match=message)
        assert sorted(e.key() for e in probe.read_entries()) == before


def test_forced_push_says_what_it_wiped(cli, topo):
    assert "pushed the pipeline;" in cli.run("push").stdout
    cli.run("jobs", "create", "--job-id", "1")
    cli.run("jobs", "create", "--job-id", "2")
    forwarding = 2 * len(topo.hosts) + 1  # forwarding and source guard entries a host, and broadcast
    per_job = [2 + 2 * j.n_workers for j in topo.jobs]  # job, optimizer, and a membership and rewrite a worker
    out = cli.run("push", "--force").stdout
    assert (f"re-pushed the pipeline, wiping {forwarding + sum(per_job)} table entries (jobs 1, 2) and 3 multicast "
            "groups") in out, out
    wiped = cli.json("push", "--force")["wiped"]
    assert wiped == {"program": "ours", "entries": forwarding, "groups": 1, "jobs": []}


SHELL_READ = 'print("JOBS", len(list(table_entry["MindpIngress.admission.jobs"].read())))\n'
SHELL_WRITE = ('te = table_entry["MindpIngress.forwarding.l2_forward"](action="MindpIngress.forwarding.forward")\n'
               'te.match["hdr.ethernet.dstAddr"] = "02:77:00:00:00:01"\nte.action["port"] = "3"\n'
               'te.insert(); print("WRO" + "TE")\n')


def test_shell_next_to_a_primary_controller_never_takes_primary(cli, switch, topo):
    cli.run("push")
    cli.run("jobs", "create", "--job-id", "1")
    for primary_id in ((0, 1), (0, 5)):  # make run's controller has the default id, or another one
        with Controller(switch.addr, election_id=primary_id, topology=topo) as primary:
            shell = cli.run("shell", stdin=SHELL_READ + SHELL_WRITE, ok=False)
            assert shell.returncode == 0, shell.stderr
            assert "JOBS 1" in shell.stdout and "read-only session" in shell.stderr
            assert "WROTE" not in shell.stdout and "Traceback" not in shell.stderr  # refused: not primary
            assert primary.conn.is_primary and len(primary.conn.read_entries(n.L2_FORWARD)) == len(topo.hosts) + 1
            primary.delete_job(1)  # the primary still writes
            primary.create_job(topo.job(1))
    with Controller(switch.addr, election_id=(0, 5), topology=topo) as primary:
        cli.fails("--election-id", "0,9", "shell", match="election id 0,5 is primary: the shell's --election-id 0,9 "
                  "would take primary away")
        backup = cli.run("--election-id", "0,3", "shell", stdin=SHELL_READ, ok=False)
        assert backup.returncode == 0 and "JOBS 1" in backup.stdout, backup.stderr
        assert primary.conn.is_primary
    alone = cli.run("shell", stdin=SHELL_WRITE)  # nobody else: the shell is primary and writes
    assert "WROTE" in alone.stdout


def test_delete_reports_pieces_already_missing(cli, switch):
    cli.run("push")
    cli.run("jobs", "create", "--job-id", "2")
    with Controller(switch.addr, election_id=(0, 9)) as other:
        other.conn.delete_group(n.job_group(2))
    proc = cli.run("jobs", "delete", "2", ok=False)
    assert proc.returncode == 0 and "reconcile: job 2: multicast group 258 missing" in proc.stderr
    assert "deleted job 2" in proc.stdout and "already missing on the switch: multicast group 258" in proc.stdout
    assert cli.json("jobs", "list")["jobs"] == []
