"""`make run SCRIPT=train.py ARGS='...'`: a user's torchrun script (mindp.torch.init) on every worker
host of the Mininet network.

1. describe: the script runs once as rank 0 without a network (MINDP_DESCRIBE, under
   mindp.torch.describe: a torch.distributed group it makes is inert): its initial parameters and
   optimizer (AdamW/SGD, hyper-parameters, lr schedule) land in job1/spec/;
2. the optimizer node starts on its host from them (--init, --optimizer-spec);
3. one torchrun in the root namespace starts a rank per worker (rendezvous on the loopback), and
   mindp.torch.launch moves rank r into worker r's host (mnexec -a, the host's PID);
4. each rank's mindp.torch writes its per-step figures (clock, frames, retransmissions; the loss
   of mindp.torch.log) to logs/ranks/rank<r>.jsonl: they are the progress line, metrics.csv and the
   curve, as for the built-in models; rank 0's output is shown prefixed [rank0] (its JSON lines
   {"step": s, "loss": x} count as mindp.torch.log calls); a failing rank is named in one line
   (mininet_topos.rankerrors); at the end the node's final weights are compared with the reference
   the script defines (mindp_reference), or the loss curve is reported when it defines none.
"""
from __future__ import annotations

import json
import os
import pathlib
import shlex
import subprocess
import sys
import time
import traceback

import numpy as np

from host_agent import optim
from mindp import progress as pace, protocol
from mindp.torch.launch import LOSS_ENV, PIN_CPUS_ENV, SEED_ENV

from . import metrics, rankerrors, results, resume
from .agents import REPO, Agents, NodeFiles
from .console import Pace, ProgressLine, RunError, one_line
from .progress import LogTail, Progress, three_digits
from .star import STALL_SECONDS, Run


#: In a resumed run's job1/: the steps at which each rank's process started in the runs before it.
RANK_STARTS = "rank-starts.json"
#: In a resumed run's job1/: the lr of each step the runs before it told the node (follow_lr).
TOLD_LRS = "told-lrs.json"
#: In a resumed run's job1/: the script's arguments from each step on, this run's last (ARGS may
#: change on RESUME).
ARGS_FROM = "args-from.json"


def _rank_records(run_dir: pathlib.Path):
    """The JSON records of the ranks' logs in logs/ranks/ (mindp.torch's), each a dict."""
    for log in sorted((run_dir / "logs" / "ranks").glob("rank*.jsonl")):
        for line in log.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:  # a line cut short by a killed rank
                continue
            if isinstance(rec, dict):
                yield rec


def rank_starts(run_dir: pathlib.Path) -> dict[int, list[int]]:
    """Rank -> the steps at which its process started, in the run at `run_dir` (the `start` of each
    rank's ready line) and in the runs it resumed: what the script's reference needs to replay each
    rank's random draws (mindp.torch.scriptref.RankStreams)."""
    starts: dict[int, set[int]] = {}
    inherited = run_dir / "job1" / RANK_STARTS
    if inherited.exists():
        for rank, steps in json.loads(inherited.read_text()).items():
            starts.setdefault(int(rank), set()).update(steps)
    for rec in _rank_records(run_dir):
        if "start" in rec:
            starts.setdefault(int(rec["worker"]), set()).add(int(rec["start"]))
    return {rank: sorted(steps) for rank, steps in sorted(starts.items())}


def _lrs(v) -> tuple[float, ...]:
    return tuple(float(x) for x in v) if isinstance(v, list) else (float(v),)


def told_lrs(run_dir: pathlib.Path) -> dict[int, tuple[float, ...]]:
    """Step -> the lrs rank 0 told the node for it, a parameter group each (a script following its
    own lr: its step records' `lrs`, or `lr` for one group), in the run at `run_dir` and in the
    runs it resumed: the reference applies the same."""
    lrs: dict[int, tuple[float, ...]] = {}
    inherited = run_dir / "job1" / TOLD_LRS
    if inherited.exists():
        lrs.update({int(s): _lrs(v) for s, v in json.loads(inherited.read_text()).items()})
    for rec in _rank_records(run_dir):
        if rec.get("ev") == "step" and "lr" in rec and rec.get("worker") == 0:
            lrs[int(rec["step"])] = _lrs(rec.get("lrs", rec["lr"]))
    return dict(sorted(lrs.items()))


def args_from(run_dir: pathlib.Path) -> dict[int, list[str]]:
    """Step -> the script's arguments from that step on, in the run at `run_dir` and the runs it
    resumed: the reference replays each step with the arguments it ran with."""
    recorded = run_dir / "job1" / ARGS_FROM
    if recorded.exists():
        return {int(s): list(a) for s, a in json.loads(recorded.read_text()).items()}
    return {0: shlex.split(json.loads((run_dir / "config.json").read_text()).get("script_args", ""))}


class ScriptRun(Run):
    """Run with the user's script in place of the built-in trainer (one job, one switch)."""

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.cfg.script_args)

    @property
    def job(self):
        return self.topo.jobs[0]

    def script_topology(self, chunks: int):
        """The run's topology, once the describe run gave the model's `chunks`."""
        return self.topo

    def prepare_files(self) -> None:
        (self.dir / "config.json").write_text(json.dumps({**self.cfg.recorded(), "target": self.target, "k": protocol.K}, indent=1) + "\n")
        self.job_dir = self.dir / "job1"
        self.spec_dir = self.job_dir / "spec"
        self.job_dir.mkdir()
        env = {**os.environ, "MINDP_DESCRIBE": str(self.spec_dir), "RANK": "0", "LOCAL_RANK": "0",
               "WORLD_SIZE": str(self.cfg.total_workers), "OMP_NUM_THREADS": "1"}
        log = self.logs / "describe.log"
        with open(log, "wb") as f:
            rc = subprocess.run([sys.executable, "-m", "mindp.torch.describe", self.cfg.script, *self.argv],
                                stdin=subprocess.DEVNULL, stdout=f,
                                stderr=subprocess.STDOUT, env=env, cwd=str(REPO)).returncode
        if rc != 0 or not (self.spec_dir / "optimizer.json").exists():
            text = log.read_text(errors="replace")
            last = [ln for ln in text.splitlines() if ln.strip()][-1:] or ["no output"]
            called = "mindp.torch.init" in text  # init refused the script: its line says why
            raise RunError(f"the script's describe run failed (exit {rc}"
                           f"{'' if called else ', does it call mindp.torch.init?'}): {one_line(last[0])}; see {log}")
        self.layout = optim.layout_of(optim.load_npz(self.spec_dir / "init.npz"))
        self.topo = self.script_topology(self.layout.n_chunks)
        self.topo.dump(self.topo_path)
        self.files = NodeFiles(self.job, self.job_dir)
        self.resume_step = 0
        if self.resumed:  # the node resumes on a copy of the earlier run's state; the ranks take its step
            resume.check_script(self.resumed, 1, optim.OptimizerConfig.from_dict(
                json.loads((self.spec_dir / "optimizer.json").read_text())), self.layout)
            self.resume_step, _ = resume.take_state(self.resumed, 1, self.job_dir)
            (self.job_dir / RANK_STARTS).write_text(json.dumps(rank_starts(self.resumed.run)) + "\n")
            (self.job_dir / TOLD_LRS).write_text(json.dumps(told_lrs(self.resumed.run)) + "\n")
            before = {s: a for s, a in args_from(self.resumed.run).items() if s < self.resume_step}
            (self.job_dir / ARGS_FROM).write_text(json.dumps({**before, self.resume_step: self.argv}) + "\n")

    def first_step(self) -> int:
        return self.resume_step

    def model_text(self) -> str:
        init = optim.load_npz(self.spec_dir / "init.npz")
        cfg = json.loads((self.spec_dir / "optimizer.json").read_text())
        sched = cfg["schedule"]["kind"]
        lr = "the lr its script sets (follow_lr)" if sched == "script" else f"lr {cfg['lr']:g}, schedule {sched}"
        groups = f", {1 + len(cfg['groups'])} parameter groups" if cfg.get("groups") else ""
        return (f"{os.path.basename(self.cfg.script)} ({sum(a.size for a in init.values()):,} parameters, "
                f"{cfg['kind']} {lr}{groups})")

    def start_agents(self) -> None:
        self.start_node()
        self.start_ranks()

    @property
    def rank_env(self) -> dict[str, str]:
        """What every rank's mindp.torch.init reads: topology, job, node state (every shard's), where
        its figures go, the run's K."""
        states = os.pathsep.join(str(self.files.state_dir(i)) for i in range(len(self.job.optimizers)))
        return {"MINDP_TOPOLOGY": str(self.topo_path), "MINDP_JOB": "1", "MINDP_STATE": states,
                "MINDP_IFACE": "eth0", "OMP_NUM_THREADS": "1",
                "MINDP_METRICS": str(self.logs / "ranks"), "MINDP_K": str(protocol.K),  # UP=1's printed commands too
                **({LOSS_ENV: str(self.cfg.loss), SEED_ENV: str(self.cfg.seed)} if self.cfg.loss else {})}

    def start_node(self) -> None:
        """The job's optimizer node, or a node per shard (each owning a chunk range)."""
        self.agents = a = Agents(self.net, self.state, self.logs, self.topo, self.topo_path, self.cfg, self.opt,
                                 self.placement)
        self.metrics_dir = self.logs / "ranks"
        f = self.files
        nodes = [a._popen(host, f"optimizer-job1{f.shard_suffix(i)}", [
            "-m", "host_agent.node", "--iface", "eth0", "--topology", str(self.topo_path), "--job", "1",
            "--state-dir", str(f.state_dir(i)), "--init", str(self.spec_dir / "init.npz"),
            "--optimizer-spec", str(self.spec_dir / "optimizer.json"), "--ram-budget", str(self.cfg.node_ram),
            "--sync", self.cfg.sync, "--export", str(f.shard_master_path(i)), "--stats", str(f.shard_stats_path(i)),
            "--step-lines", *(["--shard", str(i)] if self.job.sharded else []), *a._faults(host)], a.node_cpu(i))
            for i, host in enumerate(self.job.optimizers)]
        a.optimizers = nodes
        a.wait_started(nodes)


    def start_ranks(self) -> None:
        a = self.agents
        pids = self.dir / "host-pids.json"
        pids.write_text(json.dumps({h: self.net.get(h).pid for h in self.job.workers.values()}))
        n = self.job.n_workers
        self.rank_lines = rankerrors.RankLines()  # torchrun's log -> each rank's lines, whole
        # Kept out of a.workers: its end is read here (the first failing rank), not as an agent's exit.
        self.torchrun = a.popen_root("torchrun", [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(n), "--log-dir", str(self.logs / "torchrun"),  # not a dir of its own in /tmp
            "--tee", "3",  # each rank's lines prefixed [default<r>]: in torchrun.log, and in its own files
            "-m", "mindp.torch.launch", "--host-pids", str(pids), "--script", self.cfg.script, *self.argv],
            {**self.rank_env, **self.rank_cores()})

    def rank_cores(self) -> dict[str, str]:
        """PIN: rank r's core, the r-th of a list mindp.torch.launch reads."""
        p = self.placement
        return {PIN_CPUS_ENV: ",".join(str(p.worker(r)) for r in range(self.job.n_workers))} if p else {}

    def show(self, line: str, progress: Progress, tty: bool) -> None:
        """A line of torchrun's log: rank 0's JSON {"loss", ...} feeds the curve (Progress.feed_output, as
        mindp.torch.log does); its other lines are shown prefixed [rank0]; other ranks' stay in the log."""
        for rank, text in self.rank_lines.feed(line):
            if rank == 0 and not progress.feed_output(text):
                self.console.say(("\r\x1b[K" if tty else "") + "[rank0] " + text)

    def train(self) -> tuple[Progress, float]:
        """Follow the ranks' figures and rank 0's output until torchrun exits; stalls follow progress."""
        hp = self.torchrun
        self.progress = progress = Progress({1: self.job.n_workers}, 0)  # the script's own step count
        tails = [LogTail(self.metrics_dir / f"rank{r}.jsonl") for r in range(self.job.n_workers)]
        t0 = time.monotonic()
        bar = ProgressLine(self.console, indent="  ")
        watch = pace.StallWatch(pace.activity(hp.proc.pid, *(o.proc.pid for o in self.agents.optimizers)),
                                STALL_SECONDS)
        while True:
            for tail in tails + [o.tail for o in self.agents.optimizers]:  # the node's lines: its commits
                for line in tail.lines():
                    progress.feed(line)
            for line in hp.tail.lines():
                self.show(line, progress, bar.tty)
            rc = hp.proc.poll()
            if rc is not None:
                break
            self.check_alive()  # the switch and the node
            self.probe_switch(progress)
            self.read_switch_cpu(progress)
            watch.look(progress.step)
            if watch.stalled():
                raise self.stalled()
            bar.show(progress.step, progress.bar())
            time.sleep(0.2)
        for line in hp.tail.lines():
            self.show(line, progress, bar.tty)
        for tail in tails + [o.tail for o in self.agents.optimizers]:
            for line in tail.lines():
                progress.feed(line)
        self.read_switch_cpu(progress)
        bar.end(progress.bar())
        if rc != 0:
            why = rankerrors.first_failure(self.logs / "torchrun", hp.log) or f"torchrun exit {rc}"
            raise RunError(f"the script failed: {why}; see {hp.log}")
        self.stop_nodes()
        return progress, progress.span() or (time.monotonic() - t0)  # torchrun's start-up is not training

    def stop_nodes(self) -> None:
        """The job's node(s) told to end; a sharded job's exports and stats joined as one node's."""
        self.agents.stop_optimizers()
        if self.job.sharded:
            self.files.join_shards(self.layout)

    def report(self, progress: Progress, wall: float, setup: float, model: str) -> int:
        """summary.json, curve.svg, metrics.csv and the comparison with the script's reference; exit 0
        when bit-exact (or when the script defines no reference: then the loss curve is the result), 1
        when it differs or the reference fails."""
        master = optim.load_npz(self.files.master_path)
        stats_path = self.files.opt_stats_path
        stats = json.loads(stats_path.read_text()) if stats_path.exists() else {}
        done = int(stats.get("committed", progress.step - 1)) + 1  # the node's steps: a stopped run has fewer
        from mindp.torch import scriptref  # torch: imported by SCRIPT= runs only (make torch)

        table = self.draw(progress, model)  # first: a run stopped during the check keeps them
        check = Pace(self.console, "reference", done,
                     header=f"  training the script's mindp_reference in this process ({done} steps) to compare bits")
        diff = None  # not compared: CHECK=0, no reference in the script, or one that failed
        unchecked = None if self.cfg.check else results.NOT_CHECKED  # summary.json's not_compared: why
        if self.cfg.check:
            follows = json.loads((self.spec_dir / "optimizer.json").read_text())["schedule"]["kind"] == "script"
            argv, starts, lrs = args_from(self.dir), rank_starts(self.dir), told_lrs(self.dir) if follows else None
            try:
                ref = scriptref.script_reference(self.cfg.script, self.job.n_workers, argv, steps=done, starts=starts,
                                                 told_lrs=lrs, on_step=check)
            except scriptref.NoReference:
                ref = None
            except (Exception, SystemExit) as exc:  # the script's code runs in it (argparse exits): blamed on it
                ref, unchecked = None, self.reference_failed(exc)
            if ref is not None:
                diff = max(float(np.max(np.abs(master[n] - ref.master[n]))) if master[n].size else 0.0 for n in master)
                check.end()
        curve = progress.curves[1]
        summ = {"script": self.cfg.script, "args": self.argv, "target": self.target, "k": protocol.K, "workers": self.job.n_workers,
                "model": model, "steps": progress.step, **results.faults(self.cfg.loss, self.cfg.seed),
                "loss_curve": [[s, x] for s, x in zip(curve.steps, curve.loss)],  # s: the script's 0-based step
                "packets_sent": progress.packets + int(stats.get("params_sent", 0)),
                "retransmissions": progress.retransmissions + int(stats.get("resent", 0)),
                "wall_seconds": round(wall, 2),
                "steps_per_second": round((progress.step - self.resume_step) / wall, 3) if wall else 0.0,
                "setup_seconds": round(setup, 2), "max_abs_param_diff_vs_reference": diff,
                **({"not_compared": unchecked} if unchecked else {}),
                "skipped_steps": results.skipped_steps(stats), **metrics.timing(table), **metrics.cpu(progress),
                **results.digest_counts([w.done for w in progress.workers.values()]),  # the ranks' exit records
                **({"resumed_from": {"run": str(self.resumed.run), "first_step": self.resume_step}}
                   if self.resumed else {})}
        results.write_summary(self.dir / "summary.json", summ)
        self.console.say(f"\nsummary ({self.dir / 'summary.json'}):")
        if curve.loss:
            self.console.say(f"  loss {curve.loss[0]:.4f} (step {curve.steps[0]}) -> {curve.loss[-1]:.4f} "
                             f"(step {curve.steps[-1]})")
        self.console.say(f"  {progress.step - self.resume_step} steps in {three_digits(wall)} s, "
                         f"{summ['packets_sent']:,} frames, "
                         f"{summ['retransmissions']} retransmitted; curve: {self.dir / 'curve.svg'}, "
                         f"metrics: {self.dir / 'metrics.csv'}")
        for line in (results.cpu_line(summ), results.skipped_line(summ["skipped_steps"]),
                     results.digest_warning(summ, self.logs)):
            if line:
                self.console.say(line)
        if not self.cfg.check:
            self.console.say("  not compared with the script's reference (CHECK=0)")
            return 0
        if unchecked:
            self.console.fail(f"the check could not run: {unchecked}; traceback in {self.reference_log}")
            return 1
        if diff is None:
            self.console.say("  the script defines no mindp_reference(argv): no reference to compare with "
                             "(docs/TORCH.md)")
            return 0
        self.console.say(f"  final weights after {done} step(s) " + ("bit-exact with the script's single-process reference" if diff == 0.0
                                               else f"DIFFER from the script's reference (max |diff| {diff:g})"))
        return 0 if diff == 0.0 else 1

    @property
    def reference_log(self) -> pathlib.Path:
        return self.logs / "reference.log"

    def reference_failed(self, exc: BaseException) -> str:
        """Why the script's reference could not be compared, in one line; the traceback, which shows
        the part of mindp_reference at fault, goes to reference_log."""
        self.reference_log.write_text("".join(traceback.format_exception(exc)))
        said = one_line(str(exc))
        return f"the script's mindp_reference failed ({type(exc).__name__}{': ' + said if said else ''})"
