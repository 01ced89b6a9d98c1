"""`mindp-ctl cells` against the running switch: the aggregation registers read over its Thrift
port (BMv2's, or the embedded switch's) and decoded."""
import json

import numpy as np
import pytest

from mindp import progress

from mindp.fixedpoint import exact_sum

from ..controller.ctl import ctl_command
from .fabric import random_fp16
from .sums import only_sums_at

pytestmark = pytest.mark.net
pytest.importorskip("mindp.bmthrift")


def cells(fabric, *args):
    proc = progress.run([*ctl_command(), "--grpc-addr", fabric.grpc_addr, "cells", *args, "--thrift-addr",
                           fabric.thrift_addr], capture_output=True, text=True)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout


def test_cells_show_the_use_workers_and_partial_sums(fabric, job1):
    rng = np.random.default_rng(40)
    grads = [random_fp16(rng) for _ in range(3)]
    for w in (0, 2):
        fabric.send(job1.workers[w], fabric.grad(job1, w, grads[w], step=150, chunk=2))
    assert not any(fabric.collect(0).values())
    got = json.loads(cells(fabric, "1", "2", "--json"))
    assert got["epoch"] == job1.epoch and got["newest_step"] is None
    v0, v1 = got["cells"]
    assert (v0["slot"], v0["ver"], v0["index"]) == (2, 0, (100 + 2) * 2)
    assert (v0["epoch"], v0["step"], v0["chunk"], v0["workers"], v0["count"], v0["contributions"], v0["state"]) == \
        (job1.epoch, 150, 2, [0, 2], 2, 2, "partial")
    partial = [int(s) for s in exact_sum([grads[0], grads[2]])[0]]
    if fabric.target == "bmv2":
        # BMv2's Thrift register_read saturates a bit<64> cell at or above 2**63 (a negative sum) to
        # INT64_MAX; the embedded switch returns the two's-complement value.
        partial = [s if s >= 0 else 2**63 - 1 for s in partial]
    assert v0["sums"] == partial and v0["values"] == [s / 2**24 for s in partial]
    assert v1["state"] in ("unused", "other epoch")
    fabric.send("w1_1", fabric.grad(job1, 1, grads[1], step=150, chunk=2))
    only_sums_at(fabric, fabric.collect(1), "opt1", 1)
    text = cells(fabric, "1")
    lines = text.splitlines()
    assert "1 of 8 cells hold a use of this epoch; newest completed step 150" in lines[0]
    assert lines[3].split()[:11] == ["2", "0", "204", str(job1.epoch), "150", "2", "0,1,2", "3", "3", "no", "complete"]
    first = int(exact_sum(grads)[0][0])
    first = (first if first >= 0 or fabric.target != "bmv2" else 2**63 - 1) / 2**24
    assert f"{first:.6g}" in lines[3]
