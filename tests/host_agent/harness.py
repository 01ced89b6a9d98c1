"""Runs a training job over real packets: worker agents (threads, raw sockets in their
namespaces) and the optimizer node (the mindp-optimizer CLI in its namespace)."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import numpy as np

from controller.controller import Controller
from host_agent import digest, optim, rawsock, udpgso
from mindp import progress, targets
from mindp.harness import testbed
from mindp.topology import JobSpec, star
from host_agent.window import RtoConfig
from host_agent.worker import WorkerAgent, WorkerConfig

from .helpers import initial_fp16, same_bits

#: Seconds without any progress (steps, frames, CPU, log output) after which a wait fails.
STALL = progress.STALL


class NodeProcess:
    """The mindp-optimizer CLI in the optimizer's namespace; stopped by PID."""

    def __init__(self, nethost, args: list[str], log_path):
        self.nethost = nethost
        self.args = args
        self.log_path = log_path
        self.proc = None

    def start(self, timeout: float = 30.0) -> NodeProcess:
        self.log = open(self.log_path, "a")
        self.proc = self.nethost.popen(sys.executable, "-m", "host_agent.node", *self.args, stdout=subprocess.PIPE,
                                       stderr=self.log, text=True)
        line = self.proc.stdout.readline()  # "mindp-optimizer: job ..., resuming after step S"
        if "resuming" not in line:
            raise RuntimeError(f"optimizer node did not start: {line!r}; see {self.log_path}")
        self.banner = line
        return self

    def child_pid(self) -> int:
        """The node's own PID (`ip netns exec` execs it, so the same as the Popen's)."""
        return self.proc.pid

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def wait(self, stall: float = STALL) -> int:
        """The node's exit code; fails once it used no CPU and wrote no log for `stall` s."""
        try:
            return progress.wait_process(self.proc, stall=stall, progress=progress.file_sizes(self.log_path),
                                         what="optimizer node")
        finally:
            self.log.close()

    def finish(self) -> int:
        """The workers are done: SIGTERM (the node exports its state and exits), then its exit code.
        Tests end their nodes so, as make run does: a node left to end by itself (--steps, --linger)
        may go before a worker starved by a busy machine has taken its last parameters."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        return self.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def node_args(topo_path, state_dir, init_path, steps, export, stats, budget="8M", extra=()) -> list[str]:
    """The node serves until told to stop (NodeProcess.finish); its linger and idle timeout are only
    hang guards: a 60 s idle timeout ended nodes before workers that took that long to import torch
    on a busy machine, a 1.5 s linger one before a starved worker's last retransmission."""
    return ["--iface", "eth0", "--topology", str(topo_path), "--job", "1", "--state-dir", str(state_dir),
            "--ram-budget", budget, "--init", str(init_path), "--steps", str(steps), "--export", str(export),
            "--stats", str(stats), "--page-chunks", "32", "--linger", str(progress.CAP), "--idle-timeout", str(progress.CAP), *extra]


def run_files(tmp_path, topo, init, steps) -> list[str]:
    """Write the topology and initial parameters for a node run; its arguments."""
    topo_path = tmp_path / "topo.json"
    topo.dump(topo_path)
    init_path = tmp_path / "init.npz"
    np.savez(init_path, **init)
    return node_args(topo_path, tmp_path / "state", init_path, steps, tmp_path / "final.npz", tmp_path / "stats.json")


class AgentFabric:
    """A switch on the bed's ports with the job installed by the controller (the topology's job,
    or `job`, e.g. a subset of its workers). restart() kills the switch and starts it again on the
    same ports; the controller then gives it the pipeline, forwarding and job back."""

    def __init__(self, target, bed_topo, tmp_path, switch_faults=(), job: JobSpec | None = None):
        b, topo = bed_topo
        self.bed, self.topo = b, topo
        self.job = job or topo.jobs[0]
        cfg = targets.SwitchConfig(ports=b.ports(), grpc_addr=f"127.0.0.1:{targets.free_port()}",
                                   log_file=str(tmp_path / "switch.log"), thrift_port=targets.free_port(),
                                   fault_args=list(switch_faults) if target == "embedded" else [])
        self.switch = targets.SwitchProcess(target, cfg)
        self.target = target
        self.ctl = None

    def __enter__(self):
        self.switch.start()
        try:
            self.switch.set_queue_depth(1024)
            self.ctl = Controller(self.switch.cfg.grpc_addr, topology=self.topo)
            self.ctl.push()
            self.ctl.install_forwarding()
            self.ctl.create_job(self.job)
        except BaseException:
            self.__exit__()
            raise
        return self

    def restart(self, down: float = 0.0) -> list[str]:
        """Kill the switch (SIGKILL: its registers are gone), start it again after `down` s, and let the
        controller restore it; returns what the controller did."""
        os.killpg(self.switch.proc.pid, signal.SIGKILL)
        self.switch.proc.wait()
        time.sleep(down)
        self.switch.start()
        self.switch.set_queue_depth(1024)
        self.ctl.reconnect()
        return self.ctl.restore()

    def restart_controller(self) -> Controller:
        """A new controller process's view: a fresh Controller that learns the job from the switch."""
        self.ctl.close()
        self.ctl = Controller(self.switch.cfg.grpc_addr, topology=self.topo)
        self.ctl.reconcile()
        return self.ctl

    def __exit__(self, *exc):
        if self.ctl:
            self.ctl.close()
        self.switch.stop()


def job_bed(prefix: str, n_workers: int):
    """A testbed with one job's workers and optimizer node (a generator for module fixtures)."""
    topo = star([n_workers], slots=8)
    with testbed.Testbed(prefix) as b:
        for h in topo.hosts.values():
            b.add(h)
        yield b, topo


class Workers:
    """One thread per worker, each pushing `steps` steps of grad_fn's gradients."""

    def __init__(self, bed, topo, init, grad_fn, steps, *, drop=0.0, dup=0.0, reorder=0.0, rto=None,
                 overlap=False, ids=None, first_step=0, params=None, recv_drop=None, digests=True,
                 stop_before=None, pause=None):
        """ids: the workers to run (default all of the job's); they run steps first_step..steps-1
        from `params` (fp16, default the initial parameters' rounding). recv_drop: {worker: p},
        that worker alone loses received frames with probability p. digests: each worker checks
        every step against the node's step digest (host_agent.digest). stop_before: {worker: step},
        that worker ends before the step, as a process killed between steps (see stopped).
        pause: {worker: step or steps}, that worker puts only its first tensor of each such step
        until release(): its peers then hold that tensor's chunks of the step answered and no
        other, for as long as a test needs (a worker process killed mid-step, whatever the
        machine's speed)."""
        self.overlap = overlap
        self.layout = optim.layout_of(init)
        self.results: dict[int, dict] = {}
        self.errors: dict[int, BaseException] = {}
        self.agents: dict[int, WorkerAgent] = {}
        self.progress: dict[int, int] = {}
        self.params: dict[int, dict] = {}  # each worker's parameters after its last completed step
        self.first_step = first_step
        self.stop_before: dict[int, int] = dict(stop_before or {})
        self.pause: dict[int, set[int]] = {w: {s} if isinstance(s, int) else set(s) for w, s in (pause or {}).items()}
        self.released = {s: threading.Event() for steps in self.pause.values() for s in steps}
        job = topo.jobs[0]
        rto = rto or RtoConfig(initial=0.05, min=0.01, max=0.5, deadline=STALL)
        for w in (job.workers if ids is None else ids):
            sock = bed.hosts[job.workers[w]].socket()
            rawsock.prepare(sock)
            with testbed.in_netns(bed.hosts[job.workers[w]].netns):
                udpgso.attach(sock)  # as rawsock.open_raw does in a worker's own process
            faults = rawsock.Faults(drop, drop, 100 + w, dup, reorder) if (drop or dup or reorder) else None
            if recv_drop and w in recv_drop:
                faults = rawsock.Faults(drop, recv_drop[w], 100 + w, dup, reorder)
            cfg = WorkerConfig.from_topology(topo, job.job_id, w, rto=rto, first_step=first_step)
            agent = WorkerAgent(cfg, self.layout, sock, faults)
            if digests:
                with testbed.in_netns(bed.hosts[job.workers[w]].netns):
                    agent.check_digests(digest.open_socket())
            agent.nonfinite_log = []
            agent.on_nonfinite = lambda step, chunks, log=agent.nonfinite_log: log.append((step, chunks))
            self.agents[w] = agent
            self.progress[w] = first_step
        start = initial_fp16(init) if params is None else params
        self.threads = [threading.Thread(target=self._run, args=(w, start, grad_fn, steps), daemon=True)
                        for w in self.agents]

    def release(self, step: int | None = None) -> None:
        """The paused workers put the rest of that step (of every paused step if None)."""
        for s, event in self.released.items():
            if step is None or s == step:
                event.set()

    def _run(self, w, params, grad_fn, steps):
        try:
            for step in range(self.first_step, steps):
                if step == self.stop_before.get(w):  # killed between steps by the test
                    return
                grads = grad_fn(w, step, params)
                if step in self.pause.get(w, ()):
                    h = self.agents[w].start_step()
                    first, *rest = grads
                    h.put(first, grads[first])
                    self.released[step].wait(STALL)
                    for name in rest:
                        h.put(name, grads[name])
                    params = h.wait()
                elif self.overlap:  # as a backward pass produces them: last layer first, sending meanwhile
                    h = self.agents[w].start_step()
                    for name in reversed(list(grads)):
                        h.put(name, grads[name])
                        time.sleep(0.002)
                    params = h.wait()
                else:
                    params = self.agents[w].push(grads)
                self.params[w] = params
                self.progress[w] = step + 1
            self.results[w] = params
        except BaseException as exc:  # reported by join()
            self.errors[w] = exc

    def stopped(self, w: int) -> tuple[int, dict]:
        """Once worker w ended at its stop_before step (a fixed step, not whichever the thread reached
        when asked: the others may run steps ahead meanwhile), close its socket; returns the step it
        was at and the parameters it had, to restart it from."""
        thread = self.threads.pop(list(self.agents).index(w))
        progress.wait(lambda: not thread.is_alive(), self.measure, stall=STALL, what=f"stopping worker {w}")
        agent = self.agents.pop(w)
        agent.close()
        agent.sock.close()
        if agent.digest:
            agent.digest.close()
        return self.progress.pop(w), self.params.get(w)

    def start(self) -> Workers:
        for t in self.threads:
            t.start()
        return self

    def measure(self) -> tuple:
        """Progress: steps done and the agents' counters (frames sent, sent again, rejected...;
        retransmissions count: the workers' own step deadline, RtoConfig.deadline, fails a step
        that gets nothing back)."""
        frames = sum(sum(list(a.stats.values())) for a in list(self.agents.values()))
        return sum(self.progress.values()), frames, len(self.errors)

    def wait_step(self, step: int) -> None:
        """Until every worker finished `step` (or one failed)."""
        progress.wait(lambda: min(self.progress.values()) >= step or bool(self.errors), self.measure, stall=STALL,
                      what=f"workers reaching step {step}", poll=0.005)

    def join(self) -> None:
        """Until every worker thread ends; fails once they made no progress for STALL s."""
        progress.wait(lambda: not any(t.is_alive() for t in self.threads), self.measure, stall=STALL,
                      what="workers")
        if self.errors:
            raise next(iter(self.errors.values()))
        for a in self.agents.values():
            a.close()
            a.sock.close()
            if a.digest:
                a.digest.close()

    def totals(self) -> dict:
        out: dict = {}
        for a in self.agents.values():
            for k, v in a.stats.items():
                out[k] = out.get(k, 0) + v
        return out


def train(bed_topo, args, tmp_path, init, grad_fn, steps, *, kill_after=(), seed=0, before_workers=None,
          after_step=None, **worker_kw) -> Workers:
    """The optimizer node (CLI args `args`) and the job's workers to the last step; the node must
    exit 0. With kill_after, the node is killed (SIGKILL) a random moment after each of those steps
    and restarted, and must say that it resumes. before_workers() runs once the node is up;
    after_step = (s, fn): fn() runs once the workers finished step s, while the others run."""
    b, topo = bed_topo
    rng = random.Random(seed)
    node = NodeProcess(b.hosts["opt1"], args, tmp_path / "node.log").start()
    try:
        if before_workers:
            before_workers()
        workers = Workers(b, topo, init, grad_fn, steps, **worker_kw).start()
        if after_step:
            workers.wait_step(after_step[0])
            after_step[1]()
        for step in kill_after:
            workers.wait_step(step)
            time.sleep(rng.uniform(0, 0.06))  # somewhere inside the next step, or at its end
            node.kill()
            time.sleep(0.3)  # workers time out and retransmit into the void meanwhile
            node = NodeProcess(b.hosts["opt1"], args, tmp_path / "node.log").start()
            assert "resuming after step" in node.banner
        workers.join()
        assert node.finish() == 0
    finally:
        node.stop()
    return workers


def check_against(ref, workers, tmp_path, master=True, mismatches: dict[int, int] | None = None) -> dict:
    """Every worker's parameters (and the node's exported master) bit-identical to the reference
    run, and no worker's digest check found its parameters differing from the node's in any step
    but the `mismatches` ({worker: count}) a test injected: the check repairs what it finds, so a
    divergence would otherwise end bit-identical and pass unseen. Returns the node's stats."""
    found = {w: a.stats["digest_mismatches"] for w, a in getattr(workers, "agents", {}).items()
             if a.stats["digest_mismatches"]}
    assert found == (mismatches or {}), (
        f"digest mismatches {found} (expected {mismatches or {}}): a worker's parameters differed from the "
        f"node's in a step (the check repaired them; the worker's stderr names the step and chunks)")
    differ = sorted(w for w, params in workers.results.items() if not same_bits(params, ref.params))
    master_differs = master and not same_bits(load_npz(tmp_path / "final.npz"), ref.master)
    # All of it in one line: one worker differing alone (it took other parameters than the rest) and
    # every worker with the node's master (the sums or the update differed) are different bugs.
    assert not differ and not master_differs, (
        f"workers {differ} of {sorted(workers.results)} differ from the reference; the node's master "
        f"{'differs' if master_differs else 'matches' if master else 'not checked'}; "
        f"node stats {(tmp_path / 'stats.json').read_text() if (tmp_path / 'stats.json').exists() else 'absent'}")
    return load_stats(tmp_path / "stats.json")


def load_stats(path) -> dict:
    return json.loads(open(path).read())


def load_npz(path) -> dict:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}
