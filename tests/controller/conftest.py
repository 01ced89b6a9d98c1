"""Real P4Runtime targets for the controller tests: the embedded switch always,
BMv2 simple_switch_grpc where installed. Each test gets its own switch on a
free gRPC port; the control-plane tests need no interfaces."""
from __future__ import annotations

import pytest

from controller.controller import Controller
from mindp import targets
from mindp.topology import Host, star
from tests.conftest import TARGET_PARAMS


class Switch:
    """A switch process that a test can stop and start again on the same address."""

    def __init__(self, target: str, log_dir, ports: dict[int, str] | None = None):
        self.target = target
        self.cfg = targets.SwitchConfig(ports=ports or {}, grpc_addr=f"127.0.0.1:{targets.free_port()}",
                                        log_file=str(log_dir / "switch.log"), thrift_port=targets.free_port())
        self.proc: targets.SwitchProcess | None = None

    @property
    def addr(self) -> str:
        return self.cfg.grpc_addr

    def start(self) -> Switch:
        self.proc = targets.SwitchProcess(self.target, self.cfg).start()
        return self

    def stop(self) -> None:
        if self.proc:
            self.proc.stop()
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture(params=TARGET_PARAMS)
def switch(request, tmp_path):
    sw = Switch(request.param, tmp_path).start()
    yield sw
    sw.stop()


@pytest.fixture
def topo():
    """Job 1: w1_0..w1_2 + opt1; job 2: w2_0, w2_1 + opt2; a spare host on port 20."""
    t = star([3, 2], slots=16)
    t.hosts["spare"] = Host("spare", "02:00:00:00:00:14", "10.0.0.20", 20)
    return t


@pytest.fixture
def ctl(switch, topo):
    c = Controller(switch.addr, topology=topo)
    c.push()
    c.install_forwarding()
    yield c
    c.close()
