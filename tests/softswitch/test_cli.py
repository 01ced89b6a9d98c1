"""mindp-softswitch's command line: what it refuses, each in one line before it starts anything, and
what it takes as BMv2's simple_switch_grpc does."""
from __future__ import annotations

import sys

import pytest

from mindp import progress, targets
from softswitch import cli

REFUSED = [
    (["-i", "600@lo"], "bad interface '600@lo': port 600 is not within 0..511 (9 bits)"),
    (["-i", "²@lo"], "bad interface '²@lo': expected PORT@IFACE, e.g. 1@veth1"),  # a digit int() refuses
    (["-i", "1@lo", "-i", "2@lo"], "interface lo given twice"),
    (["-i", "3@lo", "--", "--cpu-port", "3"], "port 3 is the CPU port"),
    (["--", "--cpu-port", "511"], "--cpu-port 511 is the drop port (give --drop-port another)"),
    (["--drop-port", "7", "--", "--cpu-port", "7"], "--cpu-port 7 is the drop port (give --drop-port another)"),
    (["--", "--cpu-port", "512"], "--cpu-port 512: not within 0..511 (v1model's ports are 9 bits)"),
    (["--", "--cpu-port", "0"], "--cpu-port 0: BMv2 reads 0 as no CPU port; give 1..511"),
    (["--device-id", "-1"], "--device-id -1: must be within 0..2^64-1 (P4Runtime's uint64)"),
    (["--device-id", str(2**64)], f"--device-id {2**64}: must be within 0..2^64-1 (P4Runtime's uint64)"),
    (["--drop-port", "-5"], "--drop-port -5: not within 0..511 (v1model's ports are 9 bits)"),
    (["--", "--drop-port", "600"], "--drop-port 600: not within 0..511 (v1model's ports are 9 bits)"),
    (["--drop-port", "5", "--", "--drop-port", "7"], "--drop-port given before and after --: give it once"),
    (["--seed", "7"], "--seed seeds the fault injection: give it with --drop-prob, --dup-prob or --reorder-prob"),
]


def refusal(argv: list[str]) -> str:
    """Why parse_args refuses argv (with --no-p4 before any --)."""
    i = argv.index("--") if "--" in argv else len(argv)
    with pytest.raises(cli.SwitchUsageError) as refused:  # (main says it in one line: the next test)
        cli.parse_args([*argv[:i], "--no-p4", *argv[i:]])
    return str(refused.value)


@pytest.mark.parametrize("argv,why", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_a_bad_command_line_is_refused(argv, why):
    assert refusal(argv) == why


def test_the_process_says_it_in_one_line():
    """It was a ValueError's traceback."""
    r = progress.run([sys.executable, "-m", "softswitch", "-i", "²@lo", "--no-p4"], capture_output=True, text=True)
    assert (r.returncode, r.stderr) == (2, "mindp-softswitch: bad interface '²@lo': expected PORT@IFACE, e.g. 1@veth1\n")


def test_each_limit_is_taken_up_to_its_last_value_and_mindp_s_command_line_parses():
    args = cli.parse_args(["-i", "0@a", "-i", "511@b", "--device-id", str(2**64 - 1), "--no-p4",
                           "--", "--drop-port", "5", "--cpu-port", "1"])
    assert (args.ports, args.drop_port, args.cpu_port, args.device_id) == ({0: "a", 511: "b"}, 5, 1, 2**64 - 1)
    for beyond in (["-i", "512@b"], ["--device-id", str(2**64)], ["--", "--cpu-port", "0"]):
        assert refusal(beyond)
    plain = cli.parse_args(["--no-p4"])
    assert (plain.drop_port, plain.cpu_port, plain.seed, plain.drop_prob, plain.dup_prob, plain.reorder_prob) == \
        (511, None, 0, 0.0, 0.0, 0.0)
    assert cli.parse_args(["--drop-port", "9", "--no-p4"]).drop_port == 9  # before -- too, once
    # A probability given, even 0, takes a seed (tools/soak.py passes its zero --dup and --reorder so); none, not
    assert cli.parse_args(["--dup-prob", "0.0", "--reorder-prob", "0", "--seed", "5", "--no-p4"]).seed == 5
    assert refusal(["--seed", "5"])
    cfg = targets.SwitchConfig(ports={1: "h1-eth0", 2: "h2-eth0"}, device_id=3, cpu_port=64, thrift_port=9091,
                               fault_args=["--drop-prob", "0.1", "--seed", "2"])
    args = cli.parse_args(targets.command("embedded", cfg)[3:])
    assert (args.ports, args.device_id, args.cpu_port, args.drop_port, args.drop_prob, args.seed) == \
        ({1: "h1-eth0", 2: "h2-eth0"}, 3, 64, 511, 0.1, 2)
