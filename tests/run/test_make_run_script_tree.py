"""make run SCRIPT=... TOPO=leafspine: a user's script on a tree of switches, its job's optimizer
sharded over two nodes on the spine; bit-exact with the script's reference, its own gloo group
across the leaves, and opt.save reading every shard's state."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.run.makerun import REPO, MakeRun, assert_clean, needs_root  # noqa: E402

pytestmark = pytest.mark.net

TREE_SCRIPT = '''
import json, os, sys
sys.path.insert(0, {examples!r})
import torch, torch.distributed as dist, mindp.torch
from train_cnn import batch, build_model, loss_fn, optimizer

STEPS = 3


def mindp_reference(argv):
    return dict(model=build_model, batch=batch, loss=loss_fn, steps=STEPS,
                optimizer=lambda model: optimizer(model, STEPS, 3e-3))


if __name__ == "__main__":
    dist.init_process_group("gloo")  # kept from the DDP script: its traffic crosses the spine
    rank = int(os.environ["RANK"])
    model = build_model()
    opt, sched = optimizer(model, STEPS, 3e-3)
    opt = mindp.torch.init(model, opt, sched)
    for step in range(opt.step_number, STEPS):
        x, y = batch(rank, step)
        opt.zero_grad()
        loss = loss_fn(model, x, y)
        loss.backward()
        opt.step()
        sched.step()
        losses = [torch.zeros(1) for _ in range(dist.get_world_size())]
        dist.all_gather(losses, loss.detach().reshape(1))
        if rank == 0:
            print(json.dumps({{"step": step, "loss": loss.item(), "losses": [float(x) for x in losses]}}), flush=True)
    if rank == 0:
        opt.save({out!r})
    dist.barrier()
    dist.destroy_process_group()
'''


@needs_root
def test_a_script_on_a_leaf_spine_with_two_optimizer_shards_is_bit_exact_and_saves_from_both(tmp_path):
    script = tmp_path / "tree.py"
    ckpt = tmp_path / "final.pt"
    script.write_text(TREE_SCRIPT.format(examples=str(REPO / "examples"), out=str(ckpt)))
    run = MakeRun(tmp_path, "--target", "embedded", "--topo", "leafspine", "--leaves", "2", "--workers", "1",
                  "--optimizers", "2", "--p4", "committed", "--script", str(script), "--args", "")
    assert run.run() == 0, run.err + run.out
    assert "2 leaves x 1 torchrun ranks, 2 optimizer node(s)" in run.out
    s = run.summary()
    assert s["max_abs_param_diff_vs_reference"] == 0.0 and s["steps"] == 3
    assert (s["digest_checks"], s["digest_mismatches"]) == (2 * 3, 0)
    job = run.run_dir / "job1"
    topo = json.loads((run.run_dir / "topology.json").read_text())["jobs"][0]
    assert topo["optimizer"] == ["opt1_0", "opt1_1"] and topo["chunks"] > 1  # the script's model's chunks, split
    shards = [json.loads((job / f"optimizer-stats-shard{i}.json").read_text()) for i in range(2)]
    assert all(sh["applied"] > 0 and sh["committed"] == 2 for sh in shards)  # each node applied its own range
    # rank 0's gloo group gathered both ranks' losses, over the leaves and the spine
    log = (run.run_dir / "logs" / "torchrun.log").read_text()
    lines = [json.loads(ln[ln.index("{"):]) for ln in log.splitlines() if '"losses"' in ln]
    assert [ln["step"] for ln in lines] == [0, 1, 2] and all(len(set(ln["losses"])) == 2 for ln in lines)
    # opt.save joined both shards' committed state: the master the run compared, and their AdamW state
    saved = torch.load(ckpt)
    master = np.load(job / "optimizer-master.npz")
    assert saved["step"] == 2 and set(master.files) == set(saved["mindp"]["params"])
    assert all(np.array_equal(saved["model"][n].numpy(), master[n]) for n in master.files)
    assert all(st["exp_avg_sq"].abs().sum() > 0 for st in saved["optimizer"]["state"].values())
    assert_clean(run)
