"""Shared by every test package: the switch targets a test runs against."""
import pytest

from mindp import targets

#: The embedded switch always; BMv2 simple_switch_grpc wherever it is installed.
TARGET_PARAMS = [
    pytest.param("embedded"),
    pytest.param("bmv2", marks=pytest.mark.skipif(targets.find_bmv2() is None,
                                                   reason="BMv2 simple_switch_grpc not installed")),
]

#: The packet tests (tests/dataplane) also run on the embedded switch's Python pipeline, the reference
#: its compiled pipeline (the default "embedded") must equal.
DATAPLANE_TARGET_PARAMS = [TARGET_PARAMS[0], pytest.param("embedded-python"), *TARGET_PARAMS[1:]]
