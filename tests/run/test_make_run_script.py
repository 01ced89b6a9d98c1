"""make run SCRIPT=... end to end: a user's torchrun script (mindp.torch.init) on every worker host
of the Mininet network; its final weights equal the reference the script defines, bit for bit;
without a reference the loss curve is the result; a broken script is one line."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mindp import targets  # noqa: E402
from mininet_topos import config, metrics  # noqa: E402
from tests.run.makerun import REPO, MakeRun, assert_clean, needs_root  # noqa: E402

pytestmark = pytest.mark.net
TARGETS = [pytest.param("embedded"),
           pytest.param("bmv2", marks=pytest.mark.skipif(targets.find_bmv2() is None,
                                                        reason="BMv2 simple_switch_grpc not installed"))]


def script_run(tmp_path, target: str, script: str, args: str, *extra: str) -> MakeRun:
    return MakeRun(tmp_path, "--target", target, "--workers", "2", "--p4", "committed", "--script", script,
                   "--args", args, *extra)


def own_script_run(tmp_path, name: str, text: str) -> MakeRun:
    """A script of the test's own, written to tmp_path/name, run on the embedded switch without ARGS."""
    script = tmp_path / name
    script.write_text(text)
    return script_run(tmp_path, "embedded", str(script), "")


@needs_root
@pytest.mark.parametrize("target", TARGETS)
def test_cnn_example_is_bit_exact_with_its_reference(tmp_path, target):
    run = script_run(tmp_path, target, str(REPO / "examples" / "train_cnn.py"), "--steps 5",
                     *(["--loss", "0.02"] if target == "embedded" else []))
    assert run.run() == 0, run.err + run.out
    s = run.summary()
    assert s["max_abs_param_diff_vs_reference"] == 0.0 and s["steps"] == 5 and s["target"] == target
    assert [step for step, _ in s["loss_curve"]] == list(range(5))
    # every rank checked every step against the node's step digest, as a built-in worker does
    assert (s["digest_checks"], s["digest_mismatches"]) == (2 * 5, 0)
    assert "bit-exact with the script's single-process reference" in run.out
    assert "mindp_reference in this process (5 steps)" in run.out and "reference: 5 step(s) in " in run.out
    assert "train_cnn.py (3,818 parameters, adamw lr 0.003, schedule cosine)" in run.out
    assert json.loads((run.run_dir / "job1" / "spec" / "optimizer.json").read_text())["schedule"]["warmup"] == 1
    assert_clean(run)


@needs_root
def test_a_script_run_with_check_0_trains_no_reference_and_says_so(tmp_path):
    run = script_run(tmp_path, "embedded", str(REPO / "examples" / "train_cnn.py"), "--steps 3", "--check", "0")
    assert run.run() == 0, run.err + run.out
    s = run.summary()
    assert s["not_compared"].startswith("CHECK=0") and s["max_abs_param_diff_vs_reference"] is None and s["steps"] == 3
    assert "not compared with the script's reference (CHECK=0)" in run.out and "mindp_reference in this" not in run.out
    assert_clean(run)


@needs_root
def test_gpt_example_is_bit_exact_with_its_reference(tmp_path):
    run = script_run(tmp_path, "embedded", str(REPO / "examples" / "train_gpt.py"),
                     """--steps 3 --gpt '{"d": 16, "layers": 1, "heads": 2, "ctx": 8}'""")
    assert run.run() == 0, run.err + run.out
    assert run.summary()["max_abs_param_diff_vs_reference"] == 0.0  # its biases and norms without weight decay
    assert "adamw lr 0.003, schedule linear, 2 parameter groups)" in run.out
    assert_clean(run)


SCRIPT_WITHOUT_REFERENCE = '''
import json, os, torch, mindp.torch
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
sched = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)
opt = mindp.torch.init(model, opt, sched)
for step in range(3):
    opt.zero_grad()
    loss = model(torch.ones(3, 4) * (int(os.environ["RANK"]) + 1)).pow(2).mean()
    loss.backward()
    opt.step()
    sched.step()
    if os.environ["RANK"] == "0":
        print(json.dumps({"step": step, "loss": float(loss)}), flush=True)
'''


@needs_root
def test_script_without_reference_reports_its_loss_curve(tmp_path):
    run = own_script_run(tmp_path, "mine.py", SCRIPT_WITHOUT_REFERENCE)
    assert run.run() == 0, run.err + run.out
    s = run.summary()
    assert s["max_abs_param_diff_vs_reference"] is None and len(s["loss_curve"]) == 3
    assert "defines no mindp_reference" in run.out and "sgd lr 0.1, schedule step" in run.out
    assert any((run.run_dir / "logs" / "torchrun").iterdir())  # torchrun's files: the run's, not /tmp's
    assert_clean(run)


NANOGPT_STYLE = '''
import math, os, sys
sys.path.insert(0, {examples!r})
import torch, mindp.torch
from train_cnn import batch, build_model, loss_fn

STEPS = 5


def get_lr(it, lr=3e-3, warmup=2, min_lr=3e-4):  # nanoGPT's: linear warmup, then cosine to min_lr
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * (it - warmup) / (STEPS - warmup))) * (lr - min_lr)


def optimizer(model):  # nanoGPT's groups (matrices decay, the rest not), and a layer-wise lr scale
    params = [p for p in model.parameters() if p.requires_grad]  # (the first layer at half the lr, as
    mats = [p for p in params if p.dim() >= 2]  # BEiT and MAE fine-tune: lr_scale, a key of their own)
    return torch.optim.AdamW([dict(params=mats[1:], weight_decay=0.1, lr_scale=1.0),
                              dict(params=mats[:1], weight_decay=0.1, lr_scale=0.5),
                              dict(params=[p for p in params if p.dim() < 2], weight_decay=0.0, lr_scale=0.3)],
                             lr=3e-3), None


def mindp_reference(argv):
    return dict(model=build_model, batch=batch, loss=loss_fn, optimizer=optimizer, steps=STEPS)


if __name__ == "__main__":
    model = build_model()
    opt = mindp.torch.init(model, optimizer(model)[0], follow_lr=True)
    for it in range(STEPS):
        for g in opt.param_groups:  # the lrs set by hand, before the step's forward and backward
            g["lr"] = get_lr(it) * g["lr_scale"]
        loss_fn(model, *batch(int(os.environ["RANK"]), it)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)  # nanoGPT zeroes after the step
'''


@needs_root
def test_a_script_setting_its_lr_by_hand_trains_bit_exact_with_follow_lr(tmp_path):
    """nanoGPT's loop: the lr set by hand each iteration (warmup, then cosine), zero_grad after the
    step, decay and no-decay groups, each at its own scale of the lr (the first two starting alike);
    init(follow_lr=True): each rank tells the node the step's lrs as its first gradient leaves, and
    the run equals the reference trained at the lrs told."""
    run = own_script_run(tmp_path, "nanogpt_style.py", NANOGPT_STYLE.format(examples=str(REPO / "examples")))
    assert run.run() == 0, run.err + run.out
    s = run.summary()
    assert s["max_abs_param_diff_vs_reference"] == 0.0 and s["steps"] == 5
    assert "adamw the lr its script sets (follow_lr), 3 parameter groups)" in run.out
    assert_clean(run)


SCRIPT_WITH_A_RANK_AWAY = '''
import datetime, os, time, torch, mindp.torch
model = torch.nn.Linear(4, 2)
opt = mindp.torch.init(model, torch.optim.SGD(model.parameters(), lr=0.1), timeout=datetime.timedelta(seconds=5))
for step in range(3):
    if step == 1 and os.environ["RANK"] == "0":
        time.sleep(3600)  # working alone (evaluating, saving): its peer gets no parameters meanwhile
    opt.zero_grad()
    model(torch.ones(3, 4)).pow(2).mean().backward()
    opt.step()
'''


@needs_root
def test_a_rank_left_waiting_past_init_timeout_fails_in_one_line_naming_it(tmp_path):
    """init(timeout=) is the step's wait for parameters (as torch.distributed's timeout; default 60 s):
    past it, the waiting rank ends the run in one line that says how to give a peer more time."""
    run = own_script_run(tmp_path, "away.py", SCRIPT_WITH_A_RANK_AWAY)
    assert run.run() == 1
    (line,) = [ln for ln in run.err.splitlines() if ln.strip()]
    assert "rank 1 failed: mindp.torch: job 1 worker 1 step 1: no parameters" in line, line
    waited = float(re.search(r"after (\d+\.\d) s without progress", line)[1])
    assert 5 <= waited < 60, line  # the script's timeout, not the default
    assert "needs a longer mindp.torch.init(timeout=...)" in line
    assert_clean(run)


SCRIPT_WITH_AN_INF = '''
import os, torch, mindp.torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = mindp.torch.init(model, torch.optim.SGD(model.parameters(), lr=0.1))
for step in range(3):
    opt.zero_grad()
    loss = model(torch.ones(3, 4)).pow(2).mean()
    (loss * float("inf") if step == 1 and os.environ["RANK"] == "1" else loss).backward()
    opt.step()
    mindp.torch.log(loss=loss.item())
'''


@needs_root
def test_a_step_skipped_for_a_non_finite_gradient_is_told_by_the_rank_and_the_run(tmp_path):
    """DDP would train on the Inf; the node skips the step (as GradScaler does), and says so."""
    run = own_script_run(tmp_path, "inf.py", SCRIPT_WITH_AN_INF)
    assert run.run() == 0, run.err + run.out
    assert run.summary()["skipped_steps"] == [1]
    assert "1 step(s) skipped by the optimizer node, a gradient not finite (Inf or NaN): 1 (" in run.out
    log = (run.run_dir / "logs" / "torchrun.log").read_text()
    assert log.count("mindp.torch: step 1: a rank's gradients were not finite") == 2, log  # each rank's line
    assert "step 0: a rank's" not in log and "step 2: a rank's" not in log
    assert_clean(run)


@needs_root
def test_script_that_never_calls_init_fails_in_one_line(tmp_path):
    run = own_script_run(tmp_path, "plain.py", "print('hello')\n")
    assert run.run() == 1
    (line,) = [ln for ln in run.err.splitlines() if ln.strip()]
    assert "describe run failed" in line and "does it call mindp.torch.init?" in line
    assert_clean(run)


@pytest.mark.parametrize("kw, message", [
    (dict(script="/nonexistent/train.py"), "is not a file"),
    (dict(script_args="--steps 3"), "ARGS are the arguments of SCRIPT"),
    (dict(script_args="", given="ARGS"), "ARGS are the arguments of SCRIPT"),  # make run ARGS= (mlp): not ignored
    (dict(script=str(REPO / "examples" / "train_cnn.py"), jobs="2"), "SCRIPT runs one job"),
    (dict(script=str(REPO / "examples" / "train_cnn.py"), script_args="'unclosed"), "ARGS cannot be split"),
])
def test_script_settings_are_checked(kw, message):
    with pytest.raises(config.RunConfigError, match=message):
        config.parse(**kw)


PLAIN_SCRIPT = '''
import os, torch, mindp.torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
model[0].weight.requires_grad_(False)  # frozen: left out of the layout, as DDP leaves it out
opt = torch.optim.Adam(model.parameters(), lr=0.01)  # no weight decay: AdamW's update at 0
opt = mindp.torch.init(model, opt)
rank = int(os.environ["RANK"])
for step in range(4):
    opt.zero_grad()
    loss = model(torch.ones(3, 4) * (rank + 1)).pow(2).mean()
    loss.backward()
    if step == 1 and os.environ.get("SET_LR"):
        opt.param_groups[0]["lr"] = 0.005  # by hand: the node's lr stays 0.01
    opt.step()
    mindp.torch.log(loss=loss.item())
    print(f"step {step} loss {loss.item():.4f}", flush=True)
    if step == 2 and os.environ.get("CLIP") and rank == 1:
        opt.zero_grad()
        model(torch.ones(3, 4)).sum().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
'''


@needs_root
def test_plain_text_script_shows_rank0_and_writes_per_step_figures(tmp_path):
    """A script printing plain text, with a frozen layer, reporting its loss with mindp.torch.log:
    rank 0's lines prefixed on the terminal, the steps and loss in summary, curve and metrics.csv."""
    run = own_script_run(tmp_path, "plain.py", PLAIN_SCRIPT)
    assert run.run() == 0, run.err + run.out
    assert "[rank0] step 3 loss" in run.out and "[rank1]" not in run.out
    s = run.summary()
    assert s["steps"] == 4 and [st for st, _ in s["loss_curve"]] == [0, 1, 2, 3] and s["packets_sent"] > 0
    assert "(11 parameters" in run.out  # the frozen 3x4 weight is not trained: 3 + 6 + 2
    rows = (run.run_dir / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("job,step,loss,accuracy,step_seconds,grad_frames,retransmissions") and len(rows) == 5
    table = metrics.read_csv(run.run_dir / "metrics.csv")  # the ranks' zero_grad() to step(), then their wait
    assert all(r.compute_seconds > 0 and r.wait_seconds > 0 for r in table) and s["compute_share"] > 0
    assert all(r.worker_cpu_seconds > 0 for r in table) and s["worker_cpu_seconds_a_step"] > 0  # each rank's process
    assert "CPU a step: a worker" in run.out
    assert "<polyline" in (run.run_dir / "curve.svg").read_text()
    assert_clean(run)


def plain_script_failing(tmp_path, switch: str) -> tuple[MakeRun, str]:
    """PLAIN_SCRIPT with its `switch` (an environment variable it reads) on: the run, exit 1, and its
    one line on stderr."""
    run = own_script_run(tmp_path, "failing.py", PLAIN_SCRIPT.replace(f'os.environ.get("{switch}")', "True"))
    assert run.run() == 1
    (line,) = [ln for ln in run.err.splitlines() if ln.strip()]
    return run, line


@needs_root
def test_a_failing_rank_is_named_with_its_exception_in_one_line(tmp_path):
    run, line = plain_script_failing(tmp_path, "CLIP")
    assert line.startswith("make run: the script failed: rank 1 failed: mindp.torch: torch.nn.utils.clip_grad_norm_ "
                           "is not supported"), line
    assert line.endswith("torchrun.log")
    assert_clean(run)


ACCUMULATING_SCRIPT = '''
import os, sys
sys.path.insert(0, {examples!r})
import torch, mindp.torch
from train_cnn import batch, build_model, loss_fn, optimizer

MICRO = 2  # micro-batches of 16 a step (two: their gradients' fp32 sum has one order)


def two_halves(x, y):
    return [(x[i * 16:(i + 1) * 16], y[i * 16:(i + 1) * 16]) for i in range(MICRO)]


def accumulated_loss(model, x, y):  # the reference's one backward: the sum of the micro-batches' losses
    return sum(loss_fn(model, xm, ym) for xm, ym in two_halves(x, y))


def mindp_reference(argv):
    return dict(model=build_model, batch=lambda r, s: batch(r, s, 16 * MICRO), loss=accumulated_loss, steps=4,
                optimizer=lambda model: optimizer(model, 4, 3e-3))


def main():
    torch.set_num_threads(1)
    model = build_model()
    opt, sched = optimizer(model, 4, 3e-3)
    opt = mindp.torch.init(model, opt, sched)
    for step in range(opt.step_number, 4):
        parts = two_halves(*batch(int(os.environ["RANK"]), step, 16 * MICRO))
        opt.zero_grad()
        if step % 2:  # nanoGPT's loop: DDP's attribute, set on the model before each micro-batch
            for micro, (xm, ym) in enumerate(parts):
                model.require_backward_grad_sync = micro == len(parts) - 1
                loss_fn(model, xm, ym).backward()
        else:
            with opt.no_sync():
                for xm, ym in parts[:-1]:
                    loss_fn(model, xm, ym).backward()
            loss_fn(model, *parts[-1]).backward()
        opt.step()
        sched.step()


if __name__ == "__main__":
    main()
'''


@needs_root
def test_gradients_accumulated_under_no_sync_train_bit_exactly(tmp_path):
    """Two micro-batches a step, the first under opt.no_sync() (odd steps: with nanoGPT's
    model.require_backward_grad_sync = False): bit-exact with one backward of their summed losses
    in one process."""
    run = own_script_run(tmp_path, "accumulate.py", ACCUMULATING_SCRIPT.format(examples=str(REPO / "examples")))
    assert run.run() == 0, run.err + run.out
    assert run.summary()["max_abs_param_diff_vs_reference"] == 0.0
    assert_clean(run)


GROUP_SCRIPT = '''
import os, sys, torch, torch.distributed as dist, mindp.torch
dist.init_process_group("gloo")  # kept from the DDP script, for its own metrics
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = mindp.torch.init(model, torch.optim.SGD(model.parameters(), lr=0.1))
rank = int(os.environ["RANK"])
for step in range(3):
    opt.zero_grad()
    loss = model(torch.ones(3, 4) * (rank + 1)).pow(2).mean()
    loss.backward()
    opt.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    mine = torch.tensor([float(loss)])
    losses = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(losses, mine)
    if rank == 0:
        print(f"step {step} mean {float(mean) / dist.get_world_size():.6f} of {[round(float(x), 6) for x in losses]}",
              flush=True)
dist.barrier()
dist.destroy_process_group()
# torch's gloo teardown at interpreter exit can abort ("terminate called without an active
# exception", SIGABRT; once in a suite under load): a torch bug this test is not about.
sys.stdout.flush()
os._exit(0)
'''


@needs_root
def test_a_scripts_own_process_group_works_over_the_hosts_links(tmp_path):
    """A DDP script's init_process_group("gloo") kept for its metrics: inert in the describe run,
    real between the ranks in their hosts (the store on rank 0's host, gloo on the hosts'
    interfaces): all_reduce and all_gather see every rank's loss."""
    run = own_script_run(tmp_path, "group.py", GROUP_SCRIPT)
    assert run.run() == 0, run.err + run.out
    lines = [ln for ln in run.out.splitlines() if ln.startswith("[rank0] step ")]
    assert len(lines) == 3
    for ln in lines:
        mean, losses = ln.split(" mean ")[1].split(" of ")
        losses = json.loads(losses)
        assert len(losses) == 2 and losses[0] != losses[1]  # the two ranks' own batches
        assert float(mean) == pytest.approx(sum(losses) / 2, abs=1e-5)
    assert_clean(run)


@needs_root
def test_an_lr_set_by_hand_is_refused_in_one_line_not_ignored(tmp_path):
    run, line = plain_script_failing(tmp_path, "SET_LR")
    assert line.startswith("make run: the script failed: rank "), line
    assert "mindp.torch: step 1: the script's optimizer holds lr 0.005, the node applied 0.01 (constant schedule" in line
    assert_clean(run)


@needs_root
def test_a_script_whose_init_refuses_says_why_without_asking_whether_it_calls_init(tmp_path):
    run = own_script_run(tmp_path, "adam.py", "import torch, mindp.torch\nm = torch.nn.Linear(2, 2)\n"
                         "mindp.torch.init(m, torch.optim.RMSprop(m.parameters()))\n")
    assert run.run() == 1
    (line,) = [ln for ln in run.err.splitlines() if ln.strip()]
    assert "describe run failed (exit 1): mindp.torch.init: optimizer RMSprop is not supported" in line
    assert "does it call" not in line
    assert_clean(run)


TIED_SCRIPT = '''import os, torch, torch.nn.functional as F, mindp.torch

STEPS = 3


class Tiny(torch.nn.Module):  # nanoGPT's tying: the head's weight is the embedding's
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.wte = torch.nn.Embedding(16, 8)
        self.mid = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, x):
        return self.head(torch.tanh(self.mid(self.wte(x))))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randint(0, 16, (6,), generator=g)
    return x, (x + 1) % 16


def loss_fn(model, x, y):
    return F.cross_entropy(model(x), y)


def optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=0.01), None


def mindp_reference(argv):
    return dict(model=Tiny, batch=batch, loss=loss_fn, optimizer=optimizer, steps=STEPS)


if __name__ == "__main__":
    model = Tiny()
    opt = mindp.torch.init(model, optimizer(model)[0])
    rank = int(os.environ["RANK"])
    for step in range(opt.step_number, STEPS):
        x, y = batch(rank, step)
        opt.zero_grad()
        loss = loss_fn(model, x, y)
        loss.backward()
        opt.step()
        mindp.torch.log(loss=loss.item())
    assert model.head.weight is model.wte.weight
    if rank == 0:
        opt.save({out!r})
'''


@needs_root
def test_a_tied_weight_trains_once_bit_exact_and_saves_as_the_master_under_both_names(tmp_path):
    """nanoGPT ties its head to its embedding: one parameter under two names, trained once (its
    gradient accumulated from both uses), and opt.save's state_dict holds the master under each."""
    ckpt = tmp_path / "tied.pt"
    script = tmp_path / "tied.py"
    script.write_text(TIED_SCRIPT.format(out=str(ckpt)))
    run = script_run(tmp_path, "embedded", str(script), "")
    assert run.run() == 0, run.err + run.out
    assert run.summary()["max_abs_param_diff_vs_reference"] == 0.0
    assert "tied.py (200 parameters" in run.out  # 16x8 shared, 8x8 + 8: not the head's 16x8 again
    model = torch.load(ckpt, weights_only=True)["model"]
    master = np.load(run.run_dir / "job1" / "optimizer-master.npz")
    assert np.array_equal(model["head.weight"].numpy(), master["wte.weight"])
    assert_clean(run)
