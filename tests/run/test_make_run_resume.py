"""make run RESUME=<run> end to end: a run continued from its node's committed state ends on the bits
of an uninterrupted run (the reference trainer over all steps), built-in model and SCRIPT= alike."""
from __future__ import annotations

import json
import os
import signal
from contextlib import contextmanager

import pytest

from mininet_topos.agents import STATE
from tests.run.makerun import REPO, MakeRun, assert_clean, needs_root

pytestmark = pytest.mark.net


@contextmanager
def ended(run: MakeRun):
    """The body with a run up (UP=1); make stop's SIGTERM after it, whether it passed or not: the
    network stays up until told, and a failed test must not leave it running."""
    try:
        yield
    finally:
        if run.proc.poll() is None:
            run.proc.send_signal(signal.SIGTERM)


def latest(tmp_path) -> dict:
    s = json.loads((tmp_path / "runs" / "latest" / "summary.json").read_text())
    assert not s.get("digest_mismatches"), f"{s['digest_mismatches']} digest mismatch(es)"  # as MakeRun.summary
    return s


@needs_root
def test_mlp_run_resumed_with_more_steps_is_bit_exact_with_all_steps(tmp_path):
    first = MakeRun(tmp_path, "--target", "embedded", "--workers", "2", "--steps", "3", "--p4", "committed")
    assert first.run() == 0, first.err + first.out
    old = first.run_dir
    again = MakeRun(tmp_path, "--target", "embedded", "--steps", "6", "--p4", "committed", "--resume", "latest",
                    "--given", "RESUME STEPS TARGET")
    assert again.run() == 0, again.err + again.out
    s = latest(tmp_path)
    assert s["resumed_from"] == {"run": str(old.resolve()), "first_step": 3}
    assert (s["steps"], s["workers"], s["max_abs_param_diff_vs_reference"]) == (6, 2, 0.0)
    assert f"resuming {old.resolve()} after its node's commit: from step 3" in again.out
    assert_clean(again)


@needs_root
def test_a_run_resumes_at_its_own_k_whatever_the_environments(tmp_path):
    """The state's chunks are the run's K elements: RESUME without K= takes the run's, not the
    environment's or the target's default (a K = 1,024 run resumed at TARGET=auto's K = 32 ended off
    the reference)."""
    from mindp import protocol

    k = protocol.HARDWARE_K if protocol.K != protocol.HARDWARE_K else protocol.DEFAULT_K  # not this process's
    first = MakeRun(tmp_path, "--target", "embedded", "--k", str(k), "--workers", "2", "--steps", "2",
                    "--p4", "committed")
    assert first.run() == 0, first.err + first.out
    again = MakeRun(tmp_path, "--target", "embedded", "--steps", "4", "--resume", "latest", "--given",
                    "RESUME STEPS TARGET", "--p4", "committed")
    assert again.run() == 0, again.err + again.out
    assert f"K = {k} elements a frame" in again.out
    s = latest(tmp_path)
    assert (s["k"], s["steps"], s["max_abs_param_diff_vs_reference"]) == (k, 4, 0.0)
    assert_clean(again)


@needs_root
def test_leafspine_run_whose_shards_committed_apart_resumes_bit_exact_with_all_steps(tmp_path):
    """Shard 0's commit is taken back one step (as if the run died after shard 1 committed step 2,
    before shard 0 did; the copy after step 1 is still there, step 2 read it): the workers start
    at step 2, shard 1 answers it from its commit, and the run ends on the reference's bits."""
    first = MakeRun(tmp_path, "--target", "embedded", "--topo", "leafspine", "--leaves", "2", "--workers", "1",
                    "--optimizers", "2", "--steps", "3", "--p4", "committed")
    assert first.run() == 0, first.err + first.out
    old = first.run_dir
    commit = old / "job1" / "optimizer-state-shard0" / "commit.json"
    c = json.loads(commit.read_text())
    assert c["step"] == 2 and not c.get("skipped")
    c.pop("crc")  # a record edited by hand keeps no crc of its old fields
    commit.write_text(json.dumps({**c, "step": 1, "updates": c["updates"] - 1}))
    again = MakeRun(tmp_path, "--steps", "5", "--loss", "0.02", "--p4", "committed", "--resume", "latest",
                    "--given", "RESUME STEPS LOSS")
    assert again.run() == 0, again.err + again.out
    s = latest(tmp_path)
    assert s["resumed_from"] == {"run": str(old.resolve()), "first_step": 2}
    assert (s["steps"], s["workers"], s["max_abs_param_diff_vs_reference"]) == (5, 2, 0.0)
    assert f"resuming {old.resolve()} after its node's commit: from step 2" in again.out
    assert_clean(again)


STAR = ("--workers", "2")
LEAFSPINE = ("--topo", "leafspine", "--leaves", "2", "--workers", "1", "--optimizers", "2")
TOPOS = pytest.mark.parametrize("topo", [STAR, LEAFSPINE], ids=["star", "leafspine-2-shards"])


STOPPING_SCRIPT = '''
import argparse, os, pathlib, sys
sys.path.insert(0, {examples!r})
import torch, mindp.torch
import train_cnn
from train_cnn import batch, loss_fn


def parse(argv=None):  # train_cnn's, and --shift: other batches (a resumed run's ARGS)
    p = argparse.ArgumentParser()
    p.add_argument("--shift", type=int, default=0)
    args, rest = p.parse_known_args(argv)
    return argparse.Namespace(**vars(train_cnn.parse(rest)), shift=args.shift)


def build_model():  # train_cnn's with dropout: each rank draws its masks, the reference replays them
    *features, head = train_cnn.build_model()
    return torch.nn.Sequential(*features, torch.nn.Dropout(0.3), head)


def optimizer(model, lr):  # the head in a group at twice the lr; a decay on each side of the stop
    head = list(model[-1].parameters())
    body = [p for p in model.parameters() if all(p is not h for h in head)]
    opt = torch.optim.SGD([dict(params=body), dict(params=head, lr=2 * lr)], lr=lr, momentum=0.9)
    return opt, torch.optim.lr_scheduler.MultiStepLR(opt, [1, 3], 0.5)


def mindp_reference(argv):
    args = parse(argv)
    return dict(model=build_model, loss=loss_fn, steps=args.steps, optimizer=lambda model: optimizer(model, args.lr),
                batch=lambda rank, step: batch(rank, step + args.shift))


def main():
    args = parse()
    torch.set_num_threads(1)
    model = build_model()
    opt, sched = optimizer(model, args.lr)
    opt = mindp.torch.init(model, opt, sched)
    flag = pathlib.Path({flag!r})
    for step in range(opt.step_number, args.steps):
        if step == 2 and not flag.exists():  # the first run ends here, as a crashed one would
            if os.environ["RANK"] == "0":
                flag.write_text("stopped")
            raise SystemExit(3)
        x, y = batch(int(os.environ["RANK"]), step + args.shift)
        opt.zero_grad()
        loss = loss_fn(model, x, y)
        loss.backward()
        opt.step()
        sched.step()  # (init brought a resumed run's scheduler to the node's step)
        mindp.torch.log(loss=loss.item())


if __name__ == "__main__":
    main()
'''


@needs_root
@pytest.mark.parametrize("topo, new_args", [(STAR, "--steps 5 --shift 100"), (LEAFSPINE, None)],
                         ids=["star-args-changed", "leafspine-2-shards"])
def test_script_run_that_failed_resumes_where_its_node_committed(tmp_path, topo, new_args):
    """With dropout: the reference draws each rank's masks as its process did, afresh where the
    resumed run's ranks started (mininet_topos.script_run.rank_starts). The head trains in a
    parameter group at twice the lr, and MultiStepLR decays both before and after the stop: the
    resumed ranks' fresh scheduler is brought to the node's step. On a leaf-spine with two
    optimizer shards the ranks take the step and weights every shard committed. Given ARGS, the
    resumed run trains on to their steps, on other batches: the reference replays the steps before
    with the earlier ARGS (mininet_topos.script_run.args_from)."""
    pytest.importorskip("torch")  # a SCRIPT= run (make torch)
    script = tmp_path / "stopping.py"
    script.write_text(STOPPING_SCRIPT.format(examples=str(REPO / "examples"), flag=str(tmp_path / "flag")))
    args = ("--target", "embedded", *topo, "--p4", "committed", "--script", str(script), "--args=--steps 4")
    first = MakeRun(tmp_path, *args)
    assert first.run() == 1
    assert "rank 0 failed: exit 3" in first.err or "rank 1 failed: exit 3" in first.err, first.err
    if new_args:  # a change of the optimizer is refused before the network comes up, and no run is left
        refused = MakeRun(tmp_path, "--resume", "latest", f"--args={new_args} --lr 0.5", "--given", "RESUME ARGS",
                          "--p4", "committed")
        assert refused.run() == 2
        assert "RESUME: the script's optimizer is not the one" in refused.err and "lr 0.003 -> 0.5" in refused.err
        assert (tmp_path / "runs" / "latest").resolve() == first.run_dir.resolve()
    given = (f"--args={new_args}", "--given", "RESUME ARGS") if new_args else ("--given", "RESUME")
    again = MakeRun(tmp_path, "--resume", "latest", *given, "--p4", "committed")
    assert again.run() == 0, again.err + again.out
    s = latest(tmp_path)
    steps = 5 if new_args else 4
    assert s["resumed_from"]["first_step"] == 2 and s["steps"] == steps  # the job's steps, from 2 in this run
    assert s["max_abs_param_diff_vs_reference"] == 0.0
    assert [st for st, _ in s["loss_curve"]] == list(range(2, steps))
    assert_clean(again)


@needs_root
@TOPOS
def test_up_runs_the_users_own_torchrun_commands_through_the_switch(tmp_path, topo):
    """UP=1: the printed commands (one per worker host, each on its core: PIN=1) train
    examples/train_cnn.py through the switch (or a leaf-spine, the job's optimizer in two shards);
    make stop's SIGTERM ends the run, which reports the ranks' steps bit-exact with the reference."""
    pytest.importorskip("torch")  # a SCRIPT= run (make torch)
    from mindp import progress

    run = MakeRun(tmp_path, "--target", "embedded", *topo, "--p4", "committed", "--script",
                  str(REPO / "examples" / "train_cnn.py"), "--args=--steps 3", "--up", "--pin", "1").start()
    cmds = tmp_path / "runs" / "latest" / "torchrun-commands.sh"
    with ended(run):
        progress.wait(lambda: cmds.exists() or run.proc.poll() is not None, progress.activity(run.proc.pid),
                      stall=progress.STALL, what="make run UP=1 start")
        assert run.proc.poll() is None, run.proc.communicate()
        assert cmds.read_text().count("--rdzv-backend static") == 2
        ranks = progress.run(["sh", str(cmds)], cwd=REPO, capture_output=True, text=True)
        assert ranks.returncode == 0, ranks.stdout[-2000:] + ranks.stderr[-2000:]
    assert run.wait() == 0, run.err + run.out
    s = latest(tmp_path)
    assert s["steps"] == 3 and s["max_abs_param_diff_vs_reference"] == 0.0
    cores = sorted(os.sched_getaffinity(0))  # PIN=1: rank N's command on core N, round-robin
    assert f"rank 1 (w1_1): taskset -c {cores[1 % len(cores)]} mnexec -a" in run.out
    # the example prints {"step", "loss"} lines (no mindp.torch.log): rank 0's output is the curve
    assert [st for st, _ in s["loss_curve"]] == [0, 1, 2], s["loss_curve"]
    assert '{"step": 2, "loss": ' in ranks.stdout and f"steps done 3  loss {s['loss_curve'][-1][1]:.4f}" in run.out
    assert_clean(run)


@needs_root
def test_a_script_run_resumes_under_the_users_own_torchrun_with_new_args(tmp_path):
    """RESUME= UP=1 ARGS=...: the printed commands start the ranks at the node's step with the new
    arguments, and the run ends on the reference's bits over every step."""
    pytest.importorskip("torch")  # a SCRIPT= run (make torch)
    from mindp import progress

    script = tmp_path / "stopping.py"
    script.write_text(STOPPING_SCRIPT.format(examples=str(REPO / "examples"), flag=str(tmp_path / "flag")))
    first = MakeRun(tmp_path, "--target", "embedded", *STAR, "--p4", "committed", "--script", str(script),
                    "--args=--steps 4")
    assert first.run() == 1
    run = MakeRun(tmp_path, "--resume", "latest", "--args=--steps 5 --shift 100", "--up", "--given", "RESUME ARGS UP",
                  "--p4", "committed").start()
    cmds = tmp_path / "runs" / "latest" / "torchrun-commands.sh"
    with ended(run):
        progress.wait(lambda: cmds.exists() or run.proc.poll() is not None, progress.activity(run.proc.pid),
                      stall=progress.STALL, what="make run RESUME= UP=1 start")
        assert run.proc.poll() is None, run.proc.communicate()
        assert "--steps 5 --shift 100" in cmds.read_text()
        ranks = progress.run(["sh", str(cmds)], cwd=REPO, capture_output=True, text=True)
        assert ranks.returncode == 0, ranks.stdout[-2000:] + ranks.stderr[-2000:]
    assert run.wait() == 0, run.err + run.out
    s = latest(tmp_path)
    assert s["resumed_from"]["first_step"] == 2 and s["steps"] == 5
    assert s["max_abs_param_diff_vs_reference"] == 0.0
    assert_clean(run)


@needs_root
def test_a_run_stopped_by_ctrl_c_keeps_its_steps_and_resumes_bit_exact(tmp_path):
    """With SYNC=exit (commits without fsync): the stopped run's node state resumes (the same boot),
    and the resumed run, which keeps SYNC=exit, leaves its node's last commit durable."""
    from mindp import progress

    # 400 steps (the mlp runs about 35 a second here): the SIGINT comes well before the last
    run = MakeRun(tmp_path, "--target", "embedded", "--workers", "2", "--steps", "400", "--p4", "committed",
                  "--sync", "exit").start(ctrl_c=True)
    log = tmp_path / "runs" / "latest" / "logs" / "worker-job1-0.log"

    def at_step_3() -> bool:
        return run.proc.poll() is not None or (log.exists() and '"step": 3,' in log.read_text())

    progress.wait(at_step_3, progress.activity(run.proc.pid), stall=progress.STALL, what="3 steps")
    run.proc.send_signal(signal.SIGINT)
    assert run.wait() == 130, run.err + run.out
    assert "make run: stopped (interrupted); everything it started is cleaned up" in run.err
    old = (tmp_path / "runs" / "latest").resolve()
    s = latest(tmp_path)
    assert s["stopped"] == "interrupted" and s["steps_done"] >= 3 and len(s["loss_curve"]["1"]) >= 4
    assert len((old / "metrics.csv").read_text().splitlines()) >= 1 + 3 and (old / "curve.svg").exists()
    again = MakeRun(tmp_path, "--resume", "latest", "--given", "RESUME", "--p4", "committed")
    assert again.run() == 0, again.err + again.out
    assert "seed 0; node state made durable at exit (SYNC=exit)" in again.out
    s = latest(tmp_path)
    assert s["resumed_from"]["run"] == str(old) and s["resumed_from"]["first_step"] >= 3
    assert s["steps"] == 400 and s["max_abs_param_diff_vs_reference"] == 0.0
    commit = json.loads((tmp_path / "runs" / "latest" / "job1" / STATE / "commit.json").read_text())
    assert commit["step"] == 399 and "boot" not in commit
    assert json.loads((tmp_path / "runs" / "latest" / "config.json").read_text())["sync"] == "exit"
    assert_clean(again)
