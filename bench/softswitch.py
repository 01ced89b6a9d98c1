"""Embedded switch throughput, side by side in one run on the same frames, for each K.

    python bench/softswitch.py [--k K [K ...]] [--packets N] [--windows W [W ...]] [--rounds N]

For each K (default: every committed program's) one process at MINDP_K=K runs the comparison
below on frames of that K; then a table gives elements/s per K for each contender and the
embedded switch's elements/s at each K over its K = 32 figure (goal at the default K: >= 10).

What the two embedded figures measure, the same way at every K: packets/s is the closed loop's
pace, which the switch and the load generator (whose sends also pay the kernel's copy of each
frame into the switch's receive ring) set together on this machine's cores, and other load on them
too; "per CPU-second" is the packets the switch forwards per second of its own CPU time (its
threads' run time from /proc, the kernel work of its sends included: the receivers' softirqs),
its least over the windows: what it costs, whatever shares the cores.

On one veth testbed (sender host -> switch port 1, sink host <- port 2):
  (a) the embedded switch running the aggregation program (p4src/compiled/k<K>/mindp.json),
      gradient packets of a 2-worker job, every second one completing a sum: with its
      default pipeline, and with the generated Python pipeline (the reference);
  (b) BMv2 simple_switch_grpc on the same program and frames, where installed and K fits it (<= 80);
  (c) a batched raw-socket forwarding loop (recvmmsg, sendmmsg; the switch's batch size)
      between the same ports, in C (bench/loops.c: the I/O ceiling of any switch on this
      machine) and in Python with numpy (mindp.harness.loadgen.forward_loop);
plus each pipeline alone (no I/O, batches of the switch's size) on the same frames, and the seconds
a new switch takes to load the program, first in an empty cache and again from it. Prints
packets/s and the ratios embedded/BMv2 (goal >= 20) and embedded/ceiling (goal >= 0.5).
Closed loop with a fixed window of frames in flight (sent and received in bursts; the generator
in C through PACKET_MMAP rings, bench/loops.c, where a compiler is found), so the switch, not its
queues or the load generator, sets the pace. Each of (a)-(c) runs at every window of --windows and its best counts:
BMv2 is fastest with few frames queued, a batching switch with many, and every contender gets
the same number of tries. --rounds N runs every K N times in turn and prints the median of the
ratios taken within each round: the host's packet I/O drifts from run to run more than the goal's
margin.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, REPO)

from controller.p4runtime import SwitchConnection  # noqa: E402
from host_agent.agent_args import integer  # noqa: E402
from mindp import interrupts, mmsg, targets  # noqa: E402
from mindp.harness.loadgen import aggregation_entries, closed_loop, gradient_frames  # noqa: E402
from mindp.protocol import BMV2_MAX_K, HARDWARE_K, K, K_ENV, MAX_K, Kind, bmv2_fits, frame_len  # noqa: E402
from mindp.harness.testbed import Testbed  # noqa: E402
from mindp.topology import Host  # noqa: E402
from p4src import artifacts  # noqa: E402
from softswitch.batch import Batch  # noqa: E402
from softswitch.dataplane import BATCH  # noqa: E402

SENDER = Host("w", "02:00:00:00:02:01", "10.0.2.1", 1)
SINK = Host("o", "02:00:00:00:02:02", "10.0.2.2", 2)

FORWARD_LOOP = "import sys; from mindp.harness.loadgen import forward_loop; forward_loop(*sys.argv[1:3], int(sys.argv[3]))"
FORWARD_LOOP_C = ("import ctypes, sys; from host_agent import rawsock; from softswitch.native import build; "
                  "lib = ctypes.CDLL(str(build.build(open(sys.argv[4]).read()))); "
                  "a, b = rawsock.open_raw(sys.argv[1]), rawsock.open_raw(sys.argv[2]); print('ready', flush=True); "
                  "lib.forward(a.fileno(), b.fileno(), int(sys.argv[3]))")
LOOPS_C = os.path.join(REPO, "bench", "loops.c")
#: The command prefix that puts the embedded switch on its generated Python pipeline.
PYTHON_PIPELINE = ["env", "MINDP_SOFTSWITCH_PIPELINE=python"]
EMBEDDED = "embedded switch"
BMV2 = "BMv2 simple_switch_grpc"
CEILING = "batched forwarding loop in C (ceiling)"
SWITCH_CPU = "embedded, per CPU-second"
PY_LOOP = "batched forwarding loop in Python"


def c_closed_loop():
    """bench/loops.c's closed_loop with mindp.harness.loadgen.closed_loop's signature; None without a C
    compiler (the Python generator then runs, at ~400k packets/s here: slower than the switch)."""
    from softswitch.native import build
    try:
        lib = ctypes.CDLL(str(build.build(open(LOOPS_C).read())))
    except (build.BuildError, OSError):
        return None
    fn = lib.closed_loop
    fn.restype = ctypes.c_double
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p] + [ctypes.c_long] * 5 + [ctypes.POINTER(ctypes.c_long)]

    def run(tx, rx, frames, per_output: int, window: int) -> tuple[float, int]:
        rows = np.frombuffer(b"".join(frames), np.uint8).reshape(len(frames), -1)  # one length
        got = ctypes.c_long()
        secs = fn(tx.fileno(), rx.fileno(), rows.ctypes.data, len(frames), rows.shape[1], rows.shape[1], per_output,
                  window, ctypes.byref(got))
        if secs < 0:
            raise OSError(int(-secs), f"load generator rings: {os.strerror(int(-secs))}")
        return got.value * per_output / max(secs, 1e-9), got.value
    return run


def cpu_seconds(pid: int) -> float:
    """The CPU time process `pid`'s threads have run so far (the scheduler's, in ns: the kernel work
    done in their system calls included, such as the receivers' softirqs a send runs)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            pass
    return total / 1e9


def switch_run(bed: Testbed, target: str, frames, window: int, logdir: str, load=closed_loop,
               prefix: list[str] | None = None) -> tuple[float, int, float]:
    """(input packets/s, outputs, the switch process's CPU seconds a packet) of one closed loop."""
    cfg = targets.SwitchConfig(ports=bed.ports(), grpc_addr=f"127.0.0.1:{targets.free_port()}",
                               log_file=os.path.join(logdir, f"{target}.log"), thrift_port=targets.free_port())
    with targets.SwitchProcess(target, cfg, prefix=prefix) as proc, \
            SwitchConnection(cfg.grpc_addr, p4info_path=str(artifacts.P4INFO)) as sw:
        sw.push_pipeline(str(artifacts.P4INFO), str(artifacts.BMV2_JSON))
        proc.set_queue_depth(max(64, 2 * window))
        for e in aggregation_entries(SENDER, SINK):
            sw.insert(e)
        tx, rx = bed.hosts["w"].socket(), bed.hosts["o"].socket()
        try:
            before = cpu_seconds(proc.pid)
            pps, outputs = load(tx, rx, frames, 2, window)
            return pps, outputs, (cpu_seconds(proc.pid) - before) / max(outputs * 2, 1)
        finally:
            tx.close()
            rx.close()


def forward_loop_run(bed: Testbed, frames, window: int, native: bool, load=closed_loop) -> float | None:
    """The forwarding loop's packets/s; None where the C one could not be built (no compiler)."""
    ports = bed.ports()
    args = [FORWARD_LOOP_C, ports[SENDER.port], ports[SINK.port], str(BATCH), LOOPS_C] if native else \
        [FORWARD_LOOP, ports[SENDER.port], ports[SINK.port], str(BATCH)]
    proc = subprocess.Popen([sys.executable, "-c", *args], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        if proc.stdout.readline().strip() != "ready":
            return None
        tx, rx = bed.hosts["w"].socket(), bed.hosts["o"].socket()
        try:
            return load(tx, rx, frames, 1, window)[0]
        finally:
            tx.close()
            rx.close()
    finally:
        proc.kill()
        proc.wait()


def executor_alone(frames, pipeline: str) -> float:
    from softswitch import compiler
    from softswitch.engine import Engine
    from softswitch.tables import InstalledEntry as TEntry
    eng = Engine(compiler.load(artifacts.BMV2_JSON.read_bytes()), pipeline)
    t = eng.program.tables

    def ins(table, match, action, args=()):
        tab = t[table]
        aid = next(a for a, s in tab.actions.items() if s.name == action)
        tab.insert(TEntry(match, 0, aid, tuple(args), ()))
    mac = int(SINK.mac.replace(":", ""), 16)
    ip = int.from_bytes(bytes(map(int, SINK.ip.split("."))), "big")
    ins("MindpIngress.admission.jobs", (1,), "MindpIngress.admission.set_job", [0, 1024, 2, 2, mac, ip, 257, 1, 0, 0, 0])
    for w in (0, 1):
        ins("MindpIngress.admission.workers", (1, 1, w), "MindpIngress.admission.admit_worker")
    batches = []
    for i in range(0, len(frames), BATCH):
        rx = Batch.empty(BATCH, frame_len(Kind.SUM))  # native batches need one slot size in and out
        for fr in frames[i:i + BATCH]:
            rx.append(fr, SENDER.port)
        batches.append(rx)
    tx = Batch.empty(4 * BATCH, frame_len(Kind.SUM))
    t0 = time.perf_counter()
    for rx in batches:
        start = 0
        while start < rx.n:
            tx.n = 0
            start = eng.run_batch(rx, start, tx)
    return len(frames) / (time.perf_counter() - t0)


START = ("import sys, time; t = time.perf_counter(); from softswitch import compiler; from softswitch.engine import Engine; "
         "Engine(compiler.load(open(sys.argv[1], 'rb').read())); print(time.perf_counter() - t)")


def start_seconds() -> tuple[float, float]:
    """Seconds to load this K's program into a new switch process's engine: the first start (checked,
    generated and compiled to C) and a later one (from the start-up cache), in an empty cache."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "XDG_CACHE_HOME": cache}
        return tuple(float(subprocess.run([sys.executable, "-c", START, str(artifacts.BMV2_JSON)], env=env, cwd=REPO,
                                          check=True, stdout=subprocess.PIPE, text=True).stdout) for _ in range(2))


def best(measure, windows: list[int], name: str, want: int | None = None) -> tuple[float, int, dict[int, float]]:
    """(best packets/s, its window, packets/s per window) of measure(window) -> (packets/s, outputs)
    over `windows`; a run that returned fewer than `want` outputs is reported."""
    rates = {}
    for w in windows:
        rates[w], outputs = measure(w)[:2]
        if want is not None and outputs != want:
            print(f"warning: {name} (window {w}) returned {outputs} of {want} sums")
    top = max(rates, key=rates.get)
    return rates[top], top, rates


def cheapest(run):
    """(measure, least): measure(window) for `best` over run(window) -> (packets/s, outputs, switch
    CPU seconds a packet), and the dict where it keeps the least CPU a packet of any window ("cpu")."""
    least = {}

    def measure(w):
        pps, outputs, cpu = run(w)
        if outputs:
            least["cpu"] = min(least.get("cpu", cpu), cpu)
        return pps, outputs
    return measure, least


RESULT = "RESULT "  # a per-K child's machine-readable line: RESULT <json>


def compare_one_k(args) -> dict[str, float]:
    """The comparison at this process's K; prints it and returns packets/s per contender."""
    frames = gradient_frames(SENDER, SINK, args.packets // 2)
    sums = len(frames) // 2
    load = c_closed_loop() or closed_loop  # the load generator
    windows = sorted(set(args.windows))
    print(f"aggregation program, K={K}, {len(frames)} gradient frames of {len(frames[0])} bytes, closed loop "
          f"windows {', '.join(map(str, windows))} (best counts), switch batch {BATCH}, load generator in "
          f"{'Python' if load is closed_loop else 'C'}")
    first, later = start_seconds()
    print(f"  {'start: first (compile to C) / later':38} {first:10.2f} s / {later:.2f} s  (loading the program)")
    results = {"compiled pipeline alone (no I/O)": (executor_alone(frames, "compiled"), None, {}),
               "Python pipeline alone (no I/O)": (executor_alone(frames, "python"), None, {})}
    cpu = None
    with tempfile.TemporaryDirectory() as tmp, Testbed("bss") as bed:
        bed.add(SENDER)
        bed.add(SINK)
        if mmsg.CALLS:
            ceiling = best(lambda w: (forward_loop_run(bed, frames, w, True, load) or 0.0, None), windows, CEILING)
            if ceiling[0]:
                results[CEILING] = ceiling
            results[PY_LOOP] = best(lambda w: (forward_loop_run(bed, frames, w, False, load) or 0.0, None), windows,
                                   PY_LOOP)
        for name, prefix in ((EMBEDDED, None), ("embedded, Python pipeline", PYTHON_PIPELINE)):
            measure, least = cheapest(lambda w: switch_run(bed, "embedded", frames, w, tmp, load, prefix))
            results[name] = best(measure, windows, name, sums)
            if name == EMBEDDED and least:
                cpu = least["cpu"]
        if targets.find_bmv2() and bmv2_fits(K):
            results[BMV2] = best(lambda w: switch_run(bed, "bmv2", frames, w, tmp, load), windows, BMV2, sums)
    for name, (pps, window, rates) in results.items():
        each = ", ".join(f"{w}: {r:,.0f}" for w, r in rates.items())
        print(f"  {name:38} {pps:10,.0f} packets/s" + (f"  (window {window}; {each})" if rates else ""))
    emb = results[EMBEDDED][0]
    if cpu:
        results[SWITCH_CPU] = (1 / cpu, None, {})
        print(f"  {'embedded switch, its own CPU a packet':38} {cpu * 1e6:10.2f} us  (its least over the windows: "
              f"{1 / cpu:,.0f} packets a CPU-second)")
    bmv2 = results[BMV2][0] if BMV2 in results else None
    why = f"BMv2 runs K up to {BMV2_MAX_K}" if targets.find_bmv2() else "BMv2 not installed"
    print(f"  {'embedded / BMv2 (goal >= 20)':38} " + (f"{emb / bmv2:10.2f}" if bmv2 else f"       n/a ({why})"))
    ceiling = results[CEILING][0] if CEILING in results else None
    print(f"  {'embedded / ceiling (goal >= 0.5)':38} "
          + (f"{emb / ceiling:10.2f}" if ceiling else "       n/a (no recvmmsg/sendmmsg or no C compiler)"))
    print(f"  {'embedded / Python pipeline':38} {emb / results['embedded, Python pipeline'][0]:10.2f}")
    return {name: r[0] for name, r in results.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=integer(8, MAX_K), nargs="+", default=None,
                    help="elements a frame: one run per K (default: every committed program's K)")
    ap.add_argument("--packets", type=integer(2), default=200000,
                    help="gradient frames per run at K = 32 (fewer at a larger K: the same elements / 8)")
    ap.add_argument("--windows", type=integer(2), nargs="+", default=[16, 64, 4 * BATCH, 16 * BATCH],
                    help="frames in flight: every switch and loop runs at each, its best counts")
    ap.add_argument("--rounds", type=integer(1), default=1,
                    help="run every K this many times in turn and print the median of each round's ratios")
    ap.add_argument("--this-k", action="store_true", help=argparse.SUPPRESS)  # a per-K child
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/softswitch.py needs root (network namespaces)")
        return 1
    if args.this_k:
        print(RESULT + json.dumps(compare_one_k(args)), flush=True)
        return 0
    rounds = []
    for i in range(args.rounds):
        if args.rounds > 1:
            print(f"round {i + 1} of {args.rounds}")
        per_k = run_children(args)
        if not per_k:
            return 1
        print_table(per_k)
        rounds.append(per_k)
    if args.rounds > 1:
        for (what, k), each in per_round_ratios(rounds).items():
            print(f"  {what}, K={k} / K={HARDWARE_K}, median of {len(each)} rounds (goal >= 10 at the default K): "
                  f"{statistics.median(each):.2f} (rounds: {', '.join(f'{x:.2f}' for x in each)})")
    return 0


def run_children(args) -> dict[int, dict[str, float]]:
    """One run per K, each in its own process at MINDP_K=K (its lines printed): K -> packets/s per contender."""
    per_k = {}
    for k in args.k or list(artifacts.COMMITTED_K):
        # The same elements at every K would take a large K's run below a timer's grain: an eighth.
        packets = max(2 * BATCH, args.packets * HARDWARE_K // k if k <= HARDWARE_K else args.packets * HARDWARE_K * 8 // k)
        cmd = [sys.executable, os.path.abspath(__file__), "--this-k", "--packets", str(packets),
               "--windows", *map(str, args.windows)]
        proc = subprocess.run(cmd, env={**os.environ, K_ENV: str(k)}, stdout=subprocess.PIPE, text=True)
        for line in proc.stdout.splitlines():
            if line.startswith(RESULT):
                per_k[k] = json.loads(line[len(RESULT):])
            else:
                print(line)
        if proc.returncode != 0 or k not in per_k:
            print(f"K={k}: the run failed (exit {proc.returncode})")
    return per_k


RATIOS = ((EMBEDDED, "embedded elements/s"), (SWITCH_CPU, "embedded elements a switch CPU-second"))


def ratios(per_k: dict[int, dict[str, float]]) -> dict[tuple[str, int], float]:
    """(what, K) -> the embedded switch's elements/s (or a CPU-second) at K over its K = 32 figure."""
    out = {}
    if HARDWARE_K in per_k:
        for name, what in RATIOS:
            if name not in per_k[HARDWARE_K]:
                continue
            base = per_k[HARDWARE_K][name] * HARDWARE_K
            for k, r in per_k.items():
                if k != HARDWARE_K and name in r:
                    out[what, k] = r[name] * k / base
    return out


def per_round_ratios(rounds: list[dict[int, dict[str, float]]]) -> dict[tuple[str, int], list[float]]:
    """Each ratio of `ratios`, taken within each round in turn (the host's I/O drifts between runs)."""
    out: dict[tuple[str, int], list[float]] = {}
    for per_k in rounds:
        for key, x in ratios(per_k).items():
            out.setdefault(key, []).append(x)
    return out


def print_table(per_k: dict[int, dict[str, float]]) -> None:
    names = [n for n in (EMBEDDED, SWITCH_CPU, "compiled pipeline alone (no I/O)", BMV2, CEILING)
             if any(n in r for r in per_k.values())]
    print("elements/s per K (packets/s x K):")
    print(f"  {'K':>6} " + " ".join(f"{n[:24]:>26}" for n in names))
    for k, r in per_k.items():
        print(f"  {k:>6} " + " ".join(f"{r[n] * k:26,.0f}" if n in r else f"{'n/a':>26}" for n in names))
    for (what, k), x in ratios(per_k).items():
        print(f"  {what}, K={k} / K={HARDWARE_K} (goal >= 10 at the default K): {x:.2f}")


if __name__ == "__main__":
    interrupts.exit_with(main, "bench/softswitch.py")
