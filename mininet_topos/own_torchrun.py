"""`make run SCRIPT=train.py UP=1`: the network, switch, controller and optimizer node of a SCRIPT= run,
without the ranks: it prints one command per worker host for your own torchrun, then follows the
ranks' figures (progress line, metrics.csv, curve) until Ctrl-C or `make stop`, and reports like a
SCRIPT= run (the comparison with the script's reference when it defines one).

Each command enters its Mininet host (mnexec -a: the host's network namespace, as a machine cabled
to that switch port) and starts torchrun's static rendezvous with node rank r; rank 0's host is the
rendezvous master, reached through the P4 switch like any other traffic (docs/TORCH.md). torchrun
keeps each rank's output under logs/torchrun/node<r>/ (--log-dir) and shows it too (--tee, lines
prefixed [default0]:), so that rank 0's JSON lines {"loss": x} reach the progress line and the curve.
"""
from __future__ import annotations

import pathlib
import shlex
import sys
import time

from .progress import LogTail, Progress
from .console import Stopped
from .placement import taskset
from .script_run import ScriptRun

RDZV_PORT = 29400


def commands(script: str, argv: list[str], workers: dict[int, str], host_pids: dict[str, int], master_ip: str,
             env: dict[str, str], python: str, log_dir: pathlib.Path, cores: dict[int, int] | None = None) -> list[str]:
    """One shell command per worker (rank r on its host; its torchrun's files in log_dir/node<r>; on core
    cores[r] where given, PIN), in rank order (pure)."""
    torchrun = str(pathlib.Path(python).parent / "torchrun")
    env_words = [f"{k}={v}" for k, v in sorted(env.items()) if k != "MINDP_IFACE"]  # init finds the interface
    if "MINDP_IFACE" in env:  # the host's, where a script's own gloo process group binds (not the hostname's)
        env_words.append(f"GLOO_SOCKET_IFNAME={env['MINDP_IFACE']}")
    out = []
    n = len(workers)
    for r, host in sorted(workers.items()):
        words = [*taskset((cores or {}).get(r)), "mnexec", "-a", str(host_pids[host]), "env", *env_words, torchrun,
                 "--nnodes", str(n), "--node-rank", str(r), "--nproc-per-node", "1", "--rdzv-backend", "static",
                 "--master-addr", master_ip, "--master-port", str(RDZV_PORT), "--log-dir", str(log_dir / f"node{r}"),
                 "--tee", "3", script, *argv]
        out.append(shlex.join(words))
    return out


class UpRun(ScriptRun):
    def start_agents(self) -> None:
        self.start_node()
        pids = {h: self.net.get(h).pid for h in self.job.workers.values()}
        master = self.topo.hosts[self.job.workers[0]].ip
        cores = {r: self.placement.worker(r) for r in self.job.workers} if self.placement else None
        lines = commands(self.cfg.script, self.argv, self.job.workers, pids, master, self.rank_env, sys.executable,
                         self.logs / "torchrun", cores)
        (self.dir / "torchrun-commands.sh").write_text("".join(f"{c} &\n" for c in lines) + "wait\n")
        self.console.say("  up: the network, switch, controller and optimizer node wait for your torchrun; one "
                         "command per worker host (as root, from this directory; all of them at once: "
                         f"sh {self.dir / 'torchrun-commands.sh'}):")
        for r, c in enumerate(lines):
            self.console.say(f"  rank {r} ({self.job.workers[r]}): {c}")
        self.console.say("  Ctrl-C or make stop ends the run and reports what the ranks did.")

    def train(self) -> tuple[Progress, float]:
        """Follow the ranks' figures and rank 0's JSON loss lines until Ctrl-C / make stop (no stall limit:
        the ranks are the user's to start); the switch and the node must stay up."""
        self.progress = progress = Progress({1: self.job.n_workers}, 0)
        tails = [LogTail(self.metrics_dir / f"rank{r}.jsonl") for r in range(self.job.n_workers)]
        tails += [o.tail for o in self.agents.optimizers]  # the node's lines: its commits
        rank0 = self.logs / "torchrun" / "node0"
        outputs: dict[pathlib.Path, LogTail] = {}  # rank 0's stdout.log: one per torchrun (attempt) the user starts
        t0 = time.monotonic()
        tty = sys.stdout.isatty()
        shown = -1

        def read() -> None:
            for tail in tails:
                for line in tail.lines():
                    progress.feed(line)
            for path in sorted(rank0.glob("*/attempt_*/0/stdout.log")):
                for line in outputs.setdefault(path, LogTail(path)).lines():
                    progress.feed_output(line)

        try:
            while True:
                read()
                self.check_alive()
                self.probe_switch(progress)
                self.read_switch_cpu(progress)
                if tty:
                    print("\r  " + progress.bar() + "\x1b[K", end="", flush=True)
                elif progress.step != shown:
                    self.console.say("  " + progress.bar())
                    shown = progress.step
                time.sleep(0.5)
        except (KeyboardInterrupt, Stopped):
            read()  # what the ranks said before the signal came
            self.console.say(("\r" if tty else "") + "  " + progress.bar())
            self.console.say(f"  stopped after {progress.step} step(s) of your ranks")
        self.stop_nodes()
        return progress, progress.span() or (time.monotonic() - t0)

