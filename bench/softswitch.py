"""Embedded switch throughput, side by side in one run on the same frames.

    python bench/softswitch.py [--packets N] [--window W]

On one veth testbed (sender host -> switch port 1, sink host <- port 2):
  (a) the embedded switch running the aggregation program (p4src/compiled/mindp.json),
      gradient packets of a 2-worker job, every second one completing a sum;
  (b) BMv2 simple_switch_grpc on the same program and frames, where installed;
  (c) a raw AF_PACKET receive-and-send loop in Python forwarding the same frames
      (the ceiling for any Python switch on this machine);
plus the executor alone (no I/O) on the same frames. Prints packets/s and the
ratios embedded/BMv2 and embedded/raw loop. Closed loop with a fixed window of
frames in flight, so the switch, not its queues, sets the pace.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from controller.p4runtime import SwitchConnection  # noqa: E402
from mindp import targets  # noqa: E402
from mindp.loadgen import aggregation_entries, closed_loop, gradient_frames  # noqa: E402
from mindp.protocol import K  # noqa: E402
from mindp.testbed import Testbed  # noqa: E402
from mindp.topology import Host  # noqa: E402
from p4src import artifacts  # noqa: E402

SENDER = Host("w", "02:00:00:00:02:01", "10.0.2.1", 1)
SINK = Host("o", "02:00:00:00:02:02", "10.0.2.2", 2)

RAW_LOOP = """
import socket, sys
a, b = (socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3)) for _ in range(2))
a.bind((sys.argv[1], 0)); b.bind((sys.argv[2], 0))
a.setsockopt(263, 23, 1)  # PACKET_IGNORE_OUTGOING
print("ready", flush=True)
while True:
    b.send(a.recv(65535))
"""


def switch_run(bed: Testbed, target: str, frames, window: int, logdir: str) -> tuple[float, int]:
    cfg = targets.SwitchConfig(ports=bed.ports(), grpc_addr=f"127.0.0.1:{targets.free_port()}",
                               log_file=os.path.join(logdir, f"{target}.log"), thrift_port=targets.free_port())
    with targets.SwitchProcess(target, cfg) as proc, \
            SwitchConnection(cfg.grpc_addr, p4info_path=str(artifacts.P4INFO)) as sw:
        sw.push_pipeline(str(artifacts.P4INFO), str(artifacts.BMV2_JSON))
        proc.set_queue_depth(max(64, 2 * window))
        for e in aggregation_entries(SENDER, SINK):
            sw.insert(e)
        tx, rx = bed.hosts["w"].socket(), bed.hosts["o"].socket()
        try:
            return closed_loop(tx, rx, frames, 2, window)
        finally:
            tx.close()
            rx.close()


def raw_loop_run(bed: Testbed, frames, window: int) -> float:
    ports = bed.ports()
    proc = subprocess.Popen([sys.executable, "-c", RAW_LOOP, ports[SENDER.port], ports[SINK.port]],
                            stdout=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()
        tx, rx = bed.hosts["w"].socket(), bed.hosts["o"].socket()
        try:
            return closed_loop(tx, rx, frames, 1, window)[0]
        finally:
            tx.close()
            rx.close()
    finally:
        proc.kill()
        proc.wait()


def executor_alone(frames) -> float:
    from softswitch import compiler
    from softswitch.engine import Engine
    from softswitch.tables import InstalledEntry as TEntry
    eng = Engine(compiler.load(artifacts.BMV2_JSON.read_bytes()))
    t = eng.program.tables

    def ins(table, match, action, args=()):
        tab = t[table]
        aid = next(a for a, s in tab.actions.items() if s.name == action)
        tab.insert(TEntry(match, 0, aid, tuple(args), ()))
    mac = int(SINK.mac.replace(":", ""), 16)
    ip = int.from_bytes(bytes(map(int, SINK.ip.split("."))), "big")
    ins("MindpIngress.admission.jobs", (1,), "MindpIngress.admission.set_job", [0, 1024, 2, 2, mac, ip, 257, 1, 0, 0, 0])
    for w in (0, 1):
        ins("MindpIngress.admission.workers", (1, 1, w), "MindpIngress.admission.admit")
    t0 = time.perf_counter()
    for fr in frames:
        eng.process(fr, 1)
    return len(frames) / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packets", type=int, default=6000)
    ap.add_argument("--window", type=int, default=48)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/softswitch.py needs root (network namespaces)")
        return 1
    frames = gradient_frames(SENDER, SINK, args.packets // 2)
    print(f"aggregation program, K={K}, {len(frames)} gradient frames, closed loop window {args.window}")
    results = {"executor alone (no I/O)": executor_alone(frames)}
    with tempfile.TemporaryDirectory() as tmp, Testbed("bss") as bed:
        bed.add(SENDER)
        bed.add(SINK)
        results["raw socket loop (ceiling)"] = raw_loop_run(bed, frames, args.window)
        emb, sums = switch_run(bed, "embedded", frames, args.window, tmp)
        results["embedded switch"] = emb
        if sums != len(frames) // 2:
            print(f"warning: embedded switch returned {sums} of {len(frames) // 2} sums")
        if targets.find_bmv2():
            results["BMv2 simple_switch_grpc"], _ = switch_run(bed, "bmv2", frames, args.window, tmp)
    for name, pps in results.items():
        print(f"  {name:28} {pps:10,.0f} packets/s")
    raw = results["raw socket loop (ceiling)"]
    print(f"  embedded / raw loop          {emb / raw:10.2f}")
    if "BMv2 simple_switch_grpc" in results:
        print(f"  embedded / BMv2              {emb / results['BMv2 simple_switch_grpc']:10.2f}")
    else:
        print("  embedded / BMv2              n/a (BMv2 not installed)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
