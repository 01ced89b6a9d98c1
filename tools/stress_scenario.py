"""One make stress scenario on a testbed: mindp-worker processes (or threads) and the node, through
the loopback aggregator or a switch (embedded or BMv2, with its controller process), with timed
faults; its verdict against the reference trainer, bit for bit."""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import threading
import time

import numpy as np

from host_agent import reference
from host_agent.node import UP_LINE
from host_agent.optim import OptimizerConfig
from host_agent.pipeline import record
from mindp import progress
from mindp.harness import testbed
from mindp.protocol import K
from mindp.topology import star
from tools.soak import Agent
from tools.stress_config import BUSY_LOOP, SCENARIO_CAP, SWITCH_FAMILIES, Config, Event

#: The node's linger: longer than a stopped worker's hold (2.5 s at most) plus its largest RTO, so
#: that a worker whose last parameters were lost is still answered.
LINGER = 8.0
#: A worker's step deadline: far beyond any fault's hold; a scenario that hangs fails by it.
DEADLINE = 120.0
#: streamed: a model of 8 pages of 32 chunks through a RAM budget of 6 pages; else 44 chunks, mapped whole.
STREAMED_CHUNKS, MAPPED_CHUNKS, PAGE_CHUNKS, BUDGET_PAGES = 8 * 32 - 16, 44, 32, 6
#: cgroup v1's cpu controller (this machine's): a group whose CFS quota is 10 % of one CPU.
CPU_CGROUP = pathlib.Path("/sys/fs/cgroup/cpu")


def scenario_model(seed: int, chunks: int) -> dict[str, np.ndarray]:
    """A small model of about `chunks` chunks of this process's K."""
    rng = np.random.default_rng(seed)
    return {"embed": rng.standard_normal((40, 17)).astype(np.float32) * 0.1,
            "w": rng.standard_normal((max(1, (chunks * K - 693) // 21), 21)).astype(np.float32) * 0.1,
            "b": np.zeros(13, np.float32)}


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
        # Held while an event runs: a kill and its restart are one step to _wait, which never takes
        # the exit code of a process an event killed and is about to start again for an ending.
        self.injecting = threading.Lock()

    def _module(self, name: str) -> list[str]:
        """How an agent's module is run: with small socket buffers where the scenario says so."""
        return ["-m", "tools.stress_sockbuf", str(self.cfg.sockbuf), name] if self.cfg.sockbuf else ["-m", name]

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
            *self._module("host_agent.node"), "--iface", "eth0", "--topology", str(topo_path), "--job", "1",
            "--state-dir", str(w / "state"), "--init", str(init_path), "--steps", str(c.steps),
            "--ram-budget", str(BUDGET_PAGES * PAGE_CHUNKS * record(3).itemsize) if c.streamed else "1G",
            "--page-chunks", str(PAGE_CHUNKS), "--export", str(w / "final.npz"), "--stats", str(w / "node-stats.json"),
            "--linger", str(LINGER), "--idle-timeout", str(progress.CAP), "--stall-resend", str(c.stall_resend), *loss(),
            *(["--dup-send", str(c.node_dup)] if c.node_dup else []),
            *(["--reorder-send", str(c.node_reorder)] if c.node_reorder else [])], w / "node.log")
        for i, name in job.workers.items():
            self.procs[f"worker{i}"] = Agent(f"worker{i}", bed.hosts[name], [
                *self._module("host_agent.worker"), "--topology", str(topo_path), "--job", "1", "--worker", str(i),
                "--init", str(init_path), "--grad-seed", str(self.grad_seed), "--steps", str(c.steps),
                "--resume", str(w / f"w{i}.resume"), "--out", str(w / f"w{i}.npz"), "--stats", str(w / f"w{i}.json"),
                "--deadline", str(DEADLINE), *loss()], w / f"w{i}.log")

    def _fabric(self, bed):
        c = self.cfg
        if c.family in SWITCH_FAMILIES:
            from tools.stress_fabric import SwitchFabric

            faults = ["--drop-prob", str(c.fabric_drop), "--dup-prob", str(c.fabric_dup),
                      "--reorder-prob", str(c.fabric_reorder), "--seed", str(c.seed)]
            return SwitchFabric(c.family, bed.ports(), self.work / "topo.json", self.work, faults)
        from tests.host_agent.aggregator import Aggregator

        job = self.topo.jobs[0]
        return Aggregator(1, {i: self.topo.host(n) for i, n in job.workers.items()}, self.topo.host(job.optimizer),
                          bed.ports(), drop=c.fabric_drop, dup=c.fabric_dup, reorder=c.fabric_reorder, seed=c.seed)

    def _event(self, e: Event) -> None:
        if e.target == "controller":
            self.fabric.kill_controller(e.hold)
        elif e.target == "switch":
            if e.action == "kill":
                self.fabric.restart(e.hold)
            else:
                (self._signal if e.action == "stop" else starve)(self.fabric.switch.proc.pid, e.hold)
        else:
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
                with self.injecting:
                    self._event(e)
            except Exception as exc:  # a fault that could not be injected is reported, not fatal
                self.faults.append(f"{e.action} {e.target}: not injected ({exc})")

    def _capture(self, bed) -> None:
        for port, iface in bed.ports().items():
            with open(os.devnull, "wb") as null:
                self.pcaps.append(subprocess.Popen(["tcpdump", "-i", iface, "-w", str(self.work / f"port{port}.pcap"),
                                                    "-U"], stdout=null, stderr=null))

    def run(self) -> dict:
        c = self.cfg
        ref = reference.train(self.init, reference.synthetic_grads(self.grad_seed), c.workers, c.steps,
                              OptimizerConfig())
        with testbed.Testbed("st-") as bed:
            for h in self.topo.hosts.values():
                bed.add(h)
            self._agents(bed)
            if shutil.which("tcpdump"):
                self._capture(bed)
            self.busy = [subprocess.Popen(BUSY_LOOP) for _ in range(c.busy_loops)]
            stop = threading.Event()
            try:
                with self._fabric(bed) as self.fabric:
                    self.procs["node"].start().wait_line(UP_LINE)
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
        if c.sockbuf:
            from tools.stress_sockbuf import shrink

            shrink(c.sockbuf)
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
        """Each agent's exit code; an agent restarted by an event is waited for in its new life.
        Once every worker has ended, the node still serving LINGER s later is told to end (SIGTERM:
        it exports and exits, as make run ends it): after failed workers it served to the cap. A
        life an event started is told only once up (its UP_LINE: its SIGTERM handler is set), as
        make run tells only nodes it saw start: one told while still starting on a busy machine
        died by the signal, exit -15, a failed scenario with exact training."""
        deadline = time.monotonic() + SCENARIO_CAP
        workers_gone = None
        told = None  # the node process told to end (once: a second SIGTERM in its interpreter's
        # shutdown, after it exported, would kill it by the signal, exit -15: a failed scenario)
        while time.monotonic() < deadline:
            codes = {n: a.proc.poll() for n, a in self.procs.items()}
            now = time.monotonic()
            node = self.procs["node"]
            if any(v is None for n, v in codes.items() if n != "node"):
                workers_gone = None
            elif workers_gone is None:
                workers_gone = now
            elif codes["node"] is None and now - workers_gone > LINGER:
                with self.injecting:  # the life looked at is the one told
                    if told is not node.proc and node.said(UP_LINE):
                        told = node.proc
                        with contextlib.suppress(ProcessLookupError):
                            told.terminate()  # `ip netns exec` execs: the node's own PID
            if all(v is not None for v in codes.values()):
                with self.injecting:  # no event is between a kill and its restart now
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
