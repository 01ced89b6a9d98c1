"""mindp-optimizer's shard options: bad input is one line and a non-zero exit; a shard's state
directory is never reused for another range."""
import numpy as np
import pytest

from host_agent import optim
from mindp.topology import star

from .entry_points import EXPLICIT, one_line_error, run
from .helpers import small_model
from .shard_topology import sharded_topology

CHUNKS = optim.layout_of(small_model()).n_chunks


@pytest.fixture
def files(tmp_path):
    np.savez(tmp_path / "init.npz", **small_model())
    sharded_topology(2, 2, CHUNKS).dump(tmp_path / "sharded.json")
    sharded_topology(2, 2, CHUNKS + 1).dump(tmp_path / "wrong.json")
    star([2]).dump(tmp_path / "single.json")
    return tmp_path


@pytest.mark.parametrize("args,needle", [
    (["--topology", "sharded.json"], "give --shard 0..1"),
    (["--topology", "sharded.json", "--shard", "2"], "give --shard 0..1"),
    (["--topology", "sharded.json", "--shard", "0", "--chunks", "0:3"], "give --shard I"),
    (["--topology", "single.json", "--shard", "1"], "has one optimizer node"),
    (["--topology", "wrong.json", "--shard", "0"], "the shards' ranges would not match"),
    ([*EXPLICIT, "--shard", "0"], "--shard needs --topology"),
    ([*EXPLICIT, "--chunks", "3"], "bad chunk range"),
    ([*EXPLICIT, "--chunks", "5:2"], "bad chunk range"),
    ([*EXPLICIT, "--chunks", f"0:{CHUNKS}"], "not within the model's chunks"),
    ([*EXPLICIT, "--peers", "10.0.0.2"], "--peers needs --chunks"),
])
def test_shard_options_bad_input(files, args, needle):
    args = [str(files / a) if a.endswith(".json") else a for a in args]
    code, _, err = run("host_agent.node", "--state-dir", str(files / "S"), "--init", str(files / "init.npz"),
                       "--iface", "hsc-nosuch0", *args)
    one_line_error(code, err, "mindp-optimizer", needle)


def test_a_shard_state_directory_is_refused_for_another_range(files):
    code, _, err = run("host_agent.node", "--state-dir", str(files / "S"), "--init", str(files / "init.npz"),
                       *EXPLICIT, "--chunks", "0:9", "--iface", "hsc-nosuch0")
    assert "hsc-nosuch0" in err and (files / "S" / "meta.json").exists()  # created, then no interface
    for other, needle in ((["--chunks", "0:8"], "holds chunks 0:9, not chunks 0:8"), ([], "not all chunks")):
        code, _, err = run("host_agent.node", "--state-dir", str(files / "S"), "--init", str(files / "init.npz"),
                           *EXPLICIT, *other, "--iface", "hsc-nosuch0")
        one_line_error(code, err, "mindp-optimizer", needle)
