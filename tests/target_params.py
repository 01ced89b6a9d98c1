"""The switch targets a test runs against (pytest parameters): the embedded switch always, BMv2
simple_switch_grpc wherever it is installed and runs this process's K. Imported after tests/conftest.py
has set MINDP_K (every module takes K from the environment once)."""
import pytest

from mindp import protocol, targets

#: The embedded switch always; BMv2 simple_switch_grpc wherever it is installed, at a K it can run
#: (up to protocol.BMV2_MAX_K: make test's first pass; the second, at the large K, is the embedded switch's).
TARGET_PARAMS = [
    pytest.param("embedded"),
    pytest.param("bmv2", marks=[
        pytest.mark.skipif(targets.find_bmv2() is None, reason="BMv2 simple_switch_grpc not installed"),
        pytest.mark.skipif(not protocol.bmv2_fits(protocol.K),
                           reason=f"BMv2 runs K up to {protocol.BMV2_MAX_K} (its packets grow by 512 bytes at most)")]),
]

#: The packet tests (tests/dataplane) also run on the embedded switch's Python pipeline, the reference
#: its compiled pipeline (the default "embedded") must equal.
DATAPLANE_TARGET_PARAMS = [TARGET_PARAMS[0], pytest.param("embedded-python"), *TARGET_PARAMS[1:]]
DATAPLANE_TARGETS = [p.values[0] for p in DATAPLANE_TARGET_PARAMS]
