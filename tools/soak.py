"""make soak: two jobs train for many steps through the real switch while everything fails, and
end bit-exact.

    sudo python -m tools.soak --steps 2000 --loss 0.05 --target auto [--window 500] [--seed 0]

Two jobs of WORKERS mindp-worker processes (synthetic gradients, resume files) and one
mindp-optimizer node each, in network namespaces on veths, through the switch configured by
the controller over P4Runtime. Every agent loses LOSS of the frames it sends and receives; the
nodes also duplicate and reorder their sends, and the embedded switch its outputs. At random
steps the switch is killed (SIGKILL) and restored by the controller, one optimizer node and one
worker are killed and restarted on their state, and the controller is replaced by a new one
that learns the jobs from the switch. At the end every worker's parameters and every node's
master must be bit-identical to the reference trainer's. Printed: each process's peak RSS per
WINDOW steps (its growth after the first window, the warm-up, must stay within 5 %), every
drop reason the switch counted over all its lives, the workers' step-digest checks and
mismatches (host_agent/digest.py: a mismatch is a divergence caught, so it fails the soak), and the
faults injected. Exit 0 when all holds. Uses the namespaces sk-*: run one at a time (tests take /tmp/mindp-net.lock).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from controller.controller import Controller
from host_agent import optim, reference
from host_agent.digest import MISMATCH_LINE
from host_agent.node import UP_LINE
from host_agent.optim import OptimizerConfig
from host_agent.resume import ResumeFile
from mindp import interrupts, progress, targets
from mindp.harness import testbed
from mindp.protocol import MAX_WORKERS, K
from mindp.topology import star

GROWTH_LIMIT = 1.05
CHUNKS = 45  # a step of the soak's model
FAULTS = ("switch", "node", "worker", "controller")
#: In an agent's command line: the number of its life (0, then 1 after a restart, ...).
LIFE = "{life}"


@dataclass
class Agent:
    """One agent process in its host's namespace, restarted with the same command line (LIFE in it
    becomes the life's number, so that each life keeps its own files)."""
    name: str
    host: testbed.NetHost
    argv: list[str]
    log: pathlib.Path
    proc: subprocess.Popen | None = None
    restarts: int = 0
    log_start: int = 0  # where this life's output begins in the log

    def start(self) -> Agent:
        with open(self.log, "ab") as f:
            self.log_start = f.tell()
            argv = [a.replace(LIFE, str(self.restarts)) for a in self.argv]
            self.proc = self.host.popen(sys.executable, *argv, stdin=subprocess.DEVNULL, stdout=f,
                                        stderr=subprocess.STDOUT)
        return self

    def said(self, text: str) -> bool:
        """Whether this life's log holds `text`."""
        with open(self.log, "rb") as f:
            f.seek(self.log_start)
            return text.encode() in f.read()

    def wait_line(self, text: str) -> Agent:
        """Until this life's log holds `text` (a node's UP_LINE: its state and sockets are open, so a
        worker's first digest query finds its port), as long as the process starts up (CPU, log)."""
        def up() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.proc.returncode} before {text!r}; see {self.log}")
            return self.said(text)

        progress.wait(up, progress.both(progress.activity(self.proc.pid), progress.file_sizes(self.log)),
                      stall=progress.STALL, poll=0.05, what=f"{self.name} start")
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)  # `ip netns exec` execs: the agent's own PID
        if self.proc:
            self.proc.wait()

    def restart(self) -> None:
        self.kill()
        self.restarts += 1
        self.start()


@dataclass
class Report:
    rss: dict[tuple[str, int], int] = field(default_factory=dict)  # (process, window) -> peak kB
    drops: collections.Counter = field(default_factory=collections.Counter)  # (row, reason) -> packets
    faults: list[str] = field(default_factory=list)


@dataclass
class DigestTally:
    checks: int = 0  # by the lives that ended (a killed life writes no stats)
    mismatches: int = 0  # by every life (each prints its line when it happens)


def digest_tally(stats: list[pathlib.Path], logs: list[pathlib.Path]) -> DigestTally:
    """The workers' step-digest checks from their --stats files and mismatches from their logs."""
    tally = DigestTally()
    for path in stats:
        try:
            tally.checks += int(json.loads(path.read_text()).get("digest_checks", 0))
        except (OSError, ValueError):
            continue
    for path in logs:
        try:
            tally.mismatches += path.read_text(errors="replace").count(MISMATCH_LINE)
        except OSError:
            continue
    return tally


def switch_fault_args(args) -> list[str]:
    """The embedded switch's duplicates and reordering (BMv2 has none), for the target this
    process's K resolves to: TARGET=auto takes the embedded switch at a K BMv2 cannot run."""
    if targets.resolve(args.target, K) != "embedded":
        return []
    return ["--dup-prob", str(args.dup), "--reorder-prob", str(args.reorder), "--seed", str(args.seed)]


def rss_kb(pid: int) -> int:
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def model(seed: int) -> dict[str, np.ndarray]:
    """A small model (about 45 chunks of this process's K a step), its own per job."""
    rng = np.random.default_rng(seed)
    return {"embed": rng.standard_normal((40, 17)).astype(np.float32) * 0.1,
            "w": rng.standard_normal((max(1, (CHUNKS * K - 693) // 21), 21)).astype(np.float32) * 0.1,
            "b": np.zeros(13, np.float32)}


class Soak:
    def __init__(self, args, work: pathlib.Path):
        self.args = args
        self.work = work
        self.rng = random.Random(args.seed)
        self.topo = star([args.workers, args.workers], slots=64,
                         grpc_addr=f"127.0.0.1:{targets.free_port()}")
        self.topo_path = work / "topo.json"
        self.topo.dump(self.topo_path)
        self.report = Report()
        self.nodes: dict[int, Agent] = {}
        self.workers: dict[tuple[int, int], Agent] = {}
        self.inits = {j.job_id: model(args.seed + j.job_id) for j in self.topo.jobs}
        self.layout = optim.layout_of(self.inits[1])
        self.bed = self.switch = self.ctl = None

    # --- setup ---------------------------------------------------------------------------
    def faults(self, host: str) -> list[str]:
        loss = str(self.args.loss)
        return ["--drop-send", loss, "--drop-recv", loss, "--fault-seed", str(self.rng.randrange(1 << 30))]

    def start(self) -> None:
        a = self.args
        self.bed = testbed.Testbed("sk-")
        for h in self.topo.hosts.values():
            self.bed.add(h)
        cfg = targets.SwitchConfig(ports=self.bed.ports(), grpc_addr=self.topo.switch.grpc_addr,
                                   log_file=str(self.work / "switch.log"), thrift_port=targets.free_port(),
                                   fault_args=switch_fault_args(a))
        self.switch = targets.SwitchProcess(a.target, cfg)
        self.start_switch()
        self.ctl = Controller(cfg.grpc_addr, topology=self.topo)
        self.ctl.push()
        self.ctl.install_forwarding()
        for spec in self.topo.jobs:
            self.ctl.create_job(spec)
        for spec in self.topo.jobs:
            j = spec.job_id
            init = self.work / f"init{j}.npz"
            np.savez(init, **self.inits[j])
            self.nodes[j] = Agent(f"node-job{j}", self.bed.hosts[spec.optimizer], [
                "-m", "host_agent.node", "--iface", "eth0", "--topology", str(self.topo_path), "--job", str(j),
                "--state-dir", str(self.work / f"state{j}"), "--init", str(init), "--steps", str(a.steps),
                "--export", str(self.work / f"master{j}.npz"), "--stats", str(self.work / f"node{j}.json"),
                "--stall-resend", "0.5", "--dup-send", str(a.dup), "--reorder-send", str(a.reorder),
                *self.faults(spec.optimizer)], self.work / f"node-job{j}.log").start()
        for node in self.nodes.values():
            node.wait_line(UP_LINE)
        for spec in self.topo.jobs:
            j = spec.job_id
            for w, host in sorted(spec.workers.items()):
                self.workers[(j, w)] = Agent(f"worker-job{j}-{w}", self.bed.hosts[host], [
                    "-m", "host_agent.worker", "--topology", str(self.topo_path), "--job", str(j), "--worker", str(w),
                    "--init", str(self.work / f"init{j}.npz"), "--grad-seed", str(a.seed + j),
                    "--steps", str(a.steps), "--resume", str(self.resume_path(j, w)), "--deadline", "120",
                    "--out", str(self.work / f"out{j}-{w}.npz"),
                    "--stats", str(self.work / f"stats{j}-{w}-life{LIFE}.json"), *self.faults(host)],
                    self.work / f"worker-job{j}-{w}.log").start()

    def start_switch(self) -> None:
        self.switch.start()
        self.switch.set_queue_depth(1024)

    def resume_path(self, j: int, w: int) -> pathlib.Path:
        return self.work / f"worker{j}-{w}.resume"

    # --- the run ---------------------------------------------------------------------------
    def progress(self) -> dict[int, int]:
        """Per job, the step all its workers have reached (from their resume files)."""
        steps: dict[int, int] = {}
        for (j, w) in self.workers:
            path = self.resume_path(j, w)
            try:
                at = ResumeFile(path, j, w, self.layout).step if path.exists() else 0
            except (OSError, ValueError):
                at = 0
            steps[j] = min(steps.get(j, at), at)
        return steps

    def schedule(self) -> list[tuple[int, str]]:
        lo, hi = max(1, self.args.steps // 20), max(2, self.args.steps * 19 // 20)
        plan = [(self.rng.randint(lo, hi), kind) for kind in FAULTS for _ in range(self.args.faults)]
        return sorted(plan)

    def bank_counters(self) -> None:
        """Add the switch's drop counters (lost with it when it is killed) to the report."""
        snap = self.ctl.stats()
        for j, c in snap.jobs.items():
            self.report.drops.update({(f"job {j}", r): v for r, v in c.drops.items()})
        self.report.drops.update({("no job", r): v for r, v in snap.no_job.drops.items()})

    def inject(self, kind: str, step: int) -> None:
        if kind == "switch":
            self.bank_counters()
            os.killpg(self.switch.proc.pid, signal.SIGKILL)
            self.switch.proc.wait()
            self.start_switch()
            self.ctl.reconnect()
            done = self.ctl.restore()
            what = f"switch killed and restored ({', '.join(done[:1]) or 'nothing to restore'})"
        elif kind == "node":
            j = self.rng.choice(sorted(self.nodes))
            self.nodes[j].restart()
            what = f"optimizer node of job {j} killed and restarted"
        elif kind == "worker":
            key = self.rng.choice(sorted(self.workers))
            self.workers[key].restart()
            what = f"worker {key[1]} of job {key[0]} killed and restarted"
        else:
            self.ctl.close()
            self.ctl = Controller(self.topo.switch.grpc_addr, topology=self.topo)
            got = self.ctl.reconcile()
            what = f"controller replaced; the new one learned jobs {sorted(got.jobs)} from the switch"
        self.report.faults.append(f"step {step}: {what}")
        print(f"  step {step}: {what}", flush=True)

    def sample(self, steps: dict[int, int]) -> None:
        """Each live process's RSS into its window: its job's step (the slower job's for the shared ones)."""
        shared = min(steps.values()) // self.args.window
        procs = [("switch", self.switch.proc.pid, shared), ("controller (this process)", os.getpid(), shared)]
        procs += [(a.name, a.proc.pid, steps[j] // self.args.window) for j, a in self.nodes.items()]
        procs += [(a.name, a.proc.pid, steps[j] // self.args.window) for (j, _), a in self.workers.items()]
        for name, pid, window in procs:
            kb = rss_kb(pid)
            if kb:
                self.report.rss[(name, window)] = max(self.report.rss.get((name, window), 0), kb)

    def standing(self) -> list[str]:
        """Where each worker stands (its resume file): for a soak that stopped moving."""
        out = []
        for (j, w) in sorted(self.workers):
            try:
                f = ResumeFile(self.resume_path(j, w), j, w, self.layout)
                done = int(f.answered_in(f.step)[0].sum())
                out.append(f"  worker {w} of job {j}: step {f.step}, {done} of {self.layout.n_chunks} chunks answered")
            except (OSError, ValueError):
                out.append(f"  worker {w} of job {j}: no resume file")
        return out

    def run(self) -> None:
        plan = self.schedule()
        last, last_change, shown = -1, time.monotonic(), -1
        late = (0.0, 0.0)  # the longest this loop overslept its poll (not run: a machine stall), and when
        while True:
            steps = self.progress()
            step = min(steps.values())
            self.sample(steps)
            if step != last:
                last, last_change = step, time.monotonic()
            while plan and step >= plan[0][0]:
                self.inject(plan.pop(0)[1], step)
            if step // 100 != shown:
                shown = step // 100
                print(f"  step {step}/{self.args.steps}", flush=True)
            for a in [*self.nodes.values(), *self.workers.values()]:
                rc = a.proc.poll()
                if rc not in (None, 0):
                    raise SystemExit("\n".join([f"soak: {a.name} failed (exit {rc}); see {a.log}", *self.standing()]))
            if all(a.proc.poll() == 0 for a in [*self.workers.values(), *self.nodes.values()]):
                break
            if time.monotonic() - last_change > 180:
                when = time.strftime("%H:%M:%S", time.localtime(late[1]))
                raise SystemExit("\n".join([
                    f"soak: no step for 180 s at step {step}; see {self.work}", *self.standing(),
                    f"  this process overslept its poll by up to {late[0]:.1f} s (at {when})"]))
            t = time.monotonic()
            time.sleep(0.2)
            late = max(late, (time.monotonic() - t - 0.2, time.time()))
        self.bank_counters()

    # --- verdict -----------------------------------------------------------------------------
    def exact(self) -> dict[int, bool]:
        out = {}
        for spec in self.topo.jobs:
            j = spec.job_id
            ref = reference.train(self.inits[j], reference.synthetic_grads(self.args.seed + j), spec.n_workers,
                                  self.args.steps, OptimizerConfig())
            same = [self.same(self.work / f"out{j}-{w}.npz", ref.params) for w in sorted(spec.workers)]
            out[j] = all(same) and self.same(self.work / f"master{j}.npz", ref.master)
        return out

    @staticmethod
    def same(path: pathlib.Path, want: dict[str, np.ndarray]) -> bool:
        with np.load(path) as got:
            return sorted(got.files) == sorted(want) and all(
                np.array_equal(got[k].view(np.uint8), np.asarray(want[k]).view(np.uint8)) for k in want)

    def digests(self) -> DigestTally:
        return digest_tally(sorted(self.work.glob("stats*-life*.json")), [a.log for a in self.workers.values()])

    def close(self) -> None:
        for a in [*self.workers.values(), *self.nodes.values()]:
            a.kill()
        if self.ctl is not None:
            self.ctl.close()
        if self.switch is not None:
            self.switch.stop()
        if self.bed is not None:
            self.bed.close()


def growth(report: Report, windows: int) -> dict[str, float]:
    """Per process: the highest peak RSS of a window after the second, over the second's (the
    first after warm-up); 1.0 when there are too few windows."""
    out = {}
    for name in sorted({n for n, _ in report.rss}):
        peaks = [report.rss.get((name, w), 0) for w in range(windows)]
        base = peaks[1] if windows > 1 else 0
        later = [p for p in peaks[2:] if p]
        out[name] = max(later) / base if base and later else 1.0
    return out


def print_report(soak: Soak, exact: dict[int, bool], digests: DigestTally, seconds: float) -> bool:
    a, rep = soak.args, soak.report
    windows = (a.steps + a.window - 1) // a.window
    print(f"\nsoak: 2 jobs x {a.workers} workers, {a.steps} steps, loss {a.loss}, dup {a.dup}, reorder {a.reorder}, "
          f"{soak.switch.target} switch, {seconds:.0f} s")
    print("faults injected:")
    for f in rep.faults:
        print(f"  {f}")
    print(f"peak RSS (MiB) per {a.window} steps (window 0 is warm-up):")
    names = sorted({n for n, _ in rep.rss})
    print("  " + "process".ljust(28) + "".join(f"{w * a.window:>9}" for w in range(windows)) + "   growth")
    grow = growth(rep, windows)
    for name in names:
        cells = "".join(f"{rep.rss.get((name, w), 0) / 1024:9.1f}" for w in range(windows))
        print(f"  {name:<28}{cells}   {100 * (grow[name] - 1):+.1f} %")
    print("drops counted by the switch (all its lives):")
    for (row, reason), v in sorted(rep.drops.items()):
        print(f"  {row:<7} {reason:<18} {v}")
    if not rep.drops:
        print("  none")
    print(f"step digests: {digests.checks} checks by the workers' lives that ended, "
          f"{digests.mismatches} mismatches")
    for j, ok in exact.items():
        print(f"job {j}: {'bit-exact with the reference trainer' if ok else 'DIFFERS from the reference trainer'}")
    grew = [n for n, g in grow.items() if g > GROWTH_LIMIT]
    if grew:
        print(f"RSS grew beyond {100 * (GROWTH_LIMIT - 1):.0f} % after warm-up: {', '.join(grew)}")
    return all(exact.values()) and not grew and not digests.mismatches


def refusal(args) -> str | None:
    """Why these arguments cannot make a soak (None: they can): said before a namespace or a
    process exists, as each would otherwise fail later (an agent refuses its probabilities, the
    topology its workers, the switch its target) or pass a check it never made."""
    if args.window < 1:
        return "--window must be >= 1"
    if args.steps < 3 * args.window:  # growth needs a window after the base one; fewer pass it unmeasured
        return "--steps must cover 3 windows (warm-up, base, later): at least 3 x --window"
    if not 1 <= args.workers <= MAX_WORKERS:
        return f"--workers must be 1..{MAX_WORKERS} (a job's worker ids are 0..{MAX_WORKERS - 1}), not {args.workers}"
    for name in ("loss", "dup", "reorder"):
        value = getattr(args, name)
        if not 0 <= value < 1:  # the agents' own range (host_agent.agent_args.probability)
            return f"--{name} must be a probability in [0, 1), not {value:g}"
    if args.faults < 0:
        return f"--faults must be >= 0, not {args.faults}"
    try:
        targets.resolve(args.target, K)
    except targets.TargetError as exc:
        return f"--target: {exc}"
    keep = pathlib.Path(args.keep) if args.keep else None
    if keep and keep.exists() and not keep.is_dir():
        return f"--keep {keep} is not a directory"
    if keep and keep.is_dir() and any(keep.iterdir()):  # its resume files and state would be taken up
        return f"--keep {keep} is not empty: give a new or empty directory"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=2000, help="at least 3 x --window")
    p.add_argument("--workers", type=int, default=2, help=f"workers per job (1..{MAX_WORKERS})")
    p.add_argument("--loss", type=float, default=0.05, help="loss on every agent's send and receive paths")
    p.add_argument("--dup", type=float, default=0.01, help="duplication by the nodes and the embedded switch")
    p.add_argument("--reorder", type=float, default=0.01, help="reordering by the nodes and the embedded switch")
    p.add_argument("--faults", type=int, default=1, help="kills of each kind (switch, node, worker, controller)")
    p.add_argument("--window", type=int, default=500, help="steps per RSS window")
    p.add_argument("--target", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", help="keep the run's files in this new or empty directory (default: a temporary one)")
    args = p.parse_args(argv)
    why = refusal(args)
    if why:
        print(f"soak: {why}", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("soak: must run as root (network namespaces)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="mindp-soak-") as tmp:
        work = pathlib.Path(args.keep or tmp)
        try:
            work.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            print(f"soak: cannot create --keep {work}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        soak = Soak(args, work)
        t0 = time.monotonic()
        try:
            with interrupts.deferred(interrupts.CTRL_C):  # its controller's RPCs end before a Ctrl-C stops it
                soak.start()
                print(f"soak: {args.steps} steps in {work}", flush=True)
                soak.run()
        except SystemExit as exc:
            print(exc, file=sys.stderr)
            return 1
        except targets.TargetError as exc:  # the switch did not come up (or back)
            print(f"soak: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("soak: interrupted", file=sys.stderr)
            return 130
        finally:
            soak.close()
        ok = print_report(soak, soak.exact(), soak.digests(), time.monotonic() - t0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
