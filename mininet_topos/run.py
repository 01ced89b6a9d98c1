"""`make run`: Mininet + P4 switch + controller + optimizer node + workers train a model.

    python -m mininet_topos.run --target auto --model mlp --workers 4 --steps 60 --loss 0 --jobs 1 --seed 0

Everything the run starts is recorded in build/run-state.json before the next
thing starts, so `python -m mininet_topos.stop` (make stop) can remove it after
a crash. Each run writes runs/<timestamp>/: summary.json, curve.svg,
topology.json, logs/ (every process), pcaps/ (PCAP=1), and per job the
workload, initial parameters and final parameters. The agent processes are
started and watched by mininet_topos.agents; what the run prints (and keeps in
logs/run.log) goes through mininet_topos.console.
"""
from __future__ import annotations

import os

# Bits must agree with the reference trainer: one BLAS thread everywhere (before numpy loads).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import numpy as np  # noqa: E402

from host_agent import optim  # noqa: E402
from host_agent.optim import OptimizerConfig  # noqa: E402
from mindp import progress as pace, protocol, targets, topology, workload  # noqa: E402

from . import clean, config, metrics, results, resume  # noqa: E402
from .agents import Agents, JobFiles  # noqa: E402
from .console import Console, ProgressLine, RunError, Stopped, how_it_ended, one_line  # noqa: E402
from .preflight import claim_state, new_run_dir, p4_program, preflight, target_reason  # noqa: E402
from .progress import Progress  # noqa: E402
from .runstate import DEFAULT_PATH, RunState  # noqa: E402

WEIGHT_DECAY = 0.01
# No step anywhere and no CPU used by any agent for this long: the run is stuck. A slow step (a
# loaded machine, BMv2) keeps its agents busy; one that gets no parameters ends in its workers'
# own deadline (RtoConfig.deadline), which names the missing chunks.
STALL_SECONDS = 60.0
# Every PROBE_SECONDS the controller reads a counter, which the switch must answer within
# SWITCH_DEADLINE: a hung switch (alive, but not answering) ends the run as a crashed one does.
PROBE_SECONDS = 2.0
DROPS_SECONDS = 1.0
SWITCH_DEADLINE = 5.0
CRASH_GRACE = 2.0
SLOW_TEARDOWN = 10.0  # s: docs/RUN.md promises a run ends within this of its last step or a stop


def _raise_stopped(signum, frame):
    raise Stopped(signal.Signals(signum).name)


def if_prefix(text: str) -> str:
    if not re.fullmatch(r"[a-z][a-z0-9-]{0,5}", text):
        raise argparse.ArgumentTypeError("1..6 characters: a lowercase letter, then letters, digits or '-'")
    return text


P_DEFAULTS = f"{protocol.HARDWARE_K} on BMv2, {protocol.DEFAULT_K} on the embedded switch"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mininet_topos.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="auto", help="auto|bmv2|embedded|embedded-python (auto: BMv2 when installed)")
    p.add_argument("--k", default="", help=f"elements a frame (default: {P_DEFAULTS})")
    p.add_argument("--model", default="mlp", help="mlp|cnn|gpt (cnn, gpt: PyTorch, the torch extra)")
    p.add_argument("--workers", default="4", help="workers per job")
    p.add_argument("--steps", default="60")
    p.add_argument("--loss", default="0", help="loss rate injected on every host's send and receive paths")
    p.add_argument("--jobs", default="1", help="1, or 2 jobs sharing the switch")
    p.add_argument("--seed", default="0")
    p.add_argument("--pcap", default="0", help="1: per-port pcaps in runs/<ts>/pcaps/")
    p.add_argument("--hidden", default="64", help="MLP hidden units")
    p.add_argument("--batch", default="32", help="examples per worker and step")
    p.add_argument("--lr", default="auto", help="AdamW learning rate (auto: 0.01, gpt 0.003)")
    p.add_argument("--slots", default="auto", help="aggregation slots per job, its window of chunks in flight "
                   "(auto: 512 on the embedded switch, half its pool; 64 on BMv2)")
    p.add_argument("--grpc-port", default="9559")
    p.add_argument("--thrift-port", default="9090", help="the switch's Thrift runtime port (simple_switch_CLI)")
    p.add_argument("--p4", choices=("auto", "compile", "committed"), default="auto",
                   help="auto: p4src/compiled/ while it matches p4src/, else compile with p4c")
    p.add_argument("--runs-dir", default="runs")
    p.add_argument("--state-file", default=str(DEFAULT_PATH))
    p.add_argument("--cli", default="auto",
                   help="1: the Mininet CLI after training; 0: never; auto: when stdin and stdout are a terminal")
    p.add_argument("--log", default="off", help="switch log level off|info|debug|trace (debug, trace: every packet)")
    p.add_argument("--topo", default="star", help="star: one switch; leafspine: LEAVES leaves under a spine")
    p.add_argument("--leaves", default="1", help="leafspine: leaf switches, each with --workers workers")
    p.add_argument("--optimizers", default="1", help="leafspine: optimizer nodes (shards) on the spine")
    p.add_argument("--script", default="", help="a torchrun script using mindp.torch.init (docs/TORCH.md)")
    p.add_argument("--args", default="", help="the script's arguments, one string (--args='--steps=3')")
    p.add_argument("--resume", default="", help="continue this earlier run (a directory or a name under runs/)")
    p.add_argument("--up", action="store_true", help="with --script: start no ranks; print a torchrun command per host")
    p.add_argument("--given", default="", help="make variables set explicitly (refused where this run ignores them)")
    p.add_argument("--eval", default="1", help="worker 0 evaluates the model every N-th step (0: only before the "
                   "first and after the last)")
    p.add_argument("--gpt", default="", help='MODEL=gpt: its size as JSON, e.g. \'{"d": 64, "layers": 2}\'')
    p.add_argument("--node-ram", default=config.NODE_RAM_DEFAULT, help="each optimizer node's RAM budget for its state (64M, 2G, ...; "
                   "a state over half of it runs out of core)")
    p.add_argument("--if-prefix", default="mnr-", type=if_prefix,
                   help="prefix of the switch-side interface names (<prefix>p<port>)")
    return p


# --- the run --------------------------------------------------------------------

class Run:
    resumed: resume.Resumed | None = None  # RESUME: the earlier run this one continues

    def __init__(self, cfg: config.RunConfig, target: str, run_dir: pathlib.Path, state: RunState, p4_mode: str,
                 console: Console, if_prefix: str = "mnr-"):
        self.cfg = cfg
        self.if_prefix = if_prefix
        self.target = target
        self.dir = run_dir
        self.logs = run_dir / "logs"
        self.logs.mkdir()
        self.console = console
        console.log = self.logs / "run.log"
        self.state = state
        self.p4_mode = p4_mode
        self.net = None
        self.switch = None
        self.ctl = None
        self.agents: Agents | None = None
        self.opt = OptimizerConfig(kind="adamw", lr=cfg.lr, weight_decay=WEIGHT_DECAY)
        self.topo = topology.star([cfg.workers] * cfg.jobs, cfg.slots, f"127.0.0.1:{cfg.grpc_port}")
        self.topo_path = run_dir / "topology.json"
        self.jobs: list[JobFiles] = []
        self.probed = 0.0
        self.progress: Progress | None = None  # while training: what a stopped run keeps (keep_partial)

    def network_text(self) -> str:
        return f"switch {self.topo.switch.name} ({self.target}, gRPC {self.topo.switch.grpc_addr})"

    # -- setup --

    def prepare_files(self) -> None:
        self.topo.dump(self.topo_path)
        (self.dir / "config.json").write_text(json.dumps({**self.cfg.to_dict(), "target": self.target, "k": protocol.K}, indent=1) + "\n")
        for job in self.topo.jobs:
            d = self.dir / f"job{job.job_id}"
            d.mkdir()
            wl = workload.WorkloadConfig(n_workers=job.n_workers, seed=self.cfg.seed + job.job_id - 1,
                                         hidden=self.cfg.hidden, batch=self.cfg.batch, model=self.cfg.model,
                                         model_args=self.cfg.model_args)
            wl.dump(d / "workload.json")
            jf = JobFiles(job, d, wl, workload.init_params(wl))
            np.savez(jf.init_path, **jf.init)
            if self.resumed:
                jf.first_step, params = resume.take_state(self.resumed, job.job_id, d)
                jf.worker_init = d / "resume-params.npz"
                np.savez(jf.worker_init, **params)
            self.jobs.append(jf)

    def start_network(self, json_path: pathlib.Path) -> None:
        from mininet.log import setLogLevel

        from . import net as mnet

        setLogLevel("error")
        logging.getLogger("mininet").propagate = False  # printed once, by Mininet's own handler
        self.state.add_interfaces(mnet.interfaces(self.topo, self.if_prefix))
        pcaps = None
        if self.cfg.pcap:
            pcaps = self.dir / "pcaps"
            pcaps.mkdir()
        params = dict(target=self.target, grpc_addr=self.topo.switch.grpc_addr, device_id=self.topo.switch.device_id,
                      json_path=str(json_path), log_file=str(self.logs / "switch.log"),
                      log_level=None if self.cfg.log == "off" else self.cfg.log,
                      pcap_dir=str(pcaps) if pcaps else None,
                      thrift_port=self.cfg.thrift_port)
        self.net = mnet.make_net(self.topo, params, record=self.state.add_proc, prefix=self.if_prefix)
        self.switch = self.net.switches[0]
        self.start_net({"": self.switch}, lambda name: self.logs / "switch.log")

    def start_net(self, switches: dict, log_of) -> None:
        """Quiet the interfaces, start the network and, on BMv2, deepen each switch's egress queues
        (64 packets by default, dropped silently when full); `switches`: name (as said in errors) -> switch."""
        from . import net as mnet  # Mininet only where a run starts

        for sw in switches.values():
            for intf in sw.port_ifaces().values():
                mnet.quiet_root_iface(intf)
        for host in self.net.hosts:
            mnet.quiet_host(host)
        self.net.staticArp()
        try:
            self.net.start()
        except targets.TargetError as exc:
            raise RunError(one_line(str(exc))) from None
        if self.target == "bmv2":
            for name, sw in switches.items():
                try:
                    sw.process.set_queue_depth(1024)
                except (targets.TargetError, subprocess.TimeoutExpired) as exc:
                    where = f"BMv2 {name} queue depth" if name else "BMv2 queue depth"
                    raise RunError(f"{where}: {one_line(str(exc))}; see {log_of(name)}") from None

    def controller_log(self) -> tuple[logging.Logger, pathlib.Path]:
        """The controller's logger, writing to logs/controller.log only."""
        log = self.logs / "controller.log"
        handler = logging.FileHandler(log)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        ctl_log = logging.getLogger("mindp.controller")
        # Only this file: a logger made after Mininet's import is Mininet's class, with its own stderr handler.
        ctl_log.handlers[:] = [handler]
        ctl_log.setLevel(logging.INFO)
        ctl_log.propagate = False  # its warnings go to the log, not over the progress bar
        self.ctl_logger = ctl_log
        return ctl_log, log

    def configure(self, json_path: pathlib.Path, p4info: pathlib.Path) -> None:
        """Pipeline, forwarding and jobs, over P4Runtime, from the same topology data."""
        from controller.controller import Controller

        ctl_log, log = self.controller_log()
        try:
            self.ctl = Controller.for_topology(self.topo, p4info_path=p4info, bmv2_json_path=json_path)
            self.ctl.push()
            ctl_log.info("pipeline pushed: %s, %s", p4info, json_path)
            writes = self.ctl.install_forwarding(self.topo)
            ctl_log.info("forwarding installed: %d writes for %d hosts", writes, len(self.topo.hosts))
            for spec in self.topo.jobs:
                job = self.ctl.create_job(spec, self.topo)
                ctl_log.info("job created: %s", json.dumps(job.to_dict()))
        except Exception as exc:  # the controller's errors carry P4Runtime's message
            ctl_log.error("%s: %s", type(exc).__name__, exc)
            raise RunError(f"controller: {one_line(str(exc))}; see {log}") from None

    # -- training --

    def check_alive(self, grace: float = 0.0) -> None:
        """Raise RunError naming a switch or agent that ended; wait up to `grace` s for the switch to end."""
        from . import net as mnet  # Mininet only where a run starts
        mnet.wait_any_ended([self.switch], grace)
        if not self.switch.alive():
            rc = self.switch.process.proc.returncode
            raise RunError(f"the {self.target} switch ended ({how_it_ended(rc)}) during the run; "
                           f"see {self.logs / 'switch.log'}")
        self.agents.check_alive()

    def probe_switch(self, progress: Progress | None = None, last: bool = False) -> None:
        """Raise RunError when a switch does not answer the controller within SWITCH_DEADLINE. Once
        `progress` saw a step finished, and at most every DROPS_SECONDS, the probe is the read of the
        jobs' drops (metrics.csv): a read holds the switch's packet loop a moment, and one after
        every step of a fast model stalled it past the workers' RTO (spurious retransmissions).
        `last`: training is over, the drops are read now if any step is unread."""
        now = time.monotonic()
        due = progress is not None and progress.drops_due() and (last or now - self.probed >= DROPS_SECONDS)
        if last and not due:
            return
        if not due and now - self.probed < PROBE_SECONDS:
            return
        try:
            if due:
                progress.feed_drops(self.ctl.job_drops(progress.curves, SWITCH_DEADLINE))
            else:
                self.ctl.check_switch(SWITCH_DEADLINE)
        except Exception as exc:  # the controller's errors carry P4Runtime's (e.g. DEADLINE_EXCEEDED)
            self.ctl_logger.error("%s: %s", type(exc).__name__, exc)
            # A dying switch closes its gRPC socket before it can be reaped: name the crash, not
            # the closed stream, when the process ends within a moment.
            self.check_alive(grace=CRASH_GRACE)
            raise RunError(f"controller: {one_line(str(exc))} (the switch does not answer); "
                           f"see {self.logs / 'controller.log'}") from None
        self.probed = time.monotonic()

    def start_agents(self) -> None:
        self.agents = Agents(self.net, self.state, self.logs, self.topo, self.topo_path, self.cfg, self.opt)
        self.agents.start(self.jobs)

    def train(self) -> tuple[Progress, float]:
        self.progress = progress = Progress({j.job.job_id: j.job.n_workers for j in self.jobs}, self.cfg.steps,
                                            self.first_step())
        bar = ProgressLine(self.console)
        t0 = time.monotonic()
        watch = pace.StallWatch(pace.activity(*(hp.proc.pid for hp in self.agents.workers + self.agents.optimizers)),
                                STALL_SECONDS)
        while True:
            for hp in self.agents.workers + self.agents.optimizers:  # the nodes' lines: their commits
                for line in hp.tail.lines():
                    progress.feed(line)
            self.check_alive()
            self.probe_switch(progress)
            watch.look(progress.step)
            if progress.all_done() and self.agents.workers_exited():
                self.probe_switch(progress, last=True)  # the last steps' drops, in the last step's row
                break
            if watch.stalled():
                raise self.stalled()
            bar.show(progress.step, progress.bar())
            time.sleep(0.2)
        wall = progress.training_seconds() or (time.monotonic() - t0)
        bar.end(progress.bar())
        # The nodes serve until every worker has every parameter (a late PARAM loss is answered
        # by resending): only now are they told to stop; they export their state on SIGTERM.
        self.agents.stop_optimizers()
        return progress, wall

    def stalled(self) -> RunError:
        return RunError(f"no training step completed and no agent busy for {STALL_SECONDS:.0f} s; see {self.logs}/")

    # -- results --

    def switch_counters(self) -> dict[int, dict]:
        """Each job's P4 counters (packets, completions, duplicates, drops by reason), via the controller."""
        try:
            snap = self.ctl.stats()
        except Exception as exc:  # counters are informative: a failed read is reported, not fatal
            self.console.say(f"  (switch counters not read: {one_line(str(exc))})")
            return {}
        (self.dir / "switch-counters.json").write_text(json.dumps(snap.to_dict(), indent=1) + "\n")
        with contextlib.suppress(OSError), open(self.logs / "switch.log", "a") as f:
            for j, c in sorted(snap.jobs.items()):  # the switch's own 'not forwarded' includes absorbed gradients
                f.write(f"mindp run: P4 counters of job {j}: {c.grad_packets} gradient frames admitted, "
                        f"{c.completions} sums sent, {c.resent_sums} resent; dropped {c.dropped} {dict(c.drops)}\n")
        return {j: c.to_dict() for j, c in snap.jobs.items()}

    def results(self, progress: Progress) -> list[results.JobResult]:
        counters = self.switch_counters()
        out = []
        for jf in self.jobs:
            j = jf.job.job_id
            self.console.say(f"  job {j}: training the reference in this process ({self.cfg.steps} steps) to compare bits")
            ref = workload.reference_train(jf.wl, jf.init, self.cfg.steps, self.opt)
            try:
                master = optim.load_npz(jf.master_path)
                worker_params = []
                for w in sorted(jf.job.workers):
                    with np.load(jf.worker_out(w)) as npz:
                        worker_params.append({n: npz[n] for n in npz.files})
                opt_stats = json.loads(jf.opt_stats_path.read_text())
            except (OSError, ValueError, optim.ConfigError) as exc:
                raise RunError(f"job {j}: cannot read final parameters: {exc}") from None
            diff = results.compare(ref, worker_params, master)
            curve = progress.curves[j]
            ws = [progress.workers[(j, w)] for w in sorted(jf.job.workers)]
            out.append(results.JobResult(
                job_id=j, initial_loss=curve.loss[0], final_loss=curve.loss[-1], final_accuracy=curve.acc[-1],
                reference_final_loss=workload.model_eval(jf.wl)(ref.params)[0],
                max_abs_param_diff_vs_reference=diff,
                packets_sent=sum(w.sent + w.retx for w in ws) + int(opt_stats.get("params_sent", 0)),
                retransmissions=sum(w.retx for w in ws) + int(opt_stats.get("resent", 0)),
                switch_counters=counters.get(j), **results.digest_counts([w.done for w in ws])))
        return out

    def model_text(self) -> str:
        return workload.describe(self.jobs[0].wl, self.jobs[0].init)

    def first_step(self) -> int:
        return self.jobs[0].first_step

    def run_dict(self) -> dict:
        """The settings as the summary states them: `workers` counts every worker of a job (all leaves)."""
        return {**self.cfg.to_dict(), "target": self.target, "k": protocol.K, "workers": self.cfg.total_workers}

    def draw(self, progress: Progress, model: str) -> None:
        """curve.svg and metrics.csv (and TensorBoard's files where installed) from the steps done."""
        metrics.write(self.dir, progress)
        results.plot(self.dir / "curve.svg", progress.curves,
                     results.curve_title(model, self.target, self.cfg.jobs, self.cfg.total_workers, self.cfg.loss),
                     results.accuracy_label(self.cfg.model))

    def keep_partial(self, model: str, why: str) -> None:
        """A stopped run keeps what its steps showed: summary.json (stopped), curve.svg, metrics.csv."""
        if self.progress is None:
            return
        p = self.progress
        for hp in self.agents.workers + self.agents.optimizers if self.agents else []:  # said before the signal
            for line in hp.tail.lines():
                p.feed(line)
        results.write_summary(self.dir / "summary.json", {
            "model": model, "target": self.target, "k": protocol.K, "workers": self.cfg.total_workers, "stopped": why,
            "steps_done": p.step, "loss_curve": {j: list(zip(c.steps, c.loss)) for j, c in p.curves.items()},
            "packets_sent": p.packets, "retransmissions": p.retransmissions})
        self.draw(p, model)
        self.console.say(f"  kept the {p.step} step(s) done: {self.dir / 'summary.json'}, curve.svg, metrics.csv")

    def report(self, progress: Progress, wall: float, setup: float, model: str) -> int:
        """summary.json, the curve and the table; 0 when the run is bit-exact with the reference."""
        jobs_res = self.results(progress)
        summ = results.summary(self.run_dict(), jobs_res, wall, setup, model, results.n_params(self.jobs[0].init))
        if self.resumed:
            summ["resumed_from"] = {"run": str(self.resumed.run), "first_step": self.jobs[0].first_step}
        results.write_summary(self.dir / "summary.json", summ)
        self.draw(progress, model)
        self.console.say("\nsummary (" + str(self.dir / "summary.json") + "):")
        self.console.say(results.table(summ))
        exact = summ["max_abs_param_diff_vs_reference"] == 0.0
        self.console.say(f"  {'bit-exact with the reference trainer' if exact else 'DIFFERS from the reference trainer'}; "
                         f"curve: {self.dir / 'curve.svg'}, metrics: {self.dir / 'metrics.csv'}")
        warning = results.digest_warning(summ, self.logs)
        if warning:
            self.console.say(warning)
        return 0 if exact else 1

    # -- after training --

    def cli(self, p4info: pathlib.Path) -> None:
        """The Mininet CLI on the network as training left it; returns on 'exit' (make stop: Stopped)."""
        from mininet.cli import CLI
        from mininet.log import setLogLevel

        if self.ctl is not None:  # hand P4Runtime over: mindp-ctl may then be primary with its default id
            with contextlib.suppress(Exception):
                self.ctl.close()
            self.ctl = None
        ctl = shutil.which("mindp-ctl") or str(pathlib.Path(sys.executable).parent / "mindp-ctl")
        hosts = sorted(self.topo.hosts)
        setLogLevel("output")  # the CLI's own replies (pingall, ...) are at this level
        self.console.say(f"Mininet CLI: the network stays up. Try: pingall | {hosts[-1]} ping -c1 {hosts[0]} | "
            f"sh {ctl} --topology {self.topo_path} --p4info {p4info} stats\n"
            f"  (the same mindp-ctl command works from another shell). 'exit' or make stop ends the run "
            f"and cleans up.")
        CLI(self.net)

    # -- teardown --

    def close(self) -> None:
        """Stop the agents, the controller and the network, each phase timed into run.log (said
        on the console too where the whole took longer than SLOW_TEARDOWN, or a phase failed: a
        teardown that drags or fails is then on record, phase by phase). A failed phase does not
        keep the next from running; the state file's teardown then ends what is left."""
        phases, failed = [], False

        def timed(name: str, fn) -> None:
            nonlocal failed
            t, why = time.monotonic(), ""
            try:
                fn()
            except Exception as exc:  # (the run's own result or error is already out)
                why, failed = f" (failed: {type(exc).__name__}: {one_line(str(exc))})", True
            secs = time.monotonic() - t
            phases.append((f"{name} {secs:.1f} s{why}", secs))

        if self.agents is not None:
            timed("agents", self.agents.close)
        if self.ctl is not None:
            timed("controller", self.ctl.close)
        if self.net is not None:
            timed("switch", self.stop_switches)
            timed("network", self.net.stop)
        if not phases:
            return
        line = "  teardown: " + ", ".join(text for text, _ in phases)
        if failed or sum(secs for _, secs in phases) > SLOW_TEARDOWN:
            self.console.say(line)
        else:
            self.console.keep(line)

    def stop_switches(self) -> None:
        """Every switch process ends before Mininet deletes the links its ports are bound to."""
        for sw in self.net.switches:
            sw.stop_process()


def execute(cfg: config.RunConfig, args, console: Console, resumed: resume.Resumed | None = None) -> int:
    t_start = time.monotonic()
    if os.geteuid() != 0:
        raise RunError("must run as root (Mininet needs network namespaces): sudo make run")
    state = claim_state(pathlib.Path(args.state_file), console)  # first: a live run explains a busy port
    run = None
    try:
        target = preflight(cfg)
        cfg = cfg.on(target)
        run_dir = new_run_dir(args.runs_dir)
        clean.point_latest(run_dir.parent, run_dir)
        state.run_dir = str(run_dir)
        state.save()
        if cfg.script and cfg.topo == "leafspine":
            from .tree_script import TreeScriptRun, TreeUpRun
            run = (TreeUpRun if args.up else TreeScriptRun)(cfg, target, run_dir, state, args.p4, console,
                                                             args.if_prefix)
            shape = f"{cfg.leaves} leaves x {cfg.workers} torchrun ranks, {cfg.optimizers} optimizer node(s)"
        elif cfg.script:
            from .own_torchrun import UpRun
            from .script_run import ScriptRun
            run = (UpRun if args.up else ScriptRun)(cfg, target, run_dir, state, args.p4, console, args.if_prefix)
            shape = f"{cfg.workers} torchrun ranks"
        elif cfg.topo == "leafspine":
            from .leafspine import TreeRun
            run = TreeRun(cfg, target, run_dir, state, args.p4, console, args.if_prefix)
            shape = f"{cfg.leaves} leaves x {cfg.workers} workers, {cfg.optimizers} optimizer node(s)"
        else:
            run = Run(cfg, target, run_dir, state, args.p4, console, args.if_prefix)
            shape = f"{cfg.workers} workers"
        run.resumed = resumed
        jobs = f"{cfg.jobs} jobs" if cfg.jobs > 1 else "1 job"
        steps = "" if cfg.script else f"{cfg.steps} steps, "  # a script's steps are its own
        console.say(f"mindp run {run_dir}: {cfg.script or cfg.model} on the {target} switch"
            f"{target_reason(cfg.target, target)}, {jobs} x {shape}, "
            f"{steps}loss {cfg.loss:g}, seed {cfg.seed}")
        json_path, p4info, how = p4_program(args.p4, run_dir, console.say)
        console.say(f"  P4 program: {how}; K = {protocol.K} elements a frame, link MTU {protocol.link_mtu()}")
        run.prepare_files()
        if resumed:
            console.say(f"  resuming {resumed.run} after its node's commit: from step {run.first_step()}")
        model = run.model_text()
        console.say(f"  model: {model}")
        run.start_network(json_path)
        console.say(f"  Mininet up: {run.network_text()}, {len(run.topo.hosts)} hosts")
        run.configure(json_path, p4info)
        console.say(f"  controller: pipeline pushed, forwarding and {jobs} installed")
        run.start_agents()
        workers = "" if args.up else f" and {cfg.jobs * cfg.total_workers} workers"
        console.say(f"  optimizer node(s){workers} started; logs in {run.logs}/")
        setup = time.monotonic() - t_start
        try:
            progress, wall = run.train()
        except (KeyboardInterrupt, Stopped) as exc:
            with contextlib.suppress(Exception):  # what is kept must not hide why the run ended
                run.keep_partial(model, str(exc) or "interrupted")
            raise
        code = run.report(progress, wall, setup, model)
        if cfg.cli == "1" or (cfg.cli == "auto" and sys.stdin.isatty() and sys.stdout.isatty()):
            run.cli(p4info)
        return code
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        if run is not None:
            run.close()
        state.teardown()


def run_k(k: str, target: str, old: resume.Resumed | None = None, given: tuple[str, ...] = ()) -> int:
    """The run's K: K= if given, else a resumed run's own (its state's chunks are K elements), else
    MINDP_K where the environment sets it, else the target's default (BMv2 interprets every element
    of a frame, so it runs the hardware-faithful size; the embedded switch runs the large default)."""
    if old is not None and not k and "k" in old.cfg:
        n = int(old.cfg["k"])
        target = target if "TARGET" in given else str(old.cfg.get("target", target))
        if _resolved(target) == "bmv2" and not protocol.bmv2_fits(n):
            raise config.RunConfigError(f"RESUME: {old.run.name} trained at K = {n}, which BMv2 cannot run (K up to "
                                        f"{protocol.BMV2_MAX_K}): TARGET=embedded")
        return n
    k = k or os.environ.get(protocol.K_ENV, "").strip()
    if k:
        try:
            n = protocol.k_from_env({protocol.K_ENV: k})
        except SystemExit as exc:
            raise config.RunConfigError(f"K={k}: {str(exc).split(': ', 1)[1]}") from None
        if target == "bmv2" and not protocol.bmv2_fits(n):
            raise config.RunConfigError(f"K={n}: BMv2 runs K up to {protocol.BMV2_MAX_K} (it lets a packet grow "
                                        f"by {protocol.BMV2_HEADROOM} bytes; a GRAD becomes a SUM 6 bytes an element "
                                        "longer): TARGET=embedded runs any K")
        return n
    return protocol.HARDWARE_K if _resolved(target) == "bmv2" else protocol.DEFAULT_K


def _resolved(target: str) -> str:
    try:
        return targets.resolve(target)
    except targets.TargetError:
        return target  # config.parse names the problem


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:  # an earlier run is found before this run's directory moves runs/latest
        old = resume.find(args.resume, pathlib.Path(args.runs_dir)) if args.resume else None
        k = run_k(args.k, args.target, old, tuple(args.given.split()))
    except config.RunConfigError as exc:
        Console().fail(str(exc))
        return 2
    if k != protocol.K and (argv is None or args.k or old is not None):
        # Every module of this process and of the processes it starts takes K from MINDP_K at import.
        if argv is not None:
            raise RuntimeError(f"main(argv) runs at this process's K = {protocol.K}, not {k}: set MINDP_K")
        os.execve(sys.executable, [sys.executable, "-m", "mininet_topos.run", *sys.argv[1:]],
                  {**os.environ, protocol.K_ENV: str(k)})
    signal.signal(signal.SIGTERM, _raise_stopped)
    signal.signal(signal.SIGHUP, _raise_stopped)
    console = Console()
    try:
        cfg = config.parse(target=args.target, model=args.model, workers=args.workers, steps=args.steps,
                           loss=args.loss, jobs=args.jobs, seed=args.seed, pcap=args.pcap, hidden=args.hidden,
                           batch=args.batch, lr=args.lr, slots=args.slots, grpc_port=args.grpc_port,
                           thrift_port=args.thrift_port, cli=args.cli, log=args.log, topo=args.topo,
                           leaves=args.leaves, optimizers=args.optimizers, script=args.script,
                           script_args=args.args, gpt=args.gpt, eval_every=args.eval, node_ram=args.node_ram,
                           given=args.given)
        if args.up and not cfg.script:
            raise config.RunConfigError("UP=1 brings up a SCRIPT= run's network for your own torchrun: give SCRIPT=")
        if old is not None:
            cfg = resume.settings(old, cfg, args.given.split())
        return execute(cfg, args, console, old)
    except (config.RunConfigError, RunError) as exc:
        console.fail(str(exc))
        return 2 if isinstance(exc, config.RunConfigError) else 1
    except (KeyboardInterrupt, Stopped) as exc:
        console.fail(f"stopped ({str(exc) or 'interrupted'}); everything it started is cleaned up")
        return 130
    except Exception as exc:  # a bug: cleaned up already (finally); the traceback goes to a file, not the screen
        log = pathlib.Path(args.state_file).parent / "make-run-error.log"
        with contextlib.suppress(OSError):
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(traceback.format_exc())
        console.fail(f"internal error {type(exc).__name__}: {one_line(str(exc))}; traceback in {log}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
