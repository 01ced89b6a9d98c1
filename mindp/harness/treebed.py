"""A tree of real switches on veths, for tests and benches: every host of a topology in its own
namespace (mindp.harness.testbed), each switch-to-switch link a veth pair in the root namespace, one
switch process per topology switch on free gRPC/Thrift ports, and the topology's jobs installed by
controller.treectl.TreeController (one P4Runtime session per switch). Needs root."""
from __future__ import annotations

import dataclasses
import pathlib

from mindp import targets
from .testbed import Testbed, quiet_veths, sh
from mindp.topology import Host, Topology


class TreeBed:
    def __init__(self, topo: Topology, target: str, tmp: str | pathlib.Path, prefix: str = "tb"):
        """`prefix`: 1..4 characters naming the namespaces and interfaces."""
        from controller.treectl import TreeController  # the controller package sits beside mindp

        tmp = pathlib.Path(tmp)
        self.bed = Testbed(prefix)
        prefix = self.bed.prefix  # with the runner's tag
        self.links: list[str] = []
        self.switches: list[targets.SwitchProcess] = []
        ports: dict[str, dict[int, str]] = {s.name: {} for s in topo.switches}
        try:
            for i, h in enumerate(topo.hosts.values(), start=1):  # unique names: ports repeat across switches
                nh = self.bed.add(Host(h.name, h.mac, h.ip, i))
                ports[topo.switch_of(h)][h.port] = nh.switch_iface
            for i, link in enumerate(topo.links):
                a, b = f"{prefix}l{i}a", f"{prefix}l{i}b"
                sh("ip", "link", "del", a, check=False)
                sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
                self.links.append(a)
                quiet_veths((a, None), (b, None))
                ports[link.a][link.a_port], ports[link.b][link.b_port] = a, b
            specs = []
            for spec in topo.switches:
                cfg = targets.SwitchConfig(ports=ports[spec.name], grpc_addr=f"127.0.0.1:{targets.free_port()}",
                                           device_id=spec.device_id, thrift_port=targets.free_port(),
                                           log_file=str(tmp / f"{spec.name}.log"))
                sw = targets.SwitchProcess(target, cfg).start()
                self.switches.append(sw)
                sw.set_queue_depth(1024)
                specs.append(dataclasses.replace(spec, grpc_addr=cfg.grpc_addr, thrift_port=cfg.thrift_port))
            self.topo = Topology(tuple(specs), topo.hosts, topo.jobs, topo.links)
            self.topo.check()
            self.ports = ports  # switch -> port -> interface
            with TreeController(self.topo) as ctl:
                ctl.push()
                ctl.install_forwarding()
                for job in self.topo.jobs:
                    ctl.create_job(job)
        except BaseException:
            self.close()
            raise

    def root_member_ifaces(self, job_id: int) -> list[str]:
        """The interfaces of the job's root switch facing its members (workers or child switches)."""
        job = self.topo.job(job_id)
        root = self.topo.job_root(job)
        opt_ports = {self.topo.host(o).port for o in job.optimizers}
        return [iface for port, iface in self.ports[root].items() if port not in opt_ports]

    def close(self) -> None:
        for sw in self.switches:
            sw.stop()
        for a in self.links:
            sh("ip", "link", "del", a, check=False)
        self.bed.close()

    def __enter__(self) -> TreeBed:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
