"""Shared by every test package: the switch targets a test runs against, and what keeps
concurrent test workers (pytest-xdist, `make test`) apart.

A new test is parallel-safe when it names namespaces and interfaces through mindp.testbed
(Testbed, TreeBed, or testbed.tagged for its own names), takes ports from targets.free_port and
keeps its files under tmp_path; otherwise its node id goes into SERIAL. It waits with mindp.progress (no
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
#: interface prefixes), by node id prefix: one worker runs them one after another. (Node ids, not
#: an xdist_group mark: xdist 3.8 tags the node id to group and pytest 9.2 ignores that.)
SERIAL = (
    "tests/run/test_make_run.py::",
    "tests/run/test_make_run_models.py::",
    "tests/run/test_make_run_script.py::",
    "tests/run/test_run_failures.py::",
    "tests/run/test_leafspine.py::test_leafspine_run_is_bit_exact",
)

# Each xdist worker (gw0, gw1, ...) gets its own slice of TCP ports, and every test process a name
# tag on namespaces and interfaces that no other live process holds, so that even two test runs
# at once (two checkouts) never share a name; the subprocesses it starts inherit both.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw"):
    _index = int(_worker[2:])
    os.environ[targets.PORTS_ENV] = targets.slice_of(_index, int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ[testbed.TAG_ENV] = testbed.claim_tag()


@pytest.fixture(autouse=True)
def _serial_on_the_machine(request):
    """The SERIAL tests' fixed names are the machine's: another test run's wait for this one."""
    if not request.node.nodeid.startswith(SERIAL):
        yield
        return
    with testbed.machine_lock("serial-tests"):
        yield


#: Packages of long tests (processes, whole trainings), handed out before the short ones so the
#: run does not end waiting on one long test.
LONG_FIRST = ("tests/torch/", "tests/host_agent/", "tests/controller/")


def pytest_collection_modifyitems(items):
    """The SERIAL tests first: they are the suite's longest chain (one worker runs them all), so
    they start at once while the other workers share out the rest, longest packages first."""
    def rank(item) -> tuple:
        long = [i for i, p in enumerate(LONG_FIRST) if item.nodeid.startswith(p)]
        return not item.nodeid.startswith(SERIAL), long[0] if long else len(LONG_FIRST)

    items.sort(key=rank)


def pytest_xdist_make_scheduler(config, log):
    """--dist load/loadgroup: every test its own work unit but the SERIAL ones, which are one."""
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SerialApart(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "serial" if nodeid.startswith(SERIAL) else nodeid

    return SerialApart(config, log)


#: The packet tests (tests/dataplane) also run on the embedded switch's Python pipeline, the reference
#: its compiled pipeline (the default "embedded") must equal.
DATAPLANE_TARGET_PARAMS = [TARGET_PARAMS[0], pytest.param("embedded-python"), *TARGET_PARAMS[1:]]
