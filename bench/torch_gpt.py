"""The cost of the network for PyTorch (issue 13.5), side by side in one run: steps/s of
`make run MODEL=gpt` (2 workers in Mininet hosts, gradients through the switch, AdamW on the
optimizer node) through the embedded switch and through BMv2 (when installed), against the same
model and global batch trained by one process with torch.optim.AdamW, and by PyTorch DDP (gloo,
one process a worker, each in its own network namespace on a veth, the veths on a Linux bridge).

    sudo .venv/bin/python bench/torch_gpt.py [--steps 13] [--workers 2] [--local-steps 12] [--rounds 1]
        [--gpt '{"d": 512, "layers": 8}'] [--node-ram SIZE] [--k K] [--network-cores CPUS | --pin]

Each make run line names the K (elements a frame) it ran: the target's default (make run K=), or
--k's on the embedded switch (a K with no committed program is compiled with p4c first, as make
run K= does: minutes at a large K, once).

Like is compared with like: every side times the steps after its first (warm-up) one, keeps the
memory a step frees for the next (DDP's ranks and the one process as make run's workers), and the
switch run's worker 0 evaluates only the first and the last model (make run EVAL=0; DDP's ranks
and the one process evaluate nothing), and the optimizer node holds its whole state in RAM as
each DDP rank holds its own (make run NODE_RAM=; --node-ram 256M, make run's default, streams a
25M-parameter model's state from disk instead). A switch run's steps/s comes from its metrics.csv (each
step's time on the workers' clocks) and the run must end bit-exact; DDP's is rank 0's, over
--local-steps steps, as the one-process figure.

Under DDP and each switch run, per process and timed step: its CPU ms (utime + stime, every thread;
in brackets the share of the threads mindp names, e.g. a worker's pump thread), its voluntary
context switches (wake-ups), its minor page faults (memory the kernel zeroes for it again each
step) and, for a rank or worker, its forward+backward ms on its own clock (a
worker's `compute`) and their CPU ms in its training thread (`compute_cpu`; the gradient hooks
run in it, their own CPU in brackets: `hooks_cpu`); all CPU but that is the rest of the step: optimizer, communication. On two cores the
sum of CPU is what a step costs, and each round prints DDP's sum over a switch run's: where every
core trains, the ratio of steps/s follows it, with less of the host's drift (a side's CPU a step
moves less than its steps/s). A worker's forward+backward above a rank's is the other processes'
CPU and wake-ups taken from it. A worker's wait for the parameters after its backward is split: the
parameters reach every worker at once, so the step's least wait is the network's round trip after
the last worker's backward, and a worker's wait beyond it is time spent behind a slower worker
(DDP's ranks wait for each other the same way, inside their backward's last allreduce). Each round
also prints the cores' idle time a step (the cores times a step's wall time, less the CPU a step of
all processes, over the steps that CPU was read: a switch run's from its second timed step on, as its
first can be slower): a side's steps/s falls short of its CPU a step by what its cores wait idle.

--rounds N runs every side N times in turn and ends with the median of each round's ratios: the
host's speed drifts from minute to minute, so a ratio is taken within a round, never across.

--network-cores CPUS runs the switch, the optimizer node and make run's orchestrator on those cores
and everything that trains (the workers, DDP's ranks and their gloo threads, the one process) on
the others: the workers' hosts as where the switch is a switch and the node a machine of its own.
Without it every process shares every core, and the network's CPU is taken from training. --pin runs
make run with PIN=1 (worker N on core N, the switch and node on the next, round-robin) and DDP's rank N
on worker N's core; without it make run runs with PIN=0 and DDP's ranks where the kernel puts them:
left to the kernel, the network's CPU lands on one worker's core more than on the other's.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
REPO = pathlib.Path(__file__).resolve().parent.parent

try:
    import torch
except ImportError:
    torch = None

from host_agent import optim, residency, state  # noqa: E402
from host_agent.agent_args import integer, parse_size  # noqa: E402
from mindp import INSTALL_TORCH, heap, procstat, protocol, targets, threadname, workload  # noqa: E402
from mindp.harness import testbed  # noqa: E402
from mindp.harness.run_processes import ROLES, Cores, cpu_list, parse_cpus, pin, proc_usage  # noqa: E402
from mindp.topology import Host  # noqa: E402
from mininet_topos import config, placement  # noqa: E402
from mininet_topos.placement import Placement  # noqa: E402
from p4src import artifacts  # noqa: E402


def trains_as_a_worker() -> None:
    """This process's heap as make run's workers' (mininet_topos/trainer.py, mindp.torch.init): the
    memory a step frees kept for the next (mindp/heap.py), on every side that trains; glibc's default
    gives it back, and the kernel zeroes it again on the next step's first touch."""
    heap.keep_freed()


def single_process(wl: workload.WorkloadConfig, steps: int) -> float:
    """Steps/s of one process: every worker's batch in one forward/backward, torch.optim.AdamW."""
    from mindp.torch import models, tasks

    trains_as_a_worker()
    net = tasks.model(wl)
    torch.set_num_threads(len(os.sched_getaffinity(0)))  # every core it may use, as the switch run's workers
    opt = torch.optim.AdamW(net.parameters(), lr=config.DEFAULT_LR["gpt"], weight_decay=0.01)
    batches = [tasks.batch(wl, w, s) for s in range(steps + 1) for w in range(wl.n_workers)]

    def step(s: int) -> None:
        xs, ys = zip(*batches[s * wl.n_workers:(s + 1) * wl.n_workers])
        opt.zero_grad(set_to_none=True)
        models.loss_of("gpt", net, torch.cat(xs), torch.cat(ys)).backward()
        opt.step()

    step(0)  # warm-up, as a run's first step is not timed apart either way
    t = time.perf_counter()
    for s in range(1, steps + 1):
        step(s)
    return steps / (time.perf_counter() - t)


def ddp_worker(rank: int, world: int, master: str, steps: int, gpt: dict, cpu: int | None = None) -> None:
    """One DDP rank (run in its host's namespace): the model and batches of `make run`'s worker
    `rank`, gradients averaged by gloo over TCP on eth0, torch.optim.AdamW; rank 0 prints steps/s."""
    import datetime

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from mindp.torch import models, tasks

    if cpu is not None:  # --pin: before gloo starts its threads, which follow
        os.sched_setaffinity(0, {cpu})
    trains_as_a_worker()
    os.environ["GLOO_SOCKET_IFNAME"] = "eth0"
    dist.init_process_group("gloo", init_method=f"tcp://{master}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    wl = workload.WorkloadConfig(n_workers=world, model="gpt", model_args=gpt)
    net = DistributedDataParallel(tasks.model(wl))  # one torch thread, as a mindp worker
    opt = torch.optim.AdamW(net.parameters(), lr=config.DEFAULT_LR["gpt"], weight_decay=0.01)

    compute, compute_cpu = [], []

    def step(s: int) -> None:
        x, y = tasks.batch(wl, rank, s)
        opt.zero_grad(set_to_none=True)
        t, cpu = time.perf_counter(), time.thread_time()
        models.loss_of("gpt", net, x, y).backward()  # (gloo's allreduce overlaps the backward)
        compute.append(time.perf_counter() - t)
        compute_cpu.append(time.thread_time() - cpu)
        opt.step()

    step(0)
    dist.barrier()
    compute.clear()
    compute_cpu.clear()
    t, cpu = time.perf_counter(), _cpu_self()
    for s in range(1, steps + 1):
        step(s)
    dist.barrier()
    wall, (busy, wakeups, faults) = time.perf_counter() - t, _minus(_cpu_self(), cpu)
    # steps/s, then this rank's forward+backward (wall), CPU and voluntary context switches a step,
    # its forward+backward's CPU in this thread, and its minor page faults a step
    print(f"{steps / wall:.6f} {sum(compute) / steps:.6f} {busy / steps:.6f} {wakeups / steps:.1f} "
          f"{sum(compute_cpu) / steps:.6f} {faults / steps:.1f}", flush=True)
    dist.destroy_process_group()
    # Out now, past the interpreter's finalization: there a gloo thread still joinable once ended a
    # rank with "terminate called without an active exception" (make bench, 1 Dec), failing the side.
    os._exit(0)


def _cpu_self() -> tuple[float, int, int]:
    """(CPU seconds, voluntary context switches, minor page faults) of this process, all its threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_nvcsw, r.ru_minflt


def _minus(a: tuple, b: tuple) -> tuple:
    return tuple(x - y for x, y in zip(a, b))


@dataclass
class Usage:
    """One process's figures a timed step: CPU ms, voluntary context switches (its wake-ups), and
    for a rank or worker its forward+backward ms (wall, as its own clock saw them) and their CPU ms
    in its training thread, and for a worker the ms it then waited for the step's parameters. Minor
    page faults: memory the kernel zeroed for it, each step (a cost 5a7bc22 found with perf)."""
    role: str
    cpu_ms: float
    wakeups: float
    compute_ms: float | None = None
    wait_ms: float | None = None
    threads: dict[str, float] = field(default_factory=dict)  # CPU ms of its threads mindp names (in cpu_ms)
    compute_cpu_ms: float | None = None
    behind_ms: float | None = None  # of wait_ms, the time behind a slower worker (behind_ms())
    faults: float | None = None
    hooks_cpu_ms: float | None = None  # of compute_cpu_ms, a worker's gradient hooks' own


def _cpu_ms(u: Usage) -> str:
    """'worker 0 274 (pump thread 14)': a process's CPU ms a step, and of the threads mindp names."""
    threads = ", ".join(f"{name.removeprefix(threadname.PREFIX)} thread {ms:.0f}" for name, ms in u.threads.items())
    return f"{u.role} {u.cpu_ms:.0f}" + (f" ({threads})" if threads else "")


def usage_lines(usages: list[Usage]) -> list[str]:
    """CPU ms a step per process (and in all), wake-ups, forward+backward, as printed under a side."""
    if not usages:
        return ["(too few steps for per-process figures)"]
    cpu = ", ".join(_cpu_ms(u) for u in usages)
    wake = ", ".join(f"{u.role} {u.wakeups:.0f}" for u in usages)
    faults = ", ".join(f"{u.role} {u.faults:.0f}" for u in usages if u.faults is not None)
    fb = ", ".join(f"{u.role} {u.compute_ms:.0f}" for u in usages if u.compute_ms is not None)
    waits = ", ".join(f"{u.role} {u.wait_ms:.0f}" for u in usages if u.wait_ms is not None)
    behind = ", ".join(f"{u.role} {u.behind_ms:.0f}" for u in usages if u.behind_ms is not None)
    model = [u.compute_cpu_ms for u in usages if u.compute_cpu_ms is not None]
    fb_cpu = ", ".join(f"{u.role} {u.compute_cpu_ms:.0f}" + (f" (hooks {u.hooks_cpu_ms:.0f})" if u.hooks_cpu_ms is not None
                                                            else "") for u in usages if u.compute_cpu_ms is not None)
    rest = sum(u.cpu_ms for u in usages) - sum(model)
    return [f"CPU ms a step: {cpu}; all {sum(u.cpu_ms for u in usages):.0f}",
            f"voluntary context switches a step: {wake}",
            *([f"minor page faults a step: {faults}"] if faults else []), f"forward+backward ms (wall): {fb}",
            *([f"forward+backward CPU ms (training thread, gradient hooks in): {fb_cpu}; all the rest {rest:.0f} "
               "(optimizer, communication: every other thread and process)"] if model else []),
            *([f"then waiting for the parameters, ms (wall): {waits}"] if waits else []),
            *([f"of which waiting for a worker still in backward: {behind} (the rest: the round trip of the "
               "step's last gradients, after the last worker's backward)"] if behind else [])]


def ddp_run(workers: int, steps: int, gpt: str, pinned: bool = False) -> tuple[float, str, list[Usage]]:
    """(steps/s, '' or why it failed, each rank's Usage) of DDP with `workers` ranks on veth hosts
    joined by a bridge; `pinned` (--pin): rank N on worker N's core."""
    bridge = "tgbr"
    hosts = [Host(f"d{r}", f"02:00:00:00:07:{r + 1:02x}", f"10.0.7.{r + 1}", r + 1) for r in range(workers)]
    master = f"{hosts[0].ip}:{targets.free_port()}"
    testbed.sh("ip", "link", "del", bridge, check=False)
    try:
        with testbed.Testbed("tg") as bed:
            testbed.sh("ip", "link", "add", bridge, "type", "bridge")
            for h in hosts:
                nh = bed.add(h)
                testbed.sh("ip", "link", "set", nh.switch_iface, "master", bridge)
            testbed.quiet_link(bridge)
            procs = [bed.hosts[h.name].popen(sys.executable, str(pathlib.Path(__file__).resolve()), "--ddp-rank", str(r), "--workers", str(workers),
                                             "--ddp-master", master, "--local-steps", str(steps), "--gpt", gpt,
                                             *(["--pin"] if pinned else []),
                                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for r, h in enumerate(hosts)]
            try:
                outs = [p.communicate(timeout=600) for p in procs]
            except (subprocess.TimeoutExpired, KeyboardInterrupt) as exc:
                for p in procs:
                    p.kill()
                    p.wait()
                if isinstance(exc, KeyboardInterrupt):
                    raise
                return 0.0, "no result within 600 s", []
    finally:
        testbed.sh("ip", "link", "del", bridge, check=False)
    for p, (_, err) in zip(procs, outs):
        if p.returncode:
            return 0.0, (err.strip().splitlines() or [f"exit {p.returncode}"])[-1], []
    figures = [[float(x) for x in out.split()[-6:]] for out, _ in outs]
    ranks = [Usage(f"rank {r}", f[2] * 1e3, f[3], f[1] * 1e3, compute_cpu_ms=f[4] * 1e3, faults=f[5])
             for r, f in enumerate(figures)]
    return figures[0][0], "", ranks


class Sampler(threading.Thread):
    """Each process's CPU time and wake-ups when worker 0 logs its step 1 and each later step but
    the run's last (its log polled every 20 ms; /proc read only then): the figures a step between
    the first and the last of those. Worker 0 logs the last step only once it has evaluated the
    last model, and the other workers end meanwhile: neither is a step's cost."""

    def __init__(self, root: int, runs: pathlib.Path, steps: int, cores: Cores | None = None):
        """cores: where make run's processes run (--network-cores): each is pinned from its start
        until the first timed step; None leaves them where make run puts them (PIN=)."""
        super().__init__(daemon=True)
        self.root, self.runs, self.cores = root, runs, cores
        self.last = steps - 1  # the run's last step (from 0)
        self.done = threading.Event()
        self.snaps: list[tuple[int, dict]] = []  # (worker 0's step, each process's figures then)
        self._step_ms: float | None = None  # usages()'s: step_ms()

    def run(self) -> None:
        if isinstance(self.cores, Cores):  # this thread's reading costs the network's cores, not training's
            os.sched_setaffinity(0, self.cores.network)
        log, pos, step = None, 0, 0
        while not self.done.wait(0.02):
            if log is None:
                log = next(self.runs.glob("2*/logs/worker-job1-0.log"), None)
                continue
            with open(log) as f:
                f.seek(pos)
                lines = f.readlines()
                pos = f.tell() if lines and lines[-1].endswith("\n") else pos
            for line in lines if pos else []:
                try:
                    j = json.loads(line)
                except ValueError:
                    continue
                step = max(step, j.get("step", -1) if j.get("ev") == "step" else -1)
            if self.cores and (step < 1 or not self.snaps):
                self.cores.place(self.root)
            if self.sampled(step):
                # The first snapshot's processes are the run's from then on: a scan of all of /proc
                # a step would cost a core a per cent at 1.3M parameters.
                pids = list(self.snaps[0][1]) if self.snaps else procstat.tree(self.root)
                self.snaps.append((step, {pid: u for pid in pids if (u := proc_usage(pid)) is not None}))

    def sampled(self, step: int) -> bool:
        """Whether worker 0's newest logged step `step` is sampled now."""
        return 1 <= step < self.last and (not self.snaps or step > self.snaps[-1][0])

    def usages(self) -> list[Usage]:
        """Per process, its figures a step between the first and the last snapshot (with each
        worker's mean forward+backward over those steps from its log); [] if too few steps."""
        if len(self.snaps) < 2:
            return []
        # The last snapshot every process of the first is still in: the other workers may have
        # ended while worker 0 still evaluated its last model (at 25M parameters, seconds).
        (s0, a), (s1, b) = self.snaps[0], next((x for x in reversed(self.snaps[1:]) if set(self.snaps[0][1]) <= set(x[1])),
                                               self.snaps[-1])
        n = s1 - s0
        logs = {}

        def mean_ms(steps: list[dict], key: str) -> float | None:
            xs = [j[key] for j in steps if key in j]
            return sum(xs) / len(xs) * 1e3 if xs else None

        waits = {}
        for path in self.runs.glob("2*/logs/worker-job1-*.log"):
            lines = [json.loads(x) for x in path.read_text().splitlines() if x.startswith("{")]
            steps = [j for j in lines if j.get("ev") == "step" and s0 < j["step"] <= s1]  # the sampled steps' lines
            worker = int(path.stem.rsplit("-", 1)[1])
            if worker == 0:
                t = {j["step"]: j["t"] for j in lines if j.get("ev") == "step" and "t" in j}
                self._step_ms = (t[s1] - t[s0]) / n * 1e3 if s0 in t and s1 in t else None
            logs[worker] = (mean_ms(steps, "compute"), mean_ms(steps, "wait"), mean_ms(steps, "compute_cpu"),
                            mean_ms(steps, "hooks_cpu"))
            waits[worker] = {j["step"]: j["wait"] for j in steps if "wait" in j}
        behind = behind_ms(waits)
        order = [r for _, r in ROLES]

        def rank(pid: int) -> tuple[int, int]:
            role = b[pid][0].split()
            return order.index(role[0]), int(role[1]) if len(role) > 1 else 0

        out = []
        for pid in sorted(set(a) & set(b), key=rank):
            label, cpu, vol, named, faults = b[pid]
            compute, wait, compute_cpu, hooks_cpu = logs.get(int(label.split()[1]), (None,) * 4) \
                if label.startswith("worker ") else (None,) * 4
            threads = {name: (sec - a[pid][3].get(name, 0.0)) / n * 1e3 for name, sec in sorted(named.items())}
            out.append(Usage(label, (cpu - a[pid][1]) / n * 1e3, (vol - a[pid][2]) / n, compute, wait, threads,
                             compute_cpu, behind.get(int(label.split()[1])) if label.startswith("worker ") else None,
                             (faults - a[pid][4]) / n, hooks_cpu))
        return out

    def step_ms(self) -> float | None:
        """Worker 0's wall ms a step over the steps usages() took their CPU from (its step lines'
        times, read in the same pass), None before: the span an idle time is taken over, as a side's
        steps/s takes other steps (the first timed step of a short run ran up to a second slower
        than the rest at 25M)."""
        return self._step_ms


def behind_ms(waits: dict[int, dict[int, float]]) -> dict[int, float]:
    """Per worker, its mean wait for the parameters (seconds, by step) beyond the least wait of the
    same step, in ms, over the steps every worker logged; {} with fewer than two workers. The
    parameters reach every worker at once (multicast): the worker that ended backward last waits
    least, the network's round trip of the step's last gradients; the others wait for its gradients."""
    steps = set.intersection(*(set(w) for w in waits.values())) if len(waits) > 1 else set()
    if not steps:
        return {}
    least = {s: min(w[s] for w in waits.values()) for s in steps}
    return {worker: sum(w[s] - least[s] for s in steps) / len(steps) * 1e3 for worker, w in waits.items()}


def state_in_ram(wl: workload.WorkloadConfig) -> int:
    """The node's RAM budget that holds its whole AdamW state (as each DDP rank holds its own)."""
    n_chunks = optim.layout_of(workload.init_params(wl)).n_chunks
    return residency.mapped_budget(state.new_state_workload(n_chunks, 3))


def switch_run(target: str, workers: int, steps: int, tmp: pathlib.Path, gpt: str, node_ram: int, sync: str,
               cores: Cores | Placement | None = None,
               timeout: float = 3600) -> tuple[float, str, int, list[Usage], float | None]:
    """(steps/s, '' or why it failed, the run's K, each process's Usage, the wall ms a step over the
    steps those were sampled over (Sampler.step_ms)) of make run's orchestrator,
    MODEL=gpt, on `target`, its node's RAM budget `node_ram` bytes and commits made durable as
    `sync` says: BMv2 at its default K, the embedded switch at this process's (MINDP_K, as --k sets
    it, else the default)."""
    runs = tmp / target
    k = protocol.HARDWARE_K if target == "bmv2" else protocol.K
    p4 = "committed" if artifacts.staleness(k=k) is None else "auto"
    cmd = [sys.executable, "-m", "mininet_topos.run", "--target", target, "--model", "gpt",
           "--workers", str(workers), "--steps", str(steps), "--cli", "0", "--p4", p4,
           "--runs-dir", str(runs), "--state-file", str(tmp / f"{target}-state.json"),
           "--grpc-port", str(targets.free_port()), "--thrift-port", str(targets.free_port()),
           "--if-prefix", "mnb-", "--eval", "0", "--node-ram", str(node_ram), "--sync", sync, "--k", str(k),
           "--pin", "1" if isinstance(cores, Placement) else "0"] + \
        (["--gpt", gpt] if gpt != "{}" else [])
    p = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    sampler = Sampler(p.pid, runs, steps, cores if isinstance(cores, Cores) else None)
    sampler.start()
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.terminate()  # make run tears down what it started on SIGTERM
        p.communicate()
        return 0.0, f"no result within {timeout:.0f} s", k, [], None
    except KeyboardInterrupt:  # make run had the terminal's Ctrl-C too: it tears down, then ends
        p.terminate()
        p.communicate()
        raise
    finally:
        sampler.done.set()
        sampler.join()
    try:
        s = json.loads(next(runs.glob("2*/summary.json")).read_text()) if p.returncode == 0 else None
    except (StopIteration, OSError, ValueError):
        s = None
    if s is None or "max_abs_param_diff_vs_reference" not in s:  # failed, or stopped: no result
        return 0.0, (err.strip().splitlines() or [f"exit {p.returncode}"])[-1], k, [], None
    if s["max_abs_param_diff_vs_reference"] != 0.0:
        return 0.0, f"not bit-exact ({s['max_abs_param_diff_vs_reference']})", k, [], None
    with open(next(runs.glob("2*/metrics.csv"))) as f:
        timed = [float(r["step_seconds"]) for r in csv.DictReader(f) if int(r["step"]) >= 1]
    usages = sampler.usages()
    return len(timed) / sum(timed), "", k, usages, sampler.step_ms()


def idle_ms(step_ms: float, cpu_ms: float, cores: int) -> float:
    """The cores' idle ms a step: `cores` times a step's wall ms less the CPU ms a step of all
    processes, both over the same steps; 0 where that CPU exceeds it (the wall is worker 0's, the
    CPU read within 20 ms of it)."""
    return max(0.0, cores * step_ms - cpu_ms)


@dataclass
class Round:
    """One round's figures by side ("one process", "DDP", each switch run's label): steps/s, and
    CPU ms a step of all its processes where they were sampled, with a step's wall ms over the same steps."""

    rates: dict[str, float] = field(default_factory=dict)
    cpu_ms: dict[str, float] = field(default_factory=dict)
    wall_ms: dict[str, float] = field(default_factory=dict)  # a step's wall ms over the steps cpu_ms is of


def side_order(round_index: int, sides: list[str]) -> list[str]:
    """The order a round runs its sides in: as listed in even rounds, reversed in odd ones, so a
    host that speeds up or slows down over minutes favours no side (each round's ratios are taken
    within it, and a drift's share of them changes sign from one round to the next)."""
    return list(sides) if round_index % 2 == 0 else list(reversed(sides))


def one_round(args, gpt: dict, base_steps: int, tmp: pathlib.Path, index: int = 0) -> Round | None:
    """One round, its sides in side_order, each side's lines printed as it ends and its ratios at
    the round's end, or None when a side failed (said in its line)."""
    wl = workload.WorkloadConfig(n_workers=args.workers, model="gpt", model_args=gpt)
    if os.geteuid() != 0:
        base = single_process(wl, base_steps)
        print(f"  {'one process, torch.optim.AdamW':<34} {base:8.3f} steps/s  (torch threads {torch.get_num_threads()})")
        return Round({"one process": base})
    tmp.mkdir(parents=True, exist_ok=True)
    switch_targets = [t for t in ("embedded", "bmv2") if t in args.targets.split(",")]
    fig = Round()
    rates, cpu_ms, wall_ms = fig.rates, fig.cpu_ms, fig.wall_ms
    order = side_order(index, ["one process", "DDP", *switch_targets])
    for side in order:
        if side == "one process":
            rates[side] = single_process(wl, base_steps)
            print(f"  {'one process, torch.optim.AdamW':<34} {rates[side]:8.3f} steps/s  "
                  f"(torch threads {torch.get_num_threads()})")
            continue
        if side == "DDP":
            ddp, err, usages = ddp_run(args.workers, args.local_steps, args.gpt, isinstance(args.cores, Placement))
            step_ms = None  # its ranks time their CPU over their timed steps: 1 / steps/s is their span's
            label = f"PyTorch DDP (gloo), {args.workers} namespaces"
        else:
            label = f"make run MODEL=gpt TARGET={side}"
            if side == "bmv2" and targets.find_bmv2() is None:
                print(f"  {label:<34} skipped: BMv2 simple_switch_grpc not installed")
                continue
            rate, err, k, usages, step_ms = switch_run(side, args.workers, args.steps, tmp, args.gpt, args.node_ram,
                                                       args.sync, args.cores)
            label += f" K={k}"
        if err:
            print(f"  {label:<34} failed: {err}")
            return None
        key = "DDP" if side == "DDP" else label
        rates[key] = ddp if side == "DDP" else rate
        if usages:
            # Pinned (--network-cores), the training cores' CPU: the switch's and node's is not taken from it.
            cpu_ms[key] = sum(u.cpu_ms for u in usages if not isinstance(args.cores, Cores)
                              or u.role.split()[0] in ("rank", "worker"))
            wall_ms[key] = step_ms or 1000.0 / rates[key]  # (a switch run's CPU is read over fewer steps: Sampler)
        print(f"  {label:<34} {rates[key]:8.3f} steps/s" + ("" if side == "DDP" else " (bit-exact)"))
        for line in usage_lines(usages):
            print(f"      {line}")
    base, ddp = rates["one process"], rates["DDP"]
    print(f"  ratios (order {', '.join(order)}): DDP {ddp / base:.3f} "
          f"of one process" + "".join(f"; {s.removeprefix('make run ')}: {r / base:.3f} of one process, mindp / DDP "
                                      f"{r / ddp:.3f}" for s, r in rates.items() if s.startswith("make run")))
    if "DDP" in cpu_ms:
        cpus = [(s.removeprefix("make run "), ms) for s, ms in cpu_ms.items() if s.startswith("make run")]
        where = "the training cores" if (split := isinstance(args.cores, Cores)) else "all processes"
        print(f"  CPU a step, {where}: DDP {cpu_ms['DDP']:.0f} ms" + "".join(
            f"; {s} {ms:.0f} ms, DDP / mindp {cpu_ms['DDP'] / ms:.3f}" for s, ms in cpus) +
            (" (steps/s follows it where the training cores never wait for the network)" if split else
             " (with every core training, steps/s follows this ratio less the idle time below)"))
        cores = len(args.cores.training if split else os.sched_getaffinity(0))
        print(f"  idle a step, {cores} {'training ' if split else ''}cores (over the steps its CPU was read): DDP "
              f"{idle_ms(wall_ms['DDP'], cpu_ms['DDP'], cores):.0f} ms" +
              "".join(f"; {s} {idle_ms(wall_ms['make run ' + s], ms, cores):.0f} ms" for s, ms in cpus))
    return fig


def summary_lines(rounds: list[Round]) -> list[str]:
    """Per switch run, the median over rounds of its ratios to DDP and to one process, each taken
    within its round, and every round's pair: what to quote, the spread beside it; and where every
    round has both sides' CPU a step, the median of DDP's over the run's."""
    out = []
    for side in [s for s in rounds[0].rates if s.startswith("make run")]:
        vs_ddp = [r.rates[side] / r.rates["DDP"] for r in rounds]
        vs_one = [r.rates[side] / r.rates["one process"] for r in rounds]
        pairs = ", ".join(f"{a:.3f}/{b:.3f}" for a, b in zip(vs_ddp, vs_one))
        cpu = [r.cpu_ms["DDP"] / r.cpu_ms[side] for r in rounds if "DDP" in r.cpu_ms and side in r.cpu_ms]
        out.append(f"{side}: median mindp / DDP {statistics.median(vs_ddp):.3f}, of one process "
                   f"{statistics.median(vs_one):.3f} (rounds: {pairs})" +
                   (f"; CPU a step, DDP / mindp {statistics.median(cpu):.3f}" if len(cpu) == len(rounds) else ""))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=integer(2), default=13, help="steps of each switch run (the first is not timed)")
    ap.add_argument("--workers", type=integer(1), default=2)
    ap.add_argument("--local-steps", type=integer(1), default=12, help="timed steps of one process and of DDP")
    ap.add_argument("--rounds", type=integer(1), default=1, help="run every side this many times in turn and print "
                    "the median of each round's ratios (the host's speed drifts between minutes)")
    ap.add_argument("--ddp-rank", type=int, help=argparse.SUPPRESS)  # a DDP worker, started by ddp_run
    ap.add_argument("--ddp-master", help=argparse.SUPPRESS)
    ap.add_argument("--targets", default="embedded,bmv2", help="switch targets to run, comma-separated (BMv2 at "
                    "K = 32 takes minutes a step for a model of millions of parameters)")
    ap.add_argument("--node-ram", type=parse_size, help="the optimizer node's RAM budget (default: one holding its "
                    "whole state, as each DDP rank holds its own; 256M, make run's default, streams a large "
                    "model's state from disk)")
    ap.add_argument("--sync", choices=state.SYNC_MODES, default="exit",
                    help="when the node makes a committed step durable (make run's SYNC=): exit, as DDP, which "
                         "persists nothing each step; step, make run's default, msync and fsync at every commit")
    ap.add_argument("--gpt", default="{}", help="the gpt's size as JSON, as make run's GPT=, e.g. '{\"d\": 512, \"layers\": 8}'")
    ap.add_argument("--k", type=integer(8, protocol.MAX_K), help=f"elements a frame on the embedded switch (default: "
                    f"its default, {protocol.DEFAULT_K}; BMv2 runs {protocol.HARDWARE_K}); a K with no committed program "
                    "is compiled with p4c first, as make run K= does")
    ap.add_argument("--network-cores", metavar="CPUS", help="run the switch, the optimizer node and make run's "
                    "orchestrator on these cores (e.g. 1, or 2-3) and every side's training on the others, as where "
                    "the switch and the node are machines of their own (default: every process on every core)")
    ap.add_argument("--pin", action="store_true", help="worker and rank N on core N, then the switch and node")
    args = ap.parse_args()
    if args.k is not None and (error := protocol.k_error(str(args.k))) is not None:  # as every process of the run
        print(f"torch_gpt: --k {args.k}: {error}")
        return 2
    if args.k is not None and args.k != protocol.K:  # this process's K too: the node's budget is in chunks of K
        os.execve(sys.executable, [sys.executable, __file__, *sys.argv[1:]], {**os.environ, protocol.K_ENV: str(args.k)})
    args.cores = None
    if args.network_cores is not None:
        mine = os.sched_getaffinity(0)
        try:
            network = parse_cpus(args.network_cores)
        except ValueError:
            network = set()
        if not network or not network < mine:
            print(f"torch_gpt: --network-cores {args.network_cores!r}: give some, not all, of the cores this process "
                  f"may use ({cpu_list(mine)})")
            return 2
        args.cores = Cores(mine - network, network)
        pin(os.getpid(), args.cores.training)  # what this process starts trains there: DDP's ranks, the one process
    if args.pin:
        if args.cores:
            print("torch_gpt: --pin and --network-cores: choose one placement")
            return 2
        args.cores = placement.plan("1", os.sched_getaffinity(0), args.workers, 1, 1)  # make run's PIN=1
    unknown = set(args.targets.split(",")) - {"embedded", "bmv2"}
    if unknown:
        print(f"torch_gpt: --targets {args.targets!r}: choose from embedded, bmv2")
        return 2
    if torch is None:
        print(f"torch_gpt: skipped: torch is not installed: {INSTALL_TORCH}")
        return 0
    try:
        gpt = config.gpt_sizes(args.gpt, "gpt")  # make run's GPT= checks: the same sizes run on every side
    except config.RunConfigError as exc:
        print(f"torch_gpt: --gpt: {exc}")
        return 2
    if args.ddp_rank is not None:
        ddp_worker(args.ddp_rank, args.workers, args.ddp_master, args.local_steps, gpt,
                   args.cores.worker(args.ddp_rank) if args.pin else None)
        return 0
    wl = workload.WorkloadConfig(n_workers=args.workers, model="gpt", model_args=gpt)
    whole = state_in_ram(wl)
    args.node_ram = whole if args.node_ram is None else args.node_ram
    rounds = []
    # Made before the first line: a Ctrl-C once the run has said what it trains finds the directory
    # under `with` (tempfile's first use, and mkdtemp, left a file or a directory when it came between).
    with tempfile.TemporaryDirectory(prefix="mindp-bench-gpt-") as tmp:
        print(f"{workload.describe(wl, workload.init_params(wl))}, {args.workers} workers x {wl.batch} examples, AdamW lr "
              f"{config.DEFAULT_LR['gpt']}, {args.steps} steps; the node's RAM budget {args.node_ram / 2**20:,.0f} MiB "
              f"({'its whole state' if args.node_ram >= whole else 'out of core'}), made durable "
              f"{'at every step' if args.sync == 'step' else 'at exit (--sync exit)'}" +
              (f"; {args.cores.describe()}" if isinstance(args.cores, Cores) else "") +
              (f"; pinned (make run PIN=1, DDP's rank N as worker N): {args.cores.describe()}" if args.pin else ""))
        for i in range(args.rounds):
            if args.rounds > 1:
                print(f" round {i + 1} of {args.rounds}")
            fig = one_round(args, gpt, args.local_steps, pathlib.Path(tmp) / f"round{i}", i)
            if fig is None:
                return 1
            rounds.append(fig)
    if os.geteuid() != 0:
        print("  through the network: skipped (namespaces and make run need root)")
    elif args.rounds > 1:
        for line in summary_lines(rounds):
            print(f"  {line}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # what was started is ended above (testbed, make run, DDP's ranks)
        print("torch_gpt: interrupted", file=sys.stderr)
        sys.exit(130)
