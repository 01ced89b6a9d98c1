"""Mininet pieces: a switch node running BMv2 or the embedded switch, and a network
built from a `mindp.topology.Topology` (the same data the controller and agents read).

Root-namespace interfaces are named `<prefix>p<port>` (default `mnr-p1`, ...), so
the switch port number is in the name and nothing clashes with other Mininets;
each host's side is `eth0` inside its own namespace. In a tree (several switches)
they are `<prefix><switch>p<port>` (`mnr-leaf1p3`), both ends of a switch-to-switch
link included, and every switch is its own process (one MindpSwitch each).
"""
from __future__ import annotations

import subprocess
import time
from typing import Callable

from mininet.link import Link
from mininet.net import Mininet
from mininet.node import Host, Switch
from mininet.topo import Topo

from mindp import vnet
from mindp.netutil import drop_at_ingress
from mindp.protocol import link_mtu
from mindp.targets import SwitchConfig, SwitchProcess
from mindp.topology import Topology

from .placement import taskset

PREFIX = "mnr-"
ICMP_SILENCE_MS = 3_600_000  # icmp_ratelimit: one ICMP error per peer an hour, after none for 60 s
OFFLOADS = ("rx", "tx", "sg", "tso", "ufo", "gso", "gro", "lro", "rxvlan", "txvlan", "rxhash")

# Called with (pid, name, group) for every process a node starts, before anything else starts.
Recorder = Callable[[int, str, bool], None]


def switch_iface(port: int, prefix: str = PREFIX, switch: str = "") -> str:
    """The root-namespace interface of a switch port; `switch` names the switch in a tree."""
    return f"{prefix}{switch}p{port}"


def port_iface(topology: Topology, switch: str, port: int, prefix: str = PREFIX) -> str:
    return switch_iface(port, prefix, switch if topology.is_tree else "")


class MindpSwitch(Switch):
    """A Mininet switch that is our P4 target (`mindp.targets`), in the root namespace.

    start() launches simple_switch_grpc or the embedded switch on this node's
    interfaces (Mininet port number = P4 port number) and returns once its gRPC
    port answers; stop() ends it by PID before Mininet deletes the interfaces.
    """

    def __init__(self, name: str, target: str = "embedded", grpc_addr: str = "127.0.0.1:9559", device_id: int = 0,
                 json_path: str | None = None, log_file: str | None = None, log_level: str | None = None,
                 pcap_dir: str | None = None,
                 thrift_port: int | None = None, fault_args: list[str] | None = None,
                 record: Recorder | None = None, cpu: int | None = None, **params):
        """cpu: the core the switch process runs on (PIN), None: where the kernel puts it."""
        self.record = record
        self.cpu = cpu
        self.switch_cfg = dict(grpc_addr=grpc_addr, device_id=device_id, json_path=json_path, log_file=log_file,
                               log_level=log_level, pcap_dir=pcap_dir, thrift_port=thrift_port,
                               fault_args=list(fault_args or []))
        self.target = target
        self.process: SwitchProcess | None = None
        params["inNamespace"] = False  # the switch process uses the root-namespace veth ends
        super().__init__(name, **params)

    def startShell(self, *args, **kw):
        super().startShell(*args, **kw)
        if self.record:
            self.record(self.pid, f"mininet shell {self.name}", True)

    def port_ifaces(self) -> dict[int, str]:
        return {port: intf.name for port, intf in self.intfs.items() if intf.name != "lo"}

    def start(self, controllers) -> None:
        cfg = SwitchConfig(ports=self.port_ifaces(), **self.switch_cfg)
        self.process = SwitchProcess(self.target, cfg, prefix=taskset(self.cpu))
        try:
            self.process.start()
        finally:
            if self.record and self.process.pid:
                self.record(self.process.pid, f"{self.process.target} switch {self.name}", True)

    def alive(self) -> bool:
        return bool(self.process and self.process.proc and self.process.proc.poll() is None)

    def stop_process(self) -> None:
        if self.process:
            self.process.stop()

    def stop(self, deleteIntfs: bool = True) -> None:
        self.stop_process()
        super().stop(deleteIntfs)


class RecordingHost(Host):
    """A Mininet host whose shell PID is recorded as soon as it exists."""

    record: Recorder | None = None

    def startShell(self, *args, **kw):
        super().startShell(*args, **kw)
        if self.record:
            self.record(self.pid, f"mininet shell {self.name}", True)


class DataTopo(Topo):
    """The Mininet topology of a `Topology`: its switches, its hosts (MAC, IP, port) each on its
    switch, and the links between switch ports."""

    def build(self, topology: Topology, prefix: str = PREFIX, prefix_len: int = 16):
        for spec in topology.switches:
            self.addSwitch(spec.name)
        for host in topology.hosts.values():
            sw = topology.switch_of(host)
            self.addHost(host.name, ip=f"{host.ip}/{prefix_len}", mac=host.mac)
            self.addLink(host.name, sw, port1=0, port2=host.port,
                         intfName1="eth0", intfName2=port_iface(topology, sw, host.port, prefix))
        for link in topology.links:
            self.addLink(link.a, link.b, port1=link.a_port, port2=link.b_port,
                         intfName1=port_iface(topology, link.a, link.a_port, prefix),
                         intfName2=port_iface(topology, link.b, link.b_port, prefix))


def quiet_host(host: Host, iface: str = "eth0", offload: bool = False) -> None:
    """Offloads and IPv6 off in the host (as BMv2's veth_setup.sh does): only our frames on the wire.
    `offload` (targets.hosts_offload): UDP segmentation offload on again, and the transmit
    checksums and scatter-gather it needs, so the agents' super-frames leave whole.

    mindp frames are read from raw sockets, so the host's kernel finds no UDP socket on the
    protocol's port and would answer with ICMP port unreachable (6 a peer, then 1/s), which the
    receiving agent counts as rejected frames: a rate limit longer than the kernel's initial
    60 s of credit stops them (echo replies, i.e. ping, are not rate-limited).
    """
    cmds = [f"ethtool -K {iface} {f} off" for f in OFFLOADS] + [f"ip link set {iface} mtu {link_mtu()}"]
    if offload:
        cmds += [f"ethtool -K {iface} {' '.join(group)}" for group in vnet.HOST_OFFLOADS]
    cmds += ["sysctl -qw net.ipv6.conf.all.disable_ipv6=1", f"sysctl -qw net.ipv6.conf.{iface}.disable_ipv6=1",
             f"sysctl -qw net.ipv4.icmp_ratelimit={ICMP_SILENCE_MS}"]
    host.cmd("; ".join(f"{c} >/dev/null 2>&1" for c in cmds))
    drop_at_ingress(iface, f"/proc/{host.pid}/ns/net")


def quiet_root_iface(iface: str) -> None:
    for f in OFFLOADS:
        subprocess.run(["ethtool", "-K", iface, f, "off"], capture_output=True)
    subprocess.run(["sysctl", "-qw", f"net.ipv6.conf.{iface}.disable_ipv6=1"], capture_output=True)
    subprocess.run(["ip", "link", "set", iface, "mtu", str(link_mtu())], capture_output=True)


def make_net(topology: Topology, switch_params: dict, record: Recorder | None = None,
             prefix: str = PREFIX, per_switch: dict[str, dict] | None = None) -> Mininet:
    """A built (not started) Mininet of `topology` with MindpSwitch, no OpenFlow controller.
    `per_switch`: parameters of one switch by name over `switch_params` (gRPC address, logs...)."""

    class Rec(RecordingHost):
        pass

    Rec.record = staticmethod(record) if record else None

    dpids = {s.name: f"{i + 1:016x}" for i, s in enumerate(topology.switches)}  # names need no digits

    def switch(name, **kw):
        kw.setdefault("dpid", dpids.get(name))
        return MindpSwitch(name, record=record, **{**switch_params, **(per_switch or {}).get(name, {}), **kw})

    return Mininet(topo=DataTopo(topology, prefix=prefix), switch=switch, host=Rec, link=Link, controller=None,
                   autoSetMacs=False, autoStaticArp=False, build=True, waitConnected=False)


def wait_any_ended(switches: list[MindpSwitch], timeout: float) -> None:
    """Give switches that may be going down up to `timeout` s, until one of them has ended."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and all(sw.alive() for sw in switches):
        time.sleep(0.05)


def interfaces(topology: Topology, prefix: str = PREFIX) -> list[str]:
    """The root-namespace interface names a network of `topology` makes."""
    out = [port_iface(topology, topology.switch_of(h), h.port, prefix) for h in topology.hosts.values()]
    for link in topology.links:
        out += [port_iface(topology, link.a, link.a_port, prefix), port_iface(topology, link.b, link.b_port, prefix)]
    return out
