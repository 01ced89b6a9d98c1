"""Switch throughput: aggregation packets against plain forwarding, for several K.

    python bench/dataplane.py [--target bmv2|embedded] [--k 16 32 64] [--packets N]

For each K (the program recompiled with p4c for K other than the protocol's;
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
import select
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from controller import p4info_names as N  # noqa: E402
from controller.model import Entry  # noqa: E402
from controller.p4runtime import SwitchConnection  # noqa: E402
from mindp import codec, targets  # noqa: E402
from mindp.protocol import K, Kind, frame_len  # noqa: E402
from mindp.testbed import Testbed  # noqa: E402
from mindp.topology import Host  # noqa: E402
from p4src import artifacts, gen_p4  # noqa: E402

SENDER = Host("w", "02:00:00:00:01:01", "10.0.1.1", 1)
SINK = Host("o", "02:00:00:00:01:02", "10.0.1.2", 2)


def program_for(k: int, workdir: pathlib.Path) -> tuple[str, str] | None:
    if k == K:
        return str(artifacts.P4INFO), str(artifacts.BMV2_JSON)
    p4c = artifacts.find_p4c()
    if not p4c:
        return None
    src = workdir / f"p4src-k{k}"
    shutil.copytree(artifacts.HERE, src, ignore=shutil.ignore_patterns("compiled", "__pycache__", "*.py"))
    gen_p4.main(["--k", str(k), "--out", str(src / "generated")])
    info, js = workdir / f"k{k}.p4info.txtpb", workdir / f"k{k}.json"
    artifacts.compile_program(p4c, src / "mindp.p4", js, info)
    return str(info), str(js)


def install(sw: SwitchConnection) -> None:
    sw.insert(Entry(N.L2_FORWARD, {N.MF_DST_MAC: SINK.mac}, N.FORWARD, {"port": SINK.port}))
    sw.insert(Entry(N.JOBS, {N.MF_JOB: 1}, N.SET_JOB, {
        "slot_base": 0, "slot_count": 1024, "workers": 2, "optimizer_port": SINK.port, "optimizer_mac": SINK.mac,
        "optimizer_ip": SINK.ip, "mcast_group": N.job_group(1), "epoch": 1}))
    for w in (0, 1):  # both workers behind one port keeps their packets in order
        sw.insert(Entry(N.WORKERS, {N.MF_INGRESS_PORT: SENDER.port, N.MF_JOB: 1, N.MF_WORKER: w}, N.ADMIT))


def gradient_frames(k: int, uses: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    n = 2 * uses
    chunk = np.repeat(np.arange(uses), 2)
    hdr = codec.header_array(n, job=1, worker=np.tile([0, 1], uses), step=0, chunk=chunk, slot=chunk % 1024,
                             ver=(chunk // 1024) & 1, count=k)
    elems = rng.standard_normal((n, k)).astype(np.float16)
    frames = codec.encode(Kind.GRAD, hdr, elems, codec.Addresses(SENDER.mac, SINK.mac, SENDER.ip, SINK.ip), k=k)
    return [f.tobytes() for f in frames]


def forward_frames(k: int, n: int) -> list[bytes]:
    """Plain frames to the sink, as long as a gradient frame (not our protocol: L2 forwarded)."""
    length = frame_len(Kind.GRAD, k)
    head = bytes.fromhex(SINK.mac.replace(":", "") + SENDER.mac.replace(":", "")) + b"\x88\xb5"
    return [head + i.to_bytes(4, "big") + bytes(length - len(head) - 4) for i in range(n)]


def closed_loop(tx, rx, frames: list[bytes], per_output: int, window: int) -> tuple[float, int]:
    """Send with at most `window` frames in flight; returns (input packets/s, outputs received)."""
    sent = received = 0
    expected = len(frames) // per_output
    t0 = time.perf_counter()
    last = t0
    while received < expected:
        while sent < len(frames) and sent - received * per_output < window:
            tx.send(frames[sent])
            sent += 1
        ready, _, _ = select.select([rx], [], [], 1.0)
        if not ready:
            break  # lost frames: stop, rate counts what came through
        while True:
            try:
                rx.recv(4096)
            except BlockingIOError:
                break
            received += 1
            last = time.perf_counter()
    return received * per_output / (last - t0), received


def measure(target: str, k: int, program: tuple[str, str], packets: int, window: int, logdir: str) -> dict:
    with Testbed("bdp") as bed:
        bed.add(SENDER)
        bed.add(SINK)
        cfg = targets.SwitchConfig(ports=bed.ports(), grpc_addr=f"127.0.0.1:{targets.free_port()}",
                                   log_file=os.path.join(logdir, f"switch-{target}-k{k}.log"),
                                   thrift_port=targets.free_port())
        with targets.SwitchProcess(target, cfg), SwitchConnection(cfg.grpc_addr, p4info_path=program[0]) as sw:
            sw.push_pipeline(program[0], program[1])
            install(sw)
            tx, rx = bed.hosts["w"].socket(), bed.hosts["o"].socket()
            fwd_pps, _ = closed_loop(tx, rx, forward_frames(k, packets), 1, window)
            agg_pps, sums = closed_loop(tx, rx, gradient_frames(k, packets // 2), 2, window)
    return {"k": k, "forward_pps": fwd_pps, "aggregate_pps": agg_pps, "sums": sums}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="auto", choices=targets.TARGETS)
    ap.add_argument("--k", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--packets", type=int, default=6000)
    ap.add_argument("--window", type=int, default=48, help="frames in flight (BMv2 queues hold 64)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/dataplane.py needs root (network namespaces)")
        return 1
    target = targets.resolve(args.target)
    print(f"switch throughput on {target}: closed loop, window {args.window}, {args.packets} packets per figure")
    print(f"{'K':>4} {'forward pps':>12} {'aggregate pps':>14} {'agg/fwd':>8} {'elements/s':>12}")
    with tempfile.TemporaryDirectory() as tmp:
        for k in args.k:
            program = program_for(k, pathlib.Path(tmp))
            if program is None:
                print(f"{k:>4} skipped: p4c-bm2-ss not installed to compile K={k}")
                continue
            r = measure(target, k, program, args.packets, args.window, tmp)
            print(f"{k:>4} {r['forward_pps']:12,.0f} {r['aggregate_pps']:14,.0f} "
                  f"{r['aggregate_pps'] / r['forward_pps']:8.2f} {r['aggregate_pps'] * k:12,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
