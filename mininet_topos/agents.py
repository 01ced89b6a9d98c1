"""The agents of a run, each a process inside its Mininet host: an optimizer node per job, then
the workers. Every process is recorded in the run state before the next one starts."""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
from dataclasses import dataclass, field

import numpy as np

from host_agent import agent_args, state
from host_agent.node import UP_LINE
from host_agent.optim import ConfigError, OptimizerConfig
from mindp import progress, topology, workload

from .config import RunConfig
from .console import RunError, how_it_ended, one_line
from .placement import Placement, taskset
from .progress import LogTail
from .runstate import RunState

REPO = pathlib.Path(__file__).resolve().parent.parent
#: Seconds a starting optimizer node may go without using CPU or writing its log.
START_STALL = 30.0


@dataclass
class HostProc:
    name: str
    proc: subprocess.Popen
    log: pathlib.Path
    tail: LogTail = field(init=False)

    def __post_init__(self):
        self.tail = LogTail(self.log)

    def last_error(self) -> str:
        """The last line of its log that is not a progress record."""
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        for line in reversed(lines):
            if line.strip() and not line.startswith("{"):
                return line.strip()
        return ""


#: A node's state directory in a job directory; a sharded job's are STATE-shard<i> (NodeFiles).
STATE = "optimizer-state"


@dataclass
class NodeFiles:
    """A job's optimizer node files in its directory: its one node's, or each shard's (state,
    export, stats), and the shards' joined as one node's."""
    job: topology.JobSpec
    dir: pathlib.Path

    @property
    def master_path(self) -> pathlib.Path:
        return self.dir / "optimizer-master.npz"

    @property
    def opt_stats_path(self) -> pathlib.Path:
        return self.dir / "optimizer-stats.json"

    def shard_suffix(self, i: int) -> str:
        """'' for a job's one node; '-shard<i>' for each of a sharded job's nodes (state, export, stats)."""
        return f"-shard{i}" if self.job.sharded else ""

    def state_dir(self, i: int) -> pathlib.Path:
        return self.dir / f"{STATE}{self.shard_suffix(i)}"

    def shard_master_path(self, i: int) -> pathlib.Path:
        return self.dir / f"optimizer-master{self.shard_suffix(i)}.npz"

    def shard_stats_path(self, i: int) -> pathlib.Path:
        return self.dir / f"optimizer-stats{self.shard_suffix(i)}.json"

    def join_shards(self, layout) -> None:
        """A sharded job: the shards' exports as the job's one master, their stats as one node's
        (what a report reads: frames summed, the step every shard committed, the steps any
        skipped); RunError (one line) when they cannot be joined."""
        n = len(self.job.optimizers)
        try:
            joined = state.join_exports([self.shard_master_path(i) for i in range(n)], layout)
            each = [json.loads(self.shard_stats_path(i).read_text()) for i in range(n)]
        except (OSError, ValueError, ConfigError) as exc:
            raise RunError(f"job {self.job.job_id}: cannot join the shards' exports: {one_line(str(exc))}") from None
        np.savez(self.master_path, **joined)
        total = {k: sum(s.get(k, 0) for s in each) for k in ("params_sent", "resent")}
        committed = [s["committed"] for s in each if "committed" in s]
        self.opt_stats_path.write_text(json.dumps({
            **total, **({"committed": min(committed)} if len(committed) == n else {}),
            "nonfinite": sorted({tuple(x) for s in each for x in s.get("nonfinite", [])}),
            "shards": each}, indent=1) + "\n")


@dataclass
class JobFiles(NodeFiles):
    wl: workload.WorkloadConfig
    init: dict[str, np.ndarray]
    first_step: int = 0  # RESUME: the step after the node's commit
    worker_init: pathlib.Path | None = None  # RESUME: the parameters the node committed (else init.npz)

    @property
    def init_path(self) -> pathlib.Path:
        return self.dir / "init.npz"

    def worker_out(self, w: int) -> pathlib.Path:
        return self.dir / f"worker{w}-params.npz"


class Agents:
    """Starts, watches and stops the run's agent processes."""

    def __init__(self, net, state: RunState, logs: pathlib.Path, topo: topology.Topology,
                 topo_path: pathlib.Path, cfg: RunConfig, opt: OptimizerConfig, placement: Placement | None = None):
        """placement (PIN): each node's and worker's core, in the order they start; None: the kernel's."""
        self.net = net
        self.placement = placement
        self.state = state
        self.logs = logs
        self.topo = topo
        self.topo_path = topo_path
        self.cfg = cfg
        self.opt = opt
        self.procs: list[HostProc] = []
        self.optimizers: list[HostProc] = []
        self.workers: list[HostProc] = []

    def _popen(self, host_name: str, name: str, args: list[str], cpu: int | None = None) -> HostProc:
        host = self.net.get(host_name)
        log = self.logs / f"{name}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(log, "wb") as f:
            proc = host.popen([*taskset(cpu), sys.executable, *args], stdin=subprocess.DEVNULL, stdout=f,
                              stderr=subprocess.STDOUT, cwd=str(REPO), env=env)
        self.state.add_proc(proc.pid, f"{name} in {host_name}", True)
        hp = HostProc(name, proc, log)
        self.procs.append(hp)
        return hp

    def _faults(self, host_name: str) -> list[str]:
        """Loss injection, seeded per host (by its place in the topology: its port on a single switch)."""
        if not self.cfg.loss:
            return []
        return ["--drop-send", str(self.cfg.loss), "--drop-recv", str(self.cfg.loss),
                "--fault-seed", str(agent_args.host_fault_seed(self.cfg.seed, self.topo.hosts, host_name))]

    def start(self, jobs: list[JobFiles]) -> None:
        optimizers = []
        for jf in jobs:
            job = jf.job
            for i, opt_name in enumerate(job.optimizers):  # a sharded job: one node per chunk range
                sfx = jf.shard_suffix(i)
                optimizers.append(self._popen(opt_name, f"optimizer-job{job.job_id}{sfx}", [
                    "-m", "host_agent.node", "--iface", "eth0", "--topology", str(self.topo_path),
                    "--job", str(job.job_id), "--state-dir", str(jf.state_dir(i)),
                    "--init", str(jf.init_path), "--optimizer", self.opt.kind, "--lr", str(self.opt.lr),
                    "--weight-decay", str(self.opt.weight_decay), "--ram-budget", str(self.cfg.node_ram),
                    "--sync", self.cfg.sync, "--export", str(jf.shard_master_path(i)), "--stats", str(jf.shard_stats_path(i)), "--step-lines",
                    *(["--shard", str(i)] if job.sharded else []), *self._faults(opt_name)],
                    self.node_cpu(len(optimizers))))
        self.optimizers = optimizers
        self.wait_started(optimizers)
        for jf in jobs:
            for w, host_name in sorted(jf.job.workers.items()):
                self.workers.append(self._popen(host_name, f"worker-job{jf.job.job_id}-{w}", [
                    "-m", "mininet_topos.trainer", "--topology", str(self.topo_path), "--job", str(jf.job.job_id),
                    "--worker", str(w), "--workload", str(jf.dir / "workload.json"),
                    "--init", str(jf.worker_init or jf.init_path), "--first-step", str(jf.first_step),
                    "--steps", str(self.cfg.steps), "--out", str(jf.worker_out(w)),
                    *(["--eval-every", str(self.cfg.eval_every)] if w == 0 else []), *self._faults(host_name)],
                    self.worker_cpu(len(self.workers))))

    def node_cpu(self, i: int) -> int | None:
        """The core of the i-th node started (PIN), or None."""
        return self.placement.node(i) if self.placement else None

    def worker_cpu(self, i: int) -> int | None:
        return self.placement.worker(i) if self.placement else None

    def wait_started(self, optimizers: list[HostProc]) -> None:
        """Until each node has opened its state and socket (its first line)."""
        for hp in optimizers:
            def up(hp=hp) -> bool:
                if hp.proc.poll() is not None:
                    raise RunError(f"{hp.name} exited with code {hp.proc.returncode}: {hp.last_error()}; see {hp.log}")
                return UP_LINE in hp.log.read_text(errors="replace")

            try:  # as long as it starts up (CPU, log): a busy machine is slow, not broken
                progress.wait(up, progress.both(progress.activity(hp.proc.pid), progress.file_sizes(hp.log)),
                              stall=START_STALL, poll=0.05, what=f"{hp.name} start")
            except progress.Stalled as exc:
                raise RunError(f"{exc}; see {hp.log}") from None

    def popen_root(self, name: str, args: list[str], env: dict) -> HostProc:
        """A process in the root namespace (its own session, stopped with its children by close())."""
        log = self.logs / f"{name}.log"
        with open(log, "wb") as f:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, cwd=str(REPO),
                                    env={**os.environ, "PYTHONUNBUFFERED": "1", **env}, start_new_session=True)
        self.state.add_proc(proc.pid, name, True)
        hp = HostProc(name, proc, log)
        self.procs.append(hp)
        return hp

    def check_alive(self) -> None:
        for hp in [*self.workers, *self.optimizers]:
            rc = hp.proc.poll()
            if rc not in (None, 0) or (rc == 0 and hp in self.optimizers):  # a node serves until told to stop
                why = "" if rc < 0 else f": {hp.last_error() or 'no message'}"  # a signal's victim said nothing
                raise RunError(f"{hp.name} failed ({how_it_ended(rc)}){why}; see {hp.log}")

    def workers_exited(self) -> bool:
        return all(hp.proc.poll() is not None for hp in self.workers)

    def stop_optimizers(self) -> None:
        """SIGTERM: each node exports its state and exits 0."""
        for hp in self.optimizers:
            if hp.proc.poll() is None:
                hp.proc.send_signal(signal.SIGTERM)
        for hp in self.optimizers:
            try:
                hp.proc.wait(30)
            except subprocess.TimeoutExpired:
                raise RunError(f"{hp.name} did not stop after the last step; see {hp.log}") from None
            if hp.proc.returncode != 0:
                raise RunError(f"{hp.name} failed (exit {hp.proc.returncode}): {hp.last_error()}; see {hp.log}")

    def close(self) -> None:
        for hp in self.procs:
            if hp.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(hp.proc.pid, signal.SIGTERM)
                    os.killpg(hp.proc.pid, signal.SIGCONT)  # a stopped process handles it only once continued
        for hp in self.procs:
            try:
                hp.proc.wait(3)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(hp.proc.pid, signal.SIGKILL)
                hp.proc.wait(3)
