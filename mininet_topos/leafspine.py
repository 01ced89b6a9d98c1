"""`make run TOPO=leafspine`: the run of mininet_topos.run on a tree of switches.

`LEAVES` leaf switches with `WORKERS` workers each under one spine, which attaches the job's
`OPTIMIZERS` optimizer node(s) (shards, each owning a contiguous chunk range). Every switch is
its own process (BMv2 or the embedded switch, as TARGET says) with its own gRPC and Thrift port
(the run's ports and the next ones, spine first); one TreeController configures them all.
A leaf sums its workers' gradients and sends each completed chunk up as one partial sum; the
spine completes the sum for the node owning the chunk; parameters come down by multicast at
each level (docs/SCALE.md). Everything else (files, agents, results, cleanup) is the star run's.
"""
from __future__ import annotations

import contextlib
import json
import logging
import pathlib
import shutil
import sys

from host_agent import optim
from mindp import topology, workload

from .console import RunError, how_it_ended, one_line
from .star import Run


def tree_topology(cfg, chunks: int) -> topology.Topology:
    """The run's leaf-spine; a sharded job's nodes split its `chunks` (the model's layout)."""
    return topology.leafspine(cfg.leaves, cfg.workers, cfg.optimizers, chunks=chunks, slots=cfg.slots,
                              grpc_port=cfg.grpc_port, thrift_port=cfg.thrift_port)


def builtin_chunks(cfg) -> int:
    """The built-in model's chunk count."""
    wl = workload.WorkloadConfig(n_workers=cfg.total_workers, seed=cfg.seed, hidden=cfg.hidden, batch=cfg.batch,
                                 model=cfg.model, model_args=cfg.model_args)
    return optim.layout_of(workload.init_params(wl)).n_chunks


def switch_ports(cfg) -> list[tuple[int, int]]:
    """(gRPC, Thrift) port of every switch of the run, spine first."""
    return [(cfg.grpc_port + i, cfg.thrift_port + i) for i in range(cfg.leaves + 1)]


class TreeRun(Run):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.topo = tree_topology(self.cfg, builtin_chunks(self.cfg))
        self.switches = []

    def network_text(self) -> str:
        first, last = self.topo.switches[0].grpc_addr, self.topo.switches[-1].grpc_addr.rsplit(":", 1)[1]
        return (f"leaf-spine {', '.join(s.name for s in self.topo.switches)} ({self.target}, gRPC {first}..{last}), "
                f"{len(self.topo.links)} links")

    def start_network(self, json_path: pathlib.Path) -> None:
        from mininet.log import setLogLevel

        from . import net as mnet

        setLogLevel("error")
        logging.getLogger("mininet").propagate = False
        ifaces = mnet.interfaces(self.topo, self.if_prefix)
        too_long = [i for i in ifaces if len(i) > 15]
        if too_long:
            raise RunError(f"interface name {too_long[0]} is longer than Linux's 15 characters: a shorter --if-prefix")
        self.state.add_interfaces(ifaces)
        pcaps = None
        if self.cfg.pcap:
            pcaps = self.dir / "pcaps"
            pcaps.mkdir()
        params = dict(target=self.target, json_path=str(json_path),
                      log_level=None if self.cfg.log == "off" else self.cfg.log)
        per_switch = {s.name: dict(grpc_addr=s.grpc_addr, device_id=s.device_id, thrift_port=s.thrift_port,
                                   log_file=str(self.logs / f"switch-{s.name}.log"),
                                   pcap_dir=str(pcaps / s.name) if pcaps else None,
                                   cpu=self.placement.switch(i) if self.placement else None)
                      for i, s in enumerate(self.topo.switches)}
        for p in per_switch.values():
            if p["pcap_dir"]:
                pathlib.Path(p["pcap_dir"]).mkdir()
        self.net = mnet.make_net(self.topo, params, record=self.state.add_proc, prefix=self.if_prefix,
                                 per_switch=per_switch)
        self.switches = [self.net.get(s.name) for s in self.topo.switches]
        self.switch = self.switches[0]
        self.start_net({sw.name: sw for sw in self.switches}, lambda name: self.logs / f"switch-{name}.log")

    def configure(self, json_path: pathlib.Path, p4info: pathlib.Path) -> None:
        """The same pipeline on every switch, forwarding on each, and each switch's part of the job."""
        from controller.treectl import TreeController

        ctl_log, log = self.controller_log()
        try:
            self.ctl = TreeController(self.topo, p4info_path=p4info, bmv2_json_path=json_path)
            self.ctl.push()
            ctl_log.info("pipeline pushed to %s: %s, %s", ", ".join(self.ctl.switches), p4info, json_path)
            writes = self.ctl.install_forwarding()
            ctl_log.info("forwarding installed: %s", writes)
            for spec in self.topo.jobs:
                for name, job in self.ctl.create_job(spec).items():
                    ctl_log.info("job created on %s: %s", name, json.dumps(job.to_dict()))
        except Exception as exc:
            ctl_log.error("%s: %s", type(exc).__name__, exc)
            raise RunError(f"controller: {one_line(str(exc))}; see {log}") from None

    def check_alive(self, grace: float = 0.0) -> None:
        from . import net as mnet  # Mininet only where a run starts
        mnet.wait_any_ended(self.switches, grace)
        for sw in self.switches:
            if not sw.alive():
                raise RunError(f"the {self.target} switch {sw.name} ended ({how_it_ended(sw.process.proc.returncode)}) "
                               f"during the run; see {self.logs / f'switch-{sw.name}.log'}")
        self.agents.check_alive()

    def train(self):
        progress, wall = super().train()
        for jf in self.jobs:
            if jf.job.sharded:
                jf.join_shards(optim.layout_of(jf.init))
        return progress, wall

    def switch_counters(self) -> dict[int, dict]:
        """Every switch's P4 counters (switch-counters.json, a line in each switch's log); the
        spine's per job for the summary (it completes each chunk once, as a single switch does)."""
        try:
            snaps = self.ctl.stats()
        except Exception as exc:
            self.console.say(f"  (switch counters not read: {one_line(str(exc))})")
            return {}
        (self.dir / "switch-counters.json").write_text(
            json.dumps({name: s.to_dict() for name, s in snaps.items()}, indent=1) + "\n")
        for name, snap in snaps.items():
            with contextlib.suppress(OSError), open(self.logs / f"switch-{name}.log", "a") as f:
                for j, c in sorted(snap.jobs.items()):
                    f.write(f"mindp run: P4 counters of job {j} on {name}: {c.grad_packets} gradient or partial "
                            f"frames admitted, {c.completions} completed, {c.resent_sums} resent; "
                            f"dropped {c.dropped} {dict(c.drops)}\n")
        spine = snaps[self.topo.switches[0].name]
        return {j: {**c.to_dict(), "per_switch": {name: s.jobs[j].to_dict() for name, s in snaps.items()
                                                  if j in s.jobs}}
                for j, c in spine.jobs.items()}

    def cli(self, p4info: pathlib.Path) -> None:
        from mininet.cli import CLI
        from mininet.log import setLogLevel

        if self.ctl is not None:
            with contextlib.suppress(Exception):
                self.ctl.close()
            self.ctl = None
        ctl = shutil.which("mindp-ctl") or str(pathlib.Path(sys.executable).parent / "mindp-ctl")
        setLogLevel("output")
        self.console.say(f"Mininet CLI: the network stays up. Try: pingall | "
                         f"sh {ctl} --topology {self.topo_path} --p4info {p4info} topo\n"
                         f"  (--switch leaf1 stats: one switch). 'exit' or make stop ends the run and cleans up.")
        CLI(self.net)
