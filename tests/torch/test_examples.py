"""examples/train_cnn.py and train_gpt.py (DDP scripts with mindp.torch.init) under torchrun, each rank in its
host's namespace, through the switch: its checkpoint equals the single-process reference fed the
same batches, schedule and optimizer, bit for bit; the node is created from the script's describe
run. Also mindp.torch.init's one-line errors."""
import json
import os
import pathlib
import runpy
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from host_agent import optim  # noqa: E402
from mindp import progress, targets  # noqa: E402
from mindp.harness import testbed  # noqa: E402
from mindp.topology import star  # noqa: E402
from mindp.torch import scriptref  # noqa: E402
from tests.target_params import TARGET_PARAMS  # noqa: E402
from tests.host_agent.harness import AgentFabric, NodeProcess, job_bed, node_args  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
N, STEPS = 2, 4
PREFIX = "hex-"
TINY_GPT = {"d": 16, "layers": 1, "heads": 2, "ctx": 8}
#: Each example with the arguments that keep it small here.
EXAMPLES = {"train_cnn": [], "train_gpt": ["--gpt", json.dumps(TINY_GPT)]}


@pytest.fixture(scope="module")
def bed():
    yield from job_bed(PREFIX, N)


def describe(script: str, argv: list[str], spec: pathlib.Path) -> None:
    """The script's describe run (make run's, tested there), in this process: torch and its dynamo
    are imported here already, where a process of its own spends ~5 s of CPU importing them."""
    with pytest.MonkeyPatch.context() as m:
        for k, v in {"MINDP_DESCRIBE": str(spec), "RANK": "0", "WORLD_SIZE": str(N)}.items():
            m.setenv(k, v)
        m.setattr(sys, "argv", [script, *argv])
        with pytest.raises(SystemExit) as done:
            runpy.run_path(script, run_name="__main__")
    assert done.value.code == 0 and (spec / "optimizer.json").exists()


@pytest.mark.parametrize("target", TARGET_PARAMS)
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example_under_torchrun_matches_its_reference(bed, tmp_path, target, name):
    b, topo = bed
    topo.dump(tmp_path / "topo.json")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    script = str(REPO / "examples" / f"{name}.py")
    describe(script, ["--steps", str(STEPS), *EXAMPLES[name]], tmp_path / "spec")
    args = node_args(tmp_path / "topo.json", tmp_path / "state", tmp_path / "spec" / "init.npz", STEPS,
                     tmp_path / "final.npz", tmp_path / "stats.json",
                     extra=["--optimizer-spec", str(tmp_path / "spec" / "optimizer.json")])
    run_env = {**env, "MINDP_TOPOLOGY": str(tmp_path / "topo.json"), "MINDP_JOB": "1",
               "MINDP_STATE": str(tmp_path / "state")}
    with AgentFabric(target, bed, tmp_path):
        node = NodeProcess(b.hosts["opt1"], args, tmp_path / "node.log").start()
        try:
            proc = progress.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
                                   "--nproc-per-node", str(N), "--log-dir", str(tmp_path / "torchrun"),
                                   "--rdzv-backend", "c10d",
                                   "--rdzv-endpoint", f"127.0.0.1:{targets.free_port()}",
                                   "-m", "mindp.torch.launch", "--netns-prefix", testbed.tagged(PREFIX), "--script", script,
                                   "--steps", str(STEPS), *EXAMPLES[name], "--out", str(tmp_path / "ckpt.pt")],
                                  capture_output=True, text=True, env=run_env)
            assert proc.returncode == 0, proc.stderr[-3000:]
            assert node.finish() == 0
        finally:
            node.stop()
    ref = scriptref.script_reference(script, N, ["--steps", str(STEPS), *EXAMPLES[name]])
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["step"] == STEPS - 1
    for name, want in ref.master.items():
        assert np.array_equal(ckpt["model"][name].numpy().view(np.uint32), want.view(np.uint32)), name
    losses = [line for line in proc.stdout.splitlines() if '"loss"' in line]
    assert len(losses) == STEPS


def run_init(tmp_path, env: dict) -> str:
    """mindp.torch.init in a fresh process with `env`; its stderr (it must exit 1 with one line)."""
    code = ("import torch, mindp.torch\n"
            "m = torch.nn.Linear(3, 2)\n"
            "mindp.torch.init(m, torch.optim.AdamW(m.parameters()))\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MINDP_", "RANK", "WORLD_SIZE"))}
    proc = progress.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={**base, "PYTHONPATH": str(REPO), **env})
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def init_error(monkeypatch, env: dict) -> str:
    """mindp.torch.init in this process with `env`: the SystemExit it must end with, one line."""
    import mindp.torch

    for k in list(os.environ):
        if k.startswith(("MINDP_", "RANK", "WORLD_SIZE")):
            monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    m = torch.nn.Linear(3, 2)
    with pytest.raises(SystemExit) as exc:
        mindp.torch.init(m, torch.optim.AdamW(m.parameters()))
    msg = str(exc.value.code)
    assert msg.startswith("mindp.torch.init: ") and "\n" not in msg
    return msg


def test_init_outside_torchrun_exits_1_with_one_line(tmp_path):
    assert "start the script with torchrun" in run_init(tmp_path, {})


def test_init_errors_are_one_line(tmp_path, monkeypatch):
    """Each missing piece, in this process (a fresh one per case imported torch ten times)."""
    topo = star([2], slots=8)
    topo.dump(tmp_path / "topo.json")
    ranks = {"RANK": "0", "WORLD_SIZE": "2"}
    err = lambda env: init_error(monkeypatch, env)  # noqa: E731
    assert "start the script with torchrun" in err({})
    assert "no topology: set MINDP_TOPOLOGY" in err(ranks)
    assert "cannot read topology" in err({**ranks, "MINDP_TOPOLOGY": str(tmp_path / "none.json")})
    t = {**ranks, "MINDP_TOPOLOGY": str(tmp_path / "topo.json")}
    assert "no job: set MINDP_JOB" in err(t)
    assert "job 7 is not in" in err({**t, "MINDP_JOB": "7"})
    assert "torchrun started 3 ranks, job 1 has 2" in err({**t, "MINDP_JOB": "1", "WORLD_SIZE": "3"})
    j = {**t, "MINDP_JOB": "1"}
    assert "holds no optimizer state" in err({**j, "MINDP_STATE": str(tmp_path / "none")})
    assert "no interface holds" in err(j)
    assert "interface nosuch0" in err({**j, "MINDP_IFACE": "nosuch0"})
    # a state of another model: the layouts differ
    from host_agent import state
    other = {"weight": np.zeros((4, 3), np.float32)}
    state.create(tmp_path / "st", optim.layout_of(other), state.init_pieces(optim.layout_of(other), other),
                 optim.OptimizerConfig())
    assert "layouts differ" in err({**j, "MINDP_STATE": str(tmp_path / "st")})
    # a state of this model made with another lr: it keeps its optimizer, which the script must ask for
    from mindp.torch import parallel
    mine = parallel.layout_arrays(torch.nn.Linear(3, 2))
    state.create(tmp_path / "st2", optim.layout_of(mine), state.init_pieces(optim.layout_of(mine), mine),
                 optim.OptimizerConfig(lr=0.01))
    assert "keeps the optimizer it was created with, and this script's differs: lr 0.01 -> 0.001: " \
        in err({**j, "MINDP_STATE": str(tmp_path / "st2")})
    # a second init in one process (a GAN's two models): two agents would send as one worker
    from mindp.torch import script
    script._current[:] = [object()]
    try:
        assert "init was already called in this process: a job trains one model with one optimizer" in err(j)
    finally:
        script._current.clear()


def test_clip_grad_norm_is_refused_in_one_line():
    from mindp.torch.script import CLIP_REFUSED, Optimizer

    opt = Optimizer.__new__(Optimizer)
    with pytest.raises(SystemExit, match="clip_grad_norm_ is not supported"):
        opt.clip_grad_norm_(1.0)
    assert "\n" not in CLIP_REFUSED


RESUMING_SCRIPT = '''
import os, sys, torch, mindp.torch
sys.path.insert(0, sys.argv[3])
from train_cnn import batch, build_model, loss_fn, optimizer
torch.set_num_threads(1)
model = build_model()
opt, sched = optimizer(model, 6, 3e-3)
opt = mindp.torch.init(model, opt, sched)
while opt.step_number < int(sys.argv[1]):  # the job's step: a resumed node's, not 0
    x, y = batch(int(os.environ["RANK"]), opt.step_number)
    opt.zero_grad()
    loss_fn(model, x, y).backward()
    opt.step()
    sched.step()
if os.environ["RANK"] == "0":
    opt.save(sys.argv[2])
'''


def test_checkpoint_restored_into_a_fresh_node_resumes_bit_exactly(bed, tmp_path):
    """3 steps, save; the checkpoint restored into a new state directory, a new node on it and the
    ranks (which take its weights and step) train steps 3..5: the train_cnn reference of 6 steps."""
    b, topo = bed
    topo.dump(tmp_path / "topo.json")
    script = tmp_path / "resuming.py"
    script.write_text(RESUMING_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MINDP_TOPOLOGY": str(tmp_path / "topo.json"),
           "MINDP_JOB": "1"}
    progress.run([sys.executable, str(script), "3", "-", str(REPO / "examples")], check=True,
                   env={**env, "MINDP_DESCRIBE": str(tmp_path / "spec"), "RANK": "0", "WORLD_SIZE": str(N)})
    with AgentFabric("embedded", bed, tmp_path):
        for phase, (state, steps) in enumerate([("state1", 3), ("state2", 6)]):
            if phase:
                progress.run([sys.executable, "-m", "mindp.torch.checkpoint", str(tmp_path / "ckpt1.pt"),
                                str(tmp_path / state)], check=True, env=env)
            args = node_args(tmp_path / "topo.json", tmp_path / state, tmp_path / "spec" / "init.npz", steps,
                             tmp_path / f"final{phase}.npz", tmp_path / f"stats{phase}.json",
                             extra=["--optimizer-spec", str(tmp_path / "spec" / "optimizer.json")])
            node = NodeProcess(b.hosts["opt1"], args, tmp_path / f"node{phase}.log").start()
            try:
                proc = progress.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
                                       "--nproc-per-node", str(N), "--log-dir", str(tmp_path / "torchrun"),
                                       "--rdzv-backend", "c10d",
                                       "--rdzv-endpoint", f"127.0.0.1:{targets.free_port()}",
                                       "-m", "mindp.torch.launch", "--netns-prefix", testbed.tagged(PREFIX), "--script", str(script),
                                       str(steps), str(tmp_path / f"ckpt{phase + 1}.pt"), str(REPO / "examples")],
                                      capture_output=True, text=True,
                                      env={**env, "MINDP_STATE": str(tmp_path / state)})
                assert proc.returncode == 0, proc.stderr[-3000:]
                assert node.finish() == 0
            finally:
                node.stop()
    ref = scriptref.script_reference(REPO / "examples" / "train_cnn.py", N, ["--steps", "6"])
    ckpt = torch.load(tmp_path / "ckpt2.pt", weights_only=True)
    assert ckpt["step"] == 5 and torch.load(tmp_path / "ckpt1.pt", weights_only=True)["step"] == 2
    for name, want in ref.master.items():
        assert np.array_equal(ckpt["model"][name].numpy().view(np.uint32), want.view(np.uint32)), name
