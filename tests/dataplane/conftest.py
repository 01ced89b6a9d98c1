"""The packet tests' switch: the real target (the embedded switch always, its Python pipeline, BMv2
wherever simple_switch_grpc is installed) with the hosts of tests/dataplane/fabric.py, started once a
module, and two jobs installed for each test that asks."""
from __future__ import annotations

import pytest

from controller.p4runtime import SwitchConnection
from mindp import targets
from mindp.harness.testbed import Testbed
from mindp.topology import Host, star
from p4src import artifacts
from tests.target_params import DATAPLANE_TARGET_PARAMS

from .fabric import SwitchFabric, epochs


@pytest.fixture(scope="module", params=DATAPLANE_TARGET_PARAMS)
def fabric(request, tmp_path_factory):
    topo = star([3, 2])
    hosts = dict(topo.hosts)
    hosts["x"] = Host("x", "02:00:00:00:00:63", "10.0.0.99", 9)  # a host in no job
    logs = tmp_path_factory.mktemp(f"dp-{request.param}")
    with Testbed("dp") as bed:
        for h in hosts.values():
            bed.add(h)
        cfg = targets.SwitchConfig(ports=bed.ports(), grpc_addr=f"127.0.0.1:{targets.free_port()}",
                                   log_file=str(logs / "switch.log"), thrift_port=targets.free_port())
        with targets.SwitchProcess(request.param, cfg), SwitchConnection(cfg.grpc_addr) as sw:
            sw.push_pipeline(artifacts.P4INFO, artifacts.BMV2_JSON)
            if request.param == "embedded":  # the default embedded switch runs the compiled pipeline
                assert "pipeline compiled to native code" in open(cfg.log_file).read()
            fab = SwitchFabric(bed, hosts, sw)
            fab.grpc_addr, fab.thrift_addr = cfg.grpc_addr, f"127.0.0.1:{cfg.thrift_port}"
            fab.target = request.param
            try:
                fab.install_forwarding()
                fab.drain()
                yield fab
            finally:
                fab.tap.close()


@pytest.fixture
def job1(fabric):
    """Job 1: workers w1_0..w1_2, optimizer opt1, 4 slots at pool offset 100, a fresh epoch."""
    job = fabric.install_job(1, ["w1_0", "w1_1", "w1_2"], "opt1", slot_base=100, slots=4, epoch=next(epochs))
    yield job
    fabric.remove_job(job)
    fabric.drain()


@pytest.fixture
def job2(fabric):
    """Job 2: workers w2_0, w2_1, optimizer opt2, 4 slots at pool offset 200."""
    job = fabric.install_job(2, ["w2_0", "w2_1"], "opt2", slot_base=200, slots=4, epoch=next(epochs))
    yield job
    fabric.remove_job(job)
    fabric.drain()
