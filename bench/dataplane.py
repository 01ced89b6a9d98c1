"""Switch throughput: aggregation packets against plain forwarding, for several K.

    python bench/dataplane.py [--target bmv2|embedded] [--k 16 32 64] [--packets N]

For each K (the committed program of that K, else compiled with p4c for it;
skipped without p4c) one run of the target, side by side: (a) plain L2
forwarding of frames as long as a gradient frame, and (b) gradient packets of a
2-worker job, every second one completing a sum. Both closed-loop with a fixed
window of frames in flight, so the switch, not its queues, sets the pace.
Prints packets/s, elements/s and the ratio aggregation/forwarding.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from controller.p4runtime import SwitchConnection  # noqa: E402
from host_agent.agent_args import integer  # noqa: E402
from mindp import interrupts, targets  # noqa: E402
from mindp.protocol import K, K_ENV, MAX_K  # noqa: E402
from mindp.harness.loadgen import aggregation_entries, closed_loop, forward_frames, gradient_frames  # noqa: E402
from mindp.harness.testbed import Testbed  # noqa: E402
from mindp.topology import Host  # noqa: E402
from p4src import artifacts  # noqa: E402

SENDER = Host("w", "02:00:00:00:01:01", "10.0.1.1", 1)
SINK = Host("o", "02:00:00:00:01:02", "10.0.1.2", 2)


def program_for(k: int, workdir: pathlib.Path) -> tuple[str, str] | None:
    prog = artifacts.program(k)
    if artifacts.staleness(k=k) is None:
        return str(prog.p4info), str(prog.json)
    p4c = artifacts.find_p4c()
    if not p4c:
        return None
    info, js = workdir / f"k{k}.p4info.txtpb", workdir / f"k{k}.json"
    artifacts.compile_program(p4c, artifacts.MAIN, js, info, k)
    return str(info), str(js)


def measure(target: str, k: int, program: tuple[str, str], packets: int, window: int, logdir: str) -> dict:
    with Testbed("bdp") as bed:
        bed.add(SENDER)
        bed.add(SINK)
        cfg = targets.SwitchConfig(ports=bed.ports(), grpc_addr=f"127.0.0.1:{targets.free_port()}",
                                   log_file=os.path.join(logdir, f"switch-{target}-k{k}.log"),
                                   thrift_port=targets.free_port())
        with targets.SwitchProcess(target, cfg, k=k), SwitchConnection(cfg.grpc_addr, p4info_path=program[0]) as sw:
            sw.push_pipeline(program[0], program[1])
            for e in aggregation_entries(SENDER, SINK):
                sw.insert(e)
            tx, rx = bed.hosts["w"].socket(), bed.hosts["o"].socket()
            fwd_pps, _ = closed_loop(tx, rx, forward_frames(SENDER, SINK, packets, k), 1, window)
            agg_pps, sums = closed_loop(tx, rx, gradient_frames(SENDER, SINK, packets // 2, k), 2, window)
    return {"k": k, "forward_pps": fwd_pps, "aggregate_pps": agg_pps, "sums": sums}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="auto", choices=targets.TARGETS)
    ap.add_argument("--k", type=integer(8, MAX_K), nargs="+",
                    help=f"default: the committed programs' ({' '.join(map(str, artifacts.COMMITTED_K))})")
    ap.add_argument("--packets", type=integer(2), default=6000)
    ap.add_argument("--window", type=integer(2), default=48, help="frames in flight (BMv2 queues hold 64)")
    ap.add_argument("--row", action="store_true", help="one K, this process's: its row only")
    args = ap.parse_args()
    if args.row and args.k not in (None, [K]):  # a row runs at its process's K: the parent sets K_ENV for each --k
        print(f"bench/dataplane.py: --row measures this process's K, {K} ({K_ENV}), not --k "
              f"{' '.join(map(str, args.k))} (without --row, each --k runs at its own K)", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("bench/dataplane.py needs root (network namespaces)")
        return 1
    if not args.row:  # each K in a process of that K, as the controller pushes only its own K's program
        print(f"switch throughput (TARGET={args.target}: BMv2 where it runs K): closed loop, window {args.window}, "
              f"{args.packets} packets per figure")
        print(f"{'K':>4} {'forward pps':>12} {'aggregate pps':>14} {'agg/fwd':>8} {'elements/s':>12}  switch",
              flush=True)
        for k in args.k or artifacts.COMMITTED_K:
            try:
                targets.resolve(args.target, k)
            except targets.TargetError as exc:
                print(f"{k:>4} skipped: {exc}", flush=True)
                continue
            subprocess.run([sys.executable, __file__, "--target", args.target, "--k", str(k), "--packets",
                            str(args.packets), "--window", str(args.window), "--row"],
                           env={**os.environ, K_ENV: str(k)}, check=True)
        return 0
    target = targets.resolve(args.target, K)
    with tempfile.TemporaryDirectory() as tmp:
        for k in [K]:
            program = program_for(k, pathlib.Path(tmp))
            if program is None:
                print(f"{k:>4} skipped: p4c-bm2-ss not installed to compile K={k}")
                continue
            r = measure(target, k, program, args.packets, args.window, tmp)
            print(f"{k:>4} {r['forward_pps']:12,.0f} {r['aggregate_pps']:14,.0f} "
                  f"{r['aggregate_pps'] / r['forward_pps']:8.2f} {r['aggregate_pps'] * k:12,.0f}  {target}")
    return 0


if __name__ == "__main__":
    interrupts.exit_with(main, "bench/dataplane.py")
