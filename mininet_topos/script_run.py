"""`make run SCRIPT=train.py ARGS='...'`: a user's torchrun script (mindp.torch.init) on every worker
host of the Mininet network.

1. describe: the script runs once as rank 0 without a network (MINDP_DESCRIBE): its initial
   parameters and optimizer (AdamW/SGD, hyper-parameters, lr schedule) land in job1/spec/;
2. the optimizer node starts on its host from them (--init, --optimizer-spec);
3. one torchrun in the root namespace starts a rank per worker (rendezvous on the loopback), and
   mindp.torch.launch moves rank r into worker r's host (mnexec -a, the host's PID);
4. the script's JSON lines {"step": s, "loss": x} (rank 0's stdout) are the progress; at the end the
   node's final weights are compared with the reference the script defines (mindp_reference), or
   the loss curve is reported when it defines none.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

import numpy as np

from host_agent import optim
from mindp import progress as pace
from mindp.torch import scriptref

from .agents import REPO, Agents
from .console import RunError, one_line
from .run import STALL_SECONDS, Run


class ScriptRun(Run):
    """Run with the user's script in place of the built-in trainer (one job, one switch)."""

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.cfg.script_args)

    @property
    def job(self):
        return self.topo.jobs[0]

    def prepare_files(self) -> None:
        self.topo.dump(self.topo_path)
        (self.dir / "config.json").write_text(json.dumps({**self.cfg.to_dict(), "target": self.target}, indent=1) + "\n")
        self.job_dir = self.dir / "job1"
        self.spec_dir = self.job_dir / "spec"
        self.job_dir.mkdir()
        env = {**os.environ, "MINDP_DESCRIBE": str(self.spec_dir), "RANK": "0", "LOCAL_RANK": "0",
               "WORLD_SIZE": str(self.job.n_workers), "OMP_NUM_THREADS": "1"}
        log = self.logs / "describe.log"
        with open(log, "wb") as f:
            rc = subprocess.run([sys.executable, self.cfg.script, *self.argv], stdin=subprocess.DEVNULL, stdout=f,
                                stderr=subprocess.STDOUT, env=env, cwd=str(REPO)).returncode
        if rc != 0 or not (self.spec_dir / "optimizer.json").exists():
            last = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-1:] or ["no output"]
            raise RunError(f"the script's describe run failed (exit {rc}, does it call mindp.torch.init?): "
                           f"{one_line(last[0])}; see {log}")

    def model_text(self) -> str:
        init = optim.load_npz(self.spec_dir / "init.npz")
        cfg = json.loads((self.spec_dir / "optimizer.json").read_text())
        sched = cfg["schedule"]["kind"]
        return (f"{os.path.basename(self.cfg.script)} ({sum(a.size for a in init.values()):,} parameters, "
                f"{cfg['kind']} lr {cfg['lr']:g}, schedule {sched})")

    def start_agents(self) -> None:
        self.agents = a = Agents(self.net, self.state, self.logs, self.topo, self.topo_path, self.cfg, self.opt)
        state_dir = self.job_dir / "optimizer-state"
        self.master_path = self.job_dir / "optimizer-master.npz"
        node = a._popen(self.job.optimizers[0], "optimizer-job1", [
            "-m", "host_agent.node", "--iface", "eth0", "--topology", str(self.topo_path), "--job", "1",
            "--state-dir", str(state_dir), "--init", str(self.spec_dir / "init.npz"),
            "--optimizer-spec", str(self.spec_dir / "optimizer.json"), "--export", str(self.master_path),
            "--stats", str(self.job_dir / "optimizer-stats.json"), *a._faults(self.job.optimizers[0])])
        a.optimizers = [node]
        a.wait_started([node])
        pids = self.dir / "host-pids.json"
        pids.write_text(json.dumps({h: self.net.get(h).pid for h in self.job.workers.values()}))
        n = self.job.n_workers
        a.workers = [a.popen_root("torchrun", [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(n), "--log-dir", str(self.logs / "torchrun"),  # not a dir of its own in /tmp
            "-m", "mindp.torch.launch", "--host-pids", str(pids), "--script", self.cfg.script, *self.argv],
            {"MINDP_TOPOLOGY": str(self.topo_path), "MINDP_JOB": "1", "MINDP_STATE": str(state_dir),
             "MINDP_IFACE": "eth0", "OMP_NUM_THREADS": "1"})]

    def train(self) -> tuple[list[tuple[int, float]], float]:
        """Follow rank 0's {"step", "loss"} lines until torchrun exits; stalls follow progress."""
        (hp,) = self.agents.workers
        curve: list[tuple[int, float]] = []
        t0 = time.monotonic()
        tty = sys.stdout.isatty()
        watch = pace.StallWatch(pace.activity(hp.proc.pid, *(o.proc.pid for o in self.agents.optimizers)),
                                STALL_SECONDS)
        while True:
            for line in hp.tail.lines():
                try:
                    rec = json.loads(line)
                    curve.append((int(rec["step"]), float(rec["loss"])))
                except (ValueError, KeyError, TypeError):
                    continue
                status = f"step {curve[-1][0] + 1}, loss {curve[-1][1]:.4f}"
                if tty:
                    print("\r  " + status + "\x1b[K", end="", flush=True)
                else:
                    self.console.say("  " + status)
            rc = hp.proc.poll()
            if rc is not None:
                break
            if not self.switch.alive():
                raise RunError(f"the {self.target} switch exited during the run; see {self.logs / 'switch.log'}")
            if self.agents.optimizers[0].proc.poll() is not None:
                raise RunError(f"the optimizer node exited; see {self.agents.optimizers[0].log}")
            watch.look(len(curve))
            if watch.stalled():
                raise self.stalled()
            time.sleep(0.2)
        if tty:
            print()
        if rc != 0:
            raise RunError(f"the script failed (torchrun exit {rc}): {hp.last_error() or 'no message'}; see {hp.log}")
        self.agents.stop_optimizers()
        return curve, time.monotonic() - t0

    def report(self, curve, wall: float, setup: float, model: str) -> int:
        """summary.json and the comparison with the script's reference; exit 0 when bit-exact (or
        when the script defines no reference: then the loss curve is the result)."""
        master = optim.load_npz(self.master_path)
        try:
            ref = scriptref.script_reference(self.cfg.script, self.job.n_workers, self.argv)
            diff = max(float(np.max(np.abs(master[n] - ref.master[n]))) if master[n].size else 0.0 for n in master)
        except scriptref.NoReference:
            ref, diff = None, None
        summ = {"script": self.cfg.script, "args": self.argv, "target": self.target, "workers": self.job.n_workers,
                "model": model, "steps": len(curve), "loss_curve": curve, "wall_seconds": round(wall, 2),
                "setup_seconds": round(setup, 2), "max_abs_param_diff_vs_reference": diff}
        (self.dir / "summary.json").write_text(json.dumps(summ, indent=1) + "\n")
        self.console.say(f"\nsummary ({self.dir / 'summary.json'}):")
        if curve:
            self.console.say(f"  loss {curve[0][1]:.4f} (step {curve[0][0]}) -> {curve[-1][1]:.4f} "
                             f"(step {curve[-1][0]}), {len(curve)} steps in {wall:.1f} s")
        if diff is None:
            self.console.say("  the script defines no mindp_reference(argv): no reference to compare with "
                             "(docs/TORCH.md)")
            return 0
        self.console.say("  final weights " + ("bit-exact with the script's single-process reference" if diff == 0.0
                                               else f"DIFFER from the script's reference (max |diff| {diff:g})"))
        return 0 if diff == 0.0 else 1
