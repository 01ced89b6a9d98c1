"""Shared by every test package: the switch targets a test runs against, and what keeps
concurrent test workers (pytest-xdist, `make test`) apart.

A new test is parallel-safe when it names namespaces and interfaces through mindp.testbed
(Testbed, TreeBed, or testbed.tagged for its own names), takes ports from targets.free_port and
keeps its files under tmp_path; otherwise it carries SERIAL. It waits with mindp.progress (no
progress for a while fails, slow progress never does), never with a fixed deadline."""
import os

import pytest

from mindp import targets, testbed

#: The embedded switch always; BMv2 simple_switch_grpc wherever it is installed.
TARGET_PARAMS = [
    pytest.param("embedded"),
    pytest.param("bmv2", marks=pytest.mark.skipif(targets.find_bmv2() is None,
                                                   reason="BMv2 simple_switch_grpc not installed")),
]

#: Tests that share names or state with each other across workers (Mininet and `make run`: fixed
#: interface prefixes, switch ports 9559.., build/run-state.json) carry this xdist group, so one
#: worker runs them one after another (`--dist loadgroup`).
SERIAL = pytest.mark.xdist_group("serial")

# Each xdist worker (gw0, gw1, ...) gets its own tag on namespace/interface names and its own
# slice of TCP ports; the subprocesses it starts inherit both.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw"):
    _index = int(_worker[2:])
    os.environ[testbed.TAG_ENV] = str(_index)
    os.environ[targets.PORTS_ENV] = targets.slice_of(_index, int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))


def pytest_collection_modifyitems(items):
    """The SERIAL group first: it is the suite's longest chain (one worker runs it all), so it
    starts at once while the other workers share out the rest."""
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)
