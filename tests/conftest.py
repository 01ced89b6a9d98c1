"""Shared by every test package: the suite's K, the order its tests are handed out in, and what keeps
concurrent test workers (pytest-xdist, `make test`) apart. The switch targets a test runs against are
tests/target_params.py's.

A new test is parallel-safe when it names namespaces and interfaces through mindp.harness.testbed
(Testbed, TreeBed, or testbed.tagged for its own names), takes ports from targets.free_port and
keeps its files under tmp_path. It waits with mindp.progress (no progress for a while fails, slow
progress never does), never with a fixed deadline."""
import os
import pathlib

# The suite runs at K = 32 (BMv2's, and the size its small models and pages were written for) unless
# MINDP_K says otherwise: make test's second pass runs the packet-level tests at the default K.
# Before any mindp import: every module takes K from the environment once.
os.environ.setdefault("MINDP_K", "32")

import pytest  # noqa: E402

# pytest explains a failed assert (values, diffs) only in test modules, conftest files and modules
# registered before their import: every test package's helper modules (harnesses, steps, clients)
# are, as if their asserts were in the tests that call them.
pytest.register_assert_rewrite(*sorted(f"tests.{d.name}" for d in pathlib.Path(__file__).parent.iterdir()
                                       if (d / "__init__.py").is_file()))

from controller.p4runtime import TIMEOUT_ENV  # noqa: E402
from mindp import progress  # noqa: E402
from mindp.harness import testbed  # noqa: E402
from tests.target_params import DATAPLANE_TARGETS  # noqa: E402

# Every test process takes a name tag on namespaces and interfaces that no other live process
# holds, so that even two test runs at once (two checkouts) never share a name; the subprocesses it
# starts inherit it. (TCP ports are kept apart so too: targets.free_port claims blocks of them.)
# mindp-ctl and the controller wait 3 s for a switch unless told: here, with other tests loading the
# machine, that wait is a hang guard (tests of a switch that does not answer give their own timeout).
os.environ.setdefault(TIMEOUT_ENV, str(progress.STALL))
if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw") or testbed.TAG_ENV not in os.environ:
    os.environ[testbed.TAG_ENV] = testbed.claim_tag()


#: Packages of long tests (processes, whole trainings; `make run` end to end first), handed out
#: before the short ones so the run does not end waiting on one long test.
LONG_FIRST = ("tests/run/test_make_run", "tests/run/test_leafspine.py", "tests/torch/", "tests/host_agent/",
              "tests/run/test_run_failures.py", "tests/test_p4_artifacts.py", "tests/softswitch/test_programs.py",
              "tests/controller/")


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        long = [i for i, p in enumerate(LONG_FIRST) if item.nodeid.startswith(p)]
        return long[0] if long else len(LONG_FIRST)

    items.sort(key=rank)


def pytest_xdist_make_scheduler(config, log):
    """--dist load/loadgroup: each test its own work unit, handed to a worker when it has fewer than two
    (xdist's load mode sends a quarter of the suite at once: the long tests would queue up on one),
    except that a packet-test module's tests on one target are one unit: its switch starts once."""
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # the collection's order (long tests first), not the largest unit first

    class OneByOne(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return shared_switch_unit(nodeid) or nodeid

    return OneByOne(config, log)


def shared_switch_unit(nodeid: str) -> str | None:
    """tests/dataplane's module-scoped switch (the `fabric` fixture, its target the first part of the
    test's id): the module and target, or None. The scheduler sees node ids only (no fixtures)."""
    path, _, rest = nodeid.partition("::")
    if not path.startswith("tests/dataplane/") or "[" not in rest:
        return None
    params = rest[rest.index("[") + 1 :]
    target = max((t for t in DATAPLANE_TARGETS if params == t + "]" or params.startswith(t + "-")), key=len,
                 default=None)
    return f"{path}[{target}]" if target else None
