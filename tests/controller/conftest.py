"""Real P4Runtime targets for the controller tests: the embedded switch always,
BMv2 simple_switch_grpc where installed. Each test gets its own switch on a
free gRPC port; the control-plane tests need no interfaces."""
from __future__ import annotations

import pytest

from controller.controller import Controller
from mindp.topology import Host, star
from tests.target_params import TARGET_PARAMS

from .switch import Switch


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
