"""make stress: bit-exact training scenarios, again and again, with random seeds, faults and
contention, until MINUTES are over; every divergence is kept with the one command that replays it.

    sudo python -m tools.stress --minutes 30 [--seed S] [--families loopback,embedded] [--out DIR]
    sudo python -m tools.stress --replay DIR/config.json          # one scenario again

A scenario trains a small model with mindp-worker processes (synthetic gradients, resume files,
the step digest checked) and the mindp-optimizer node, in namespaces on veths, through
- `loopback`: the in-test aggregator (tests/host_agent/aggregator.py: exact sums, its own seeded
  loss, duplicates, reordering), or
- `threads`: the same aggregator with the workers as threads of the scenario's process, as the
  tests run them (tests/host_agent/harness.py: one GIL for all workers and the aggregator), or
- `embedded`: the embedded switch configured by the controller (its own loss, duplicates and
  reordering; it may be killed and restored mid-run),
or `makerun`: `make run` itself (mininet_topos.run under `flock /tmp/mindp-run.lock`: the mlp or
the cnn, 1 or 2 jobs, a star or a leaf-spine with 1 or 2 optimizer shards, LOSS; per-port pcaps),
with the agents' own seeded loss (send and receive) and the node's duplicates and reordering,
busy loops beside it, SIGSTOP/SIGCONT of the node, a worker or the switch for up to seconds, and
SIGKILL and restart of the node or a worker (each resumes from its state). At the end every
worker's parameters and the node's master must equal the reference trainer's bit for bit, and no
worker's step digest may have differed (a divergence the digest caught and repaired is one too).

Each scenario runs in its own process (`--replay`); one that diverges or fails keeps its directory
(config.json, the agents' logs and stats, a pcap per switch port, verdict.json) and the command
replaying it is printed. Timed faults replay at the same moments, not the same packet order. The
last line reads `<n> scenarios, <m> divergences`. Exit 0 when there is none.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from host_agent import reference
from host_agent.pipeline import record
from host_agent.agent_args import integer
from host_agent.optim import OptimizerConfig
from mindp import progress, testbed
from mindp.protocol import K
from mindp.topology import star
from tools.soak import Agent

FAMILIES = ("loopback", "threads", "embedded", "makerun")
#: Families of the loop by default (makerun waits for the machine's one Mininet run at a time).
DEFAULT_FAMILIES = FAMILIES
#: Exit codes of one scenario.
EXACT, DIVERGED, FAILED, SKIPPED = 0, 1, 2, 75  # SKIPPED: make run's lock stayed busy
#: Seconds a makerun scenario waits for the machine's Mininet lock before it is skipped.
LOCK_WAIT = 600
#: A scenario that takes longer than this (seconds) is stopped and counted as failed.
SCENARIO_CAP = 900
#: The node's linger: longer than a stopped worker's hold (2.5 s at most) plus its largest RTO, so
#: that a worker whose last parameters were lost is still answered.
LINGER = 8.0
#: A worker's step deadline: far beyond any fault's hold; a scenario that hangs fails by it.
DEADLINE = 120.0


@dataclass
class Event:
    """At `at` seconds after the workers started: `action` ("stop": SIGSTOP, SIGCONT after `hold`
    s; "starve": a CPU quota of 10 % for `hold` s; "kill": SIGKILL, restarted after `hold` s) on
    `target` ("node", "worker<w>", "switch")."""

    at: float
    action: str
    target: str
    hold: float


@dataclass
class Config:
    family: str
    seed: int
    workers: int = 3
    steps: int = 5
    slots: int = 8
    agent_loss: float = 0.0  # each agent's loss on send and receive
    node_dup: float = 0.0
    node_reorder: float = 0.0
    fabric_drop: float = 0.0  # the aggregator's or the switch's
    fabric_dup: float = 0.0
    fabric_reorder: float = 0.0
    busy_loops: int = 0
    stall_resend: float = 1.0
    streamed: bool = False  # the node's state streamed through a small RAM budget (pages), not mapped whole
    model: str = "mlp"  # makerun: MODEL, JOBS, TOPO (leafspine: 2 leaves), OPTIMIZERS
    jobs: int = 1
    topo: str = "star"
    optimizers: int = 1
    events: list[Event] = field(default_factory=list)

    @classmethod
    def load(cls, path: pathlib.Path) -> Config:
        d = json.loads(path.read_text())
        d["events"] = [Event(**e) for e in d.get("events", [])]
        return cls(**d)

    def dump(self, path: pathlib.Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")


def random_config(rng: random.Random, family: str) -> Config:
    """A scenario: sizes, loss rates (none half the time: the divergence of issue 44 had none),
    contention and timed faults."""
    def rate(most: float) -> float:
        return round(rng.choice([0.0, 0.0, rng.uniform(0, most)]), 3)

    cfg = Config(family, rng.randrange(1 << 30), workers=rng.randint(2, 4), steps=rng.randint(3, 8),
                 slots=rng.choice([4, 8, 64]), agent_loss=rate(0.05), node_dup=rate(0.05), node_reorder=rate(0.05),
                 fabric_drop=rate(0.05), fabric_dup=rate(0.05), fabric_reorder=rate(0.05),
                 busy_loops=rng.choice([0, 0, 1, 2]), stall_resend=rng.choice([0.2, 0.5, 1.0]),
                 streamed=rng.random() < 0.3)
    targets = ["node"] + ([f"worker{w}" for w in range(cfg.workers)] if family != "threads" else []) \
        + (["switch"] if family == "embedded" else [])
    for _ in range(rng.choice([0, 0, 1, 2, 3])):
        action = rng.choice(["stop", "stop", "starve", "kill"])
        cfg.events.append(Event(round(rng.uniform(0.2, 4.0), 2), action, rng.choice(targets),
                                round(rng.uniform(0.05, 0.5 if action == "kill" else 2.5), 2)))
    cfg.events.sort(key=lambda e: e.at)
    if family == "makerun":  # make run's own faults: LOSS on every host; no timed events
        cfg.events, cfg.streamed = [], False
        cfg.model, cfg.topo = rng.choice(["mlp", "mlp", "cnn"]), rng.choice(["star", "leafspine"])
        # a leaf-spine runs one job, with 1 or 2 optimizer shards; a star 1 or 2 jobs, one node each
        cfg.jobs = 1 if cfg.topo == "leafspine" else rng.choice([1, 2])
        cfg.optimizers = rng.choice([1, 2]) if cfg.topo == "leafspine" else 1
        cfg.steps = rng.randint(4, 12)
    return cfg


# --- one scenario --------------------------------------------------------------------------

def scenario_model(seed: int, chunks: int) -> dict[str, np.ndarray]:
    """A small model of about `chunks` chunks of this process's K."""
    rng = np.random.default_rng(seed)
    return {"embed": rng.standard_normal((40, 17)).astype(np.float32) * 0.1,
            "w": rng.standard_normal((max(1, (chunks * K - 693) // 21), 21)).astype(np.float32) * 0.1,
            "b": np.zeros(13, np.float32)}


#: streamed: a model of 8 pages of 32 chunks through a RAM budget of 6 pages; else 44 chunks, mapped whole.
STREAMED_CHUNKS, MAPPED_CHUNKS, PAGE_CHUNKS, BUDGET_PAGES = 8 * 32 - 16, 44, 32, 6


class Scenario:
    def __init__(self, cfg: Config, work: pathlib.Path):
        self.cfg = cfg
        self.work = work
        self.rng = random.Random(cfg.seed)
        self.topo = star([cfg.workers], slots=cfg.slots)
        self.init = scenario_model(cfg.seed % 1000, STREAMED_CHUNKS if cfg.streamed else MAPPED_CHUNKS)
        self.grad_seed = cfg.seed % 997
        self.procs: dict[str, Agent] = {}
        self.busy: list[subprocess.Popen] = []
        self.pcaps: list[subprocess.Popen] = []
        self.fabric = None
        self.faults: list[str] = []

    def _agents(self, bed) -> None:
        c, w = self.cfg, self.work
        topo_path, init_path = w / "topo.json", w / "init.npz"
        self.topo.dump(topo_path)
        np.savez(init_path, **self.init)
        job = self.topo.jobs[0]

        def loss() -> list[str]:
            return ["--drop-send", str(c.agent_loss), "--drop-recv", str(c.agent_loss),
                    "--fault-seed", str(self.rng.randrange(1 << 30))] if c.agent_loss else []

        self.procs["node"] = Agent("node", bed.hosts[job.optimizer], [
            "-m", "host_agent.node", "--iface", "eth0", "--topology", str(topo_path), "--job", "1",
            "--state-dir", str(w / "state"), "--init", str(init_path), "--steps", str(c.steps),
            "--ram-budget", str(BUDGET_PAGES * PAGE_CHUNKS * record(3).itemsize) if c.streamed else "1G",
            "--page-chunks", str(PAGE_CHUNKS), "--export", str(w / "final.npz"), "--stats", str(w / "node-stats.json"),
            "--linger", str(LINGER), "--idle-timeout", str(progress.CAP), "--stall-resend", str(c.stall_resend), *loss(),
            *(["--dup-send", str(c.node_dup)] if c.node_dup else []),
            *(["--reorder-send", str(c.node_reorder)] if c.node_reorder else [])], w / "node.log")
        for i, name in job.workers.items():
            self.procs[f"worker{i}"] = Agent(f"worker{i}", bed.hosts[name], [
                "-m", "host_agent.worker", "--topology", str(topo_path), "--job", "1", "--worker", str(i),
                "--init", str(init_path), "--grad-seed", str(self.grad_seed), "--steps", str(c.steps),
                "--resume", str(w / f"w{i}.resume"), "--out", str(w / f"w{i}.npz"), "--stats", str(w / f"w{i}.json"),
                "--deadline", str(DEADLINE), *loss()], w / f"w{i}.log")

    def _fabric(self, bed):
        from tests.host_agent.aggregator import Aggregator
        from tests.host_agent.harness import AgentFabric

        c = self.cfg
        job = self.topo.jobs[0]
        if c.family in ("loopback", "threads"):
            return Aggregator(1, {i: self.topo.host(n) for i, n in job.workers.items()}, self.topo.host(job.optimizer),
                              bed.ports(), drop=c.fabric_drop, dup=c.fabric_dup, reorder=c.fabric_reorder,
                              seed=c.seed)
        faults = ["--drop-prob", str(c.fabric_drop), "--dup-prob", str(c.fabric_dup),
                  "--reorder-prob", str(c.fabric_reorder), "--seed", str(c.seed)]
        return AgentFabric("embedded", (bed, self.topo), self.work, switch_faults=faults)

    def _event(self, e: Event) -> None:
        if e.target == "switch":
            if e.action == "kill":
                self.fabric.restart(e.hold)
            else:
                (self._signal if e.action == "stop" else starve)(self.fabric.switch.proc.pid, e.hold)
            self.faults.append(f"{e.action} switch at {e.at} s for {e.hold} s")
            return
        agent = self.procs[e.target]
        if agent.proc is None or agent.proc.poll() is not None:
            return
        if e.action == "kill":
            agent.kill()
            time.sleep(e.hold)
            agent.restart()
        else:
            (self._signal if e.action == "stop" else starve)(agent.proc.pid, e.hold)
        self.faults.append(f"{e.action} {e.target} at {e.at} s for {e.hold} s")

    @staticmethod
    def _signal(pid: int, hold: float) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
            time.sleep(hold)
            os.kill(pid, signal.SIGCONT)

    def _events(self, t0: float, stop: threading.Event) -> None:
        for e in self.cfg.events:
            if stop.wait(max(0.0, t0 + e.at - time.monotonic())):
                return
            try:
                self._event(e)
            except Exception as exc:  # a fault that could not be injected is reported, not fatal
                self.faults.append(f"{e.action} {e.target}: not injected ({exc})")

    def _capture(self, bed) -> None:
        for port, iface in bed.ports().items():
            with open(os.devnull, "wb") as null:
                self.pcaps.append(subprocess.Popen(["tcpdump", "-i", iface, "-w", str(self.work / f"port{port}.pcap"),
                                                    "-U"], stdout=null, stderr=null))

    def make_run(self) -> dict:
        """`make run` with the configuration's variables; its own summary says whether it is exact."""
        c, w = self.cfg, self.work
        cmd = ["flock", "-w", str(LOCK_WAIT), "-E", str(SKIPPED), "/tmp/mindp-run.lock", sys.executable, "-m",
               "mininet_topos.run", "--target", "embedded", "--model", c.model, "--workers", str(c.workers),
               "--steps", str(c.steps), "--loss", str(c.agent_loss), "--jobs", str(c.jobs), "--seed", str(c.seed % 1000),
               "--pcap", "1", "--cli", "0", "--topo", c.topo, "--optimizers", str(c.optimizers),
               *(["--leaves", "2"] if c.topo == "leafspine" else []),
               "--runs-dir", str(w / "runs"), "--state-file", str(w / "runstate.json")]
        self.busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(c.busy_loops)]
        try:
            with open(w / "make-run.log", "wb") as log:
                code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=SCENARIO_CAP).returncode
        except subprocess.TimeoutExpired:
            code = -1
        finally:
            for p in self.busy:
                p.terminate()
                p.wait()
        out = {"codes": {"make run": code}, "faults": [], "differs": [], "digest_mismatches": {}}
        summaries = sorted((w / "runs").glob("*/summary.json"))
        if code == SKIPPED:
            out["result"] = "skipped"
        elif summaries:
            s = json.loads(summaries[-1].read_text())
            out["summary"] = {k: v for k, v in s.items() if not isinstance(v, (list, dict))}
            if s["max_abs_param_diff_vs_reference"] != 0.0:
                out["differs"].append(f"max_abs_param_diff_vs_reference {s['max_abs_param_diff_vs_reference']}")
            if s.get("digest_mismatches"):
                out["digest_mismatches"]["workers"] = s["digest_mismatches"]
            out["result"] = "diverged" if out["differs"] or out["digest_mismatches"] else \
                "exact" if code == 0 else "failed"
        else:
            out["result"] = "failed"
        return out

    def run(self) -> dict:
        c = self.cfg
        if c.family == "makerun":
            return self.make_run()
        ref = reference.train(self.init, reference.synthetic_grads(self.grad_seed), c.workers, c.steps,
                              OptimizerConfig())
        with testbed.Testbed("st-") as bed:
            for h in self.topo.hosts.values():
                bed.add(h)
            self._agents(bed)
            if shutil.which("tcpdump"):
                self._capture(bed)
            self.busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(c.busy_loops)]
            stop = threading.Event()
            try:
                with self._fabric(bed) as self.fabric:
                    self.procs["node"].start()
                    threads = None
                    if c.family == "threads":
                        threads = self._worker_threads(bed)
                    else:
                        for name, agent in self.procs.items():
                            if name != "node":
                                agent.start()
                    events = threading.Thread(target=self._events, args=(time.monotonic(), stop), daemon=True)
                    events.start()
                    codes = self._join(threads) if c.family == "threads" else {}
                    codes.update(self._wait())
                    stop.set()
                    events.join()
            finally:
                stop.set()
                for p in [*self.busy, *self.pcaps]:
                    p.terminate()
                    p.wait()
                for agent in self.procs.values():
                    agent.kill()
        return self._verdict(ref, codes)

    def _worker_threads(self, bed):
        """The job's workers as threads of this process (harness.Workers), their processes unused."""
        from tests.host_agent.harness import Workers

        c = self.cfg
        for i in range(c.workers):
            del self.procs[f"worker{i}"]
        return Workers(bed, self.topo, self.init, reference.synthetic_grads(self.grad_seed), c.steps,
                       drop=c.agent_loss, dup=c.node_dup, reorder=c.node_reorder).start()

    def _join(self, workers) -> dict[str, int]:
        """Wait for the worker threads; their parameters and stats written as the processes' are."""
        try:
            workers.join()
        except Exception as exc:  # a step that failed: the scenario fails
            (self.work / "workers.log").write_text(f"{type(exc).__name__}: {exc}\n")
        codes = {}
        for i, agent in workers.agents.items():
            codes[f"worker{i}"] = 0 if i in workers.results else 1
            if i in workers.results:
                np.savez(self.work / f"w{i}.npz", **workers.results[i])
            (self.work / f"w{i}.json").write_text(json.dumps(dict(agent.stats)) + "\n")
        return codes

    def _wait(self) -> dict[str, int]:
        """Each agent's exit code; an agent restarted by an event is waited for in its new life."""
        deadline = time.monotonic() + SCENARIO_CAP
        while time.monotonic() < deadline:
            codes = {n: a.proc.poll() for n, a in self.procs.items()}
            if all(v is not None for v in codes.values()):
                time.sleep(0.5)  # an event may be restarting one right now
                again = {n: a.proc.poll() for n, a in self.procs.items()}
                if all(v is not None for v in again.values()):
                    return again
            time.sleep(0.1)
        return {n: (a.proc.poll() if a.proc.poll() is not None else -1) for n, a in self.procs.items()}

    def _verdict(self, ref, codes: dict[str, int]) -> dict:
        w = self.work
        out = {"codes": codes, "faults": self.faults, "differs": [], "digest_mismatches": {}}
        for i in range(self.cfg.workers):
            path = w / f"w{i}.npz"
            if not path.exists():
                continue
            with np.load(path) as z:
                params = {k: z[k] for k in z.files}
            if not same_bits(params, ref.params):
                out["differs"].append(f"worker{i}")
            stats = json.loads((w / f"w{i}.json").read_text()) if (w / f"w{i}.json").exists() else {}
            if stats.get("digest_mismatches"):
                out["digest_mismatches"][f"worker{i}"] = stats["digest_mismatches"]
        if (w / "final.npz").exists():
            with np.load(w / "final.npz") as z:
                if not same_bits({k: z[k] for k in z.files}, ref.master):
                    out["differs"].append("node")
        if (w / "node-stats.json").exists():
            out["node_stats"] = {k: v for k, v in json.loads((w / "node-stats.json").read_text()).items()
                                 if not isinstance(v, list)}
        diverged = bool(out["differs"] or out["digest_mismatches"])
        failed = any(v != 0 for v in codes.values())
        out["result"] = "diverged" if diverged else "failed" if failed else "exact"
        return out


#: cgroup v1's cpu controller (this machine's): a group whose CFS quota is 10 % of one CPU.
CPU_CGROUP = pathlib.Path("/sys/fs/cgroup/cpu")


def starve(pid: int, hold: float) -> None:
    """Move process `pid` (all its threads) into a cgroup with a 10 % CPU quota for `hold` s, then
    back; OSError where there is no cgroup v1 cpu controller (the fault is then reported as not
    injected)."""
    group = CPU_CGROUP / f"mindp-stress-{os.getpid()}"
    group.mkdir(exist_ok=True)
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("10000")
        (group / "cgroup.procs").write_text(str(pid))
        time.sleep(hold)
    finally:
        with contextlib.suppress(OSError):
            (CPU_CGROUP / "cgroup.procs").write_text(str(pid))
        with contextlib.suppress(OSError):
            group.rmdir()


def same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]).view(np.uint8),
                                                       np.asarray(b[k]).view(np.uint8)) for k in a)


def replay(config: pathlib.Path, in_place: bool) -> int:
    """One scenario in config's directory (in_place: the stress loop's fresh one), else in a new
    replay-<time> directory beside the config."""
    cfg = Config.load(config)
    work = config.parent if in_place else config.parent / f"replay-{time.strftime('%Y%m%d-%H%M%S')}"
    work.mkdir(parents=True, exist_ok=True)
    verdict = Scenario(cfg, work).run()
    (work / "verdict.json").write_text(json.dumps(verdict, indent=1) + "\n")
    print(f"{cfg.family} seed {cfg.seed}: {verdict['result']}"
          + (f" ({', '.join(verdict['differs'])} differ; digest mismatches {verdict['digest_mismatches']})"
             if verdict["result"] == "diverged" else ""), flush=True)
    return {"exact": EXACT, "diverged": DIVERGED, "skipped": SKIPPED}.get(verdict["result"], FAILED)


# --- the loop --------------------------------------------------------------------------------

def stress(minutes: float, seed: int, families: list[str], out: pathlib.Path, load: int) -> int:
    rng = random.Random(seed)
    end = time.monotonic() + minutes * 60
    counts: dict[str, collections.Counter] = {f: collections.Counter() for f in families}
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
    n = diverged = 0
    try:
        while time.monotonic() < end:
            family = families[n % len(families)]
            cfg = random_config(rng, family)
            d = out / f"{n:04d}-{family}-{cfg.seed}"
            d.mkdir(parents=True)
            cfg.dump(d / "config.json")
            cmd = [sys.executable, "-m", "tools.stress", "--replay", str(d / "config.json"), "--in-place"]
            with open(d / "scenario.log", "wb") as log:
                child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=pathlib.Path(__file__).resolve().parent.parent)
                try:
                    code = child.wait(timeout=SCENARIO_CAP + 120)
                except subprocess.TimeoutExpired:
                    code = FAILED
                finally:  # also when this loop is stopped: the scenario cleans up on SIGTERM
                    if child.poll() is None:
                        child.terminate()
                        child.wait()
            n += 1
            result = {EXACT: "exact", DIVERGED: "diverged", SKIPPED: "skipped"}.get(code, "failed")
            counts[family][result] += 1
            if code in (EXACT, SKIPPED):
                shutil.rmtree(d)
                continue
            diverged += code == DIVERGED
            print(f"{result.upper()}: {family} seed {cfg.seed}: {d}\n  replay: sudo .venv/bin/python -m tools.stress "
                  f"--replay {d / 'config.json'}", flush=True)
    finally:
        for p in busy:
            p.terminate()
            p.wait()
    for f, c in counts.items():
        print(f"{f}: {sum(c.values()) - c['skipped']} scenarios, {c['exact']} exact, {c['diverged']} diverged, "
              f"{c['failed']} failed" + (f" ({c['skipped']} skipped: make run's lock busy)" if c["skipped"] else ""))
    print(f"{n - sum(c['skipped'] for c in counts.values())} scenarios, {diverged} divergences", flush=True)
    return 1 if diverged else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools.stress", description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0, help="how long to keep starting scenarios")
    p.add_argument("--seed", type=int, help="seed of the scenarios' configurations (default: random, printed)")
    p.add_argument("--families", default=",".join(DEFAULT_FAMILIES), help=f"comma-separated, of {', '.join(FAMILIES)}")
    p.add_argument("--load", type=integer(0), default=0, help="busy loops beside the whole run")
    p.add_argument("--out", help="where failing scenarios are kept (default runs/stress-<time>)")
    p.add_argument("--replay", metavar="CONFIG", help="run the one scenario of this config.json again")
    p.add_argument("--in-place", action="store_true", help=argparse.SUPPRESS)  # the loop's: in config's directory
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        p.error("must run as root (network namespaces)")
    # Names of its own: another stress run, replay or test run never shares a namespace or a veth
    # (the loop's scenarios, one at a time, inherit the loop's).
    os.environ.setdefault(testbed.TAG_ENV, testbed.claim_tag())
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # cleans up as Ctrl-C does
    if args.replay:
        return replay(pathlib.Path(args.replay), args.in_place)
    families = [f for f in args.families.split(",") if f]
    if not families or any(f not in FAMILIES for f in families):
        p.error(f"--families: want some of {', '.join(FAMILIES)}")
    if not args.minutes > 0:
        p.error("--minutes must be > 0")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    out = pathlib.Path(args.out or f"runs/stress-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and any(out.iterdir()):
        p.error(f"--out {out} is not empty: give a new directory (its scenarios would be mixed with this run's)")
    print(f"tools.stress: {args.minutes:g} minutes of {', '.join(families)} scenarios, seed {seed}, "
          f"{args.load} busy loop(s); failing scenarios kept in {out}", flush=True)
    return stress(args.minutes, seed, families, out, args.load)


if __name__ == "__main__":
    sys.exit(main())
