"""The run on one switch (the star topology): network, controller, agents, training, results and
teardown. leafspine.TreeRun and the SCRIPT= runs extend it; mininet_topos.run starts the one
a run's settings ask for."""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import pathlib
import shutil
import subprocess
import sys
import time

import numpy as np

from host_agent import optim, residency, state
from host_agent.optim import OptimizerConfig
from mindp import procstat, progress as pace, protocol, targets, topology, workload

from . import config, metrics, placement, results, resume
from .agents import Agents, JobFiles
from .console import Console, Pace, ProgressLine, RunError, how_it_ended, one_line
from .progress import Progress
from .runstate import RunState

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
# A run stopped after its training, while the reference that checks it trained (summary.json's not_compared).
NOT_COMPARED = "training had ended; stopped during the check, so its bits are not compared with the reference"


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

    @functools.cached_property
    def placement(self) -> placement.Placement | None:
        """PIN: each process's core (computed once the topology is final), or None."""
        jobs = self.topo.jobs
        return placement.plan(self.cfg.pin, placement.own_cpus(), sum(j.n_workers for j in jobs),
                              len(self.topo.switches), sum(len(j.optimizers) for j in jobs))

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
            if self.cfg.optimizers == 1:  # (a shard holds part of the state: its node judges its own budget)
                self.check_node_ram(job.job_id, jf.init)
            np.savez(jf.init_path, **jf.init)
            if self.resumed:
                jf.first_step, params = resume.take_state(self.resumed, job.job_id, d)
                jf.worker_init = d / "resume-params.npz"
                np.savez(jf.worker_init, **params)
            self.jobs.append(jf)

    def check_node_ram(self, job_id: int, init: dict) -> None:
        """NODE_RAM refused before the network starts where the job's optimizer node would refuse
        it (its own residency planner), with the least budget that runs."""
        w = state.new_state_workload(optim.layout_of(init).n_chunks, self.opt.lanes)
        try:
            residency.decide(self.cfg.node_ram, w)
        except residency.PlanError as exc:
            least = residency.least_budget(w)
            raise config.RunConfigError(f"NODE_RAM: the optimizer node of job {job_id} would refuse it: {exc} "
                                        f"(NODE_RAM={-(-least // 2**20)}M or more runs)") from None

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
                      thrift_port=self.cfg.thrift_port, cpu=self.placement.switch(0) if self.placement else None)
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
            mnet.quiet_host(host, offload=targets.hosts_offload(self.target))
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
        self.agents = Agents(self.net, self.state, self.logs, self.topo, self.topo_path, self.cfg, self.opt,
                             self.placement)
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
            self.read_switch_cpu(progress)
            watch.look(progress.step)
            if progress.all_done() and self.agents.workers_exited():
                self.probe_switch(progress, last=True)  # the last steps' drops, in the last step's row
                self.read_switch_cpu(progress)
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

    def read_switch_cpu(self, progress: Progress) -> None:
        """Every switch process's CPU seconds so far (all its threads), kept at the step every worker
        just finished (summary.json's switch CPU a step); nothing once a switch has ended."""
        if progress.switch_cpu_due():
            stats = [procstat.of(sw.process.pid) for sw in self.net.switches if sw.process and sw.process.pid]
            if stats and None not in stats:
                progress.feed_switch_cpu(sum(procstat.cpu_seconds(f) for f in stats))

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
            ref = diff = None
            if self.cfg.check:
                check = Pace(self.console, "reference", self.cfg.steps,
                             header=f"  job {j}: training the reference in this process ({self.cfg.steps} steps) to compare bits")
                ref = workload.reference_train(jf.wl, jf.init, self.cfg.steps, self.opt, on_step=check)
                check.end()
                diff = self.compare(jf, ref)
            try:
                opt_stats = json.loads(jf.opt_stats_path.read_text())
            except (OSError, ValueError) as exc:
                raise RunError(f"job {j}: cannot read the node's stats: {exc}") from None
            curve = progress.curves[j]
            ws = [progress.workers[(j, w)] for w in sorted(jf.job.workers)]
            out.append(results.JobResult(
                job_id=j, initial_loss=curve.loss[0], final_loss=curve.loss[-1], final_accuracy=curve.acc[-1],
                reference_final_loss=workload.model_eval(jf.wl)(ref.params)[0] if ref is not None else None,
                max_abs_param_diff_vs_reference=diff,
                packets_sent=sum(w.sent + w.retx for w in ws) + int(opt_stats.get("params_sent", 0)),
                retransmissions=sum(w.retx for w in ws) + int(opt_stats.get("resent", 0)),
                switch_counters=counters.get(j), **results.digest_counts([w.done for w in ws])))
        return out

    @staticmethod
    def compare(jf: JobFiles, ref) -> float:
        """The largest difference of the job's final parameters (the node's master, every worker's
        fp16) from the reference's; read only to compare (CHECK=0 reads none of them)."""
        try:
            master = optim.load_npz(jf.master_path)
            worker_params = []
            for w in sorted(jf.job.workers):
                with np.load(jf.worker_out(w)) as npz:
                    worker_params.append({n: npz[n] for n in npz.files})
        except (OSError, ValueError, optim.ConfigError) as exc:
            raise RunError(f"job {jf.job.job_id}: cannot read final parameters: {exc}") from None
        return results.compare(ref, worker_params, master)

    def model_text(self) -> str:
        return workload.describe(self.jobs[0].wl, self.jobs[0].init)

    def first_step(self) -> int:
        return self.jobs[0].first_step

    def run_dict(self) -> dict:
        """The settings as the summary states them: `workers` counts every worker of a job (all leaves)."""
        return {**self.cfg.to_dict(), "target": self.target, "k": protocol.K, "workers": self.cfg.total_workers}

    def draw(self, progress: Progress, model: str) -> list[metrics.StepRow]:
        """curve.svg and metrics.csv (and TensorBoard's files where installed) from the steps done;
        returns metrics.csv's rows."""
        table = metrics.write(self.dir, progress)
        results.plot(self.dir / "curve.svg", progress.curves,
                     results.curve_title(model, self.target, self.cfg.jobs, self.cfg.total_workers, self.cfg.loss),
                     results.accuracy_label(self.cfg.model))
        return table

    def keep_partial(self, model: str, why: str, checking: bool = False) -> None:
        """A stopped run keeps what its steps showed: summary.json (stopped), curve.svg, metrics.csv.
        checking: stopped after training, while its reference trained: its bits are not compared."""
        if self.progress is None:
            return
        p = self.progress
        for hp in self.agents.workers + self.agents.optimizers if self.agents else []:  # said before the signal
            for line in hp.tail.lines():
                p.feed(line)
        unchecked = {"not_compared": NOT_COMPARED} if checking else {}
        results.write_summary(self.dir / "summary.json", {
            "model": model, "target": self.target, "k": protocol.K, "workers": self.cfg.total_workers, "stopped": why,
            **unchecked, "steps_done": p.step, "loss_curve": {j: list(zip(c.steps, c.loss)) for j, c in p.curves.items()},
            "packets_sent": p.packets, "retransmissions": p.retransmissions, **metrics.cpu(p)})
        self.draw(p, model)
        self.console.say(f"  kept the {p.step} step(s) done{' (' + NOT_COMPARED + ')' if checking else ''}: "
                         f"{self.dir / 'summary.json'}, curve.svg, metrics.csv")

    def report(self, progress: Progress, wall: float, setup: float, model: str) -> int:
        """summary.json, the curve and the table; 0 when the run is bit-exact with the reference. The
        curve and metrics.csv come first: a run stopped during the check keeps them."""
        table = self.draw(progress, model)
        jobs_res = self.results(progress)
        summ = results.summary(self.run_dict(), jobs_res, wall, setup, model, results.n_params(self.jobs[0].init))
        summ.update(metrics.timing(table))
        summ.update(metrics.cpu(progress))
        if self.resumed:
            summ["resumed_from"] = {"run": str(self.resumed.run), "first_step": self.jobs[0].first_step}
        results.write_summary(self.dir / "summary.json", summ)
        self.console.say("\nsummary (" + str(self.dir / "summary.json") + "):")
        self.console.say(results.table(summ))
        exact = summ.get("max_abs_param_diff_vs_reference") == 0.0
        said = ("not compared with the reference trainer (CHECK=0)" if not self.cfg.check else
                "bit-exact with the reference trainer" if exact else "DIFFERS from the reference trainer")
        self.console.say(f"  {said}; curve: {self.dir / 'curve.svg'}, metrics: {self.dir / 'metrics.csv'}")
        for line in (results.cpu_line(summ), results.digest_warning(summ, self.logs)):
            if line:
                self.console.say(line)
        return 0 if exact or not self.cfg.check else 1

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
