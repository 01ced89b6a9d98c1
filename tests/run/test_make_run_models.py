"""make run MODEL=cnn and MODEL=gpt end to end (issue 13.4): torch workers in Mininet hosts train
through the embedded switch and BMv2 (where installed), end bit-identical to the single-process
torch reference, and the summary names the model and its parameter count. Short runs: the gpt's
1.3M parameters are 41,550 frames per worker and step."""
from __future__ import annotations

import json

import pytest

from mindp import INSTALL_TORCH

pytest.importorskip("torch", reason=f"torch is not installed: {INSTALL_TORCH}")

from host_agent import optim  # noqa: E402
from mindp import targets, workload  # noqa: E402
from mininet_topos import metrics  # noqa: E402
from tests.run.makerun import MakeRun, assert_clean, needs_root  # noqa: E402

pytestmark = pytest.mark.net
SMALL_GPT = '{"d": 32, "layers": 1, "heads": 2}'
needs_bmv2 = pytest.mark.skipif(targets.find_bmv2() is None, reason="BMv2 simple_switch_grpc not installed")


def check(run: MakeRun, model: str, target: str, workers: int, steps: int, loss: float = 0.0) -> dict:
    s = run.summary()
    wl = workload.WorkloadConfig.load(run.run_dir / "job1" / "workload.json")
    init = workload.init_params(wl)
    n = sum(a.size for a in init.values())
    assert (wl.model, wl.n_workers) == (model, workers)
    assert (s["model"], s["parameters"]) == (workload.describe(wl, init), n)
    assert s["model"].startswith(f"{model} (") and s["model"] in run.out  # the printed table too
    assert (s["target"], s["workers"], s["steps"], s["loss_rate"]) == (target, workers, steps, loss)
    assert s["max_abs_param_diff_vs_reference"] == 0.0
    (j,) = s["per_job"]
    assert j["final_loss"] < 0.8 * j["initial_loss"]
    assert j["final_loss"] == j["reference_final_loss"]
    assert j["switch_counters"]["completions"] == steps * optim.layout_of(init).n_chunks
    config = json.loads((run.run_dir / "config.json").read_text())
    assert config["model"] == model
    assert "bit-exact with the reference trainer" in run.out and "metrics.csv" in run.out  # the summary names it
    batch = [r.batch_loss for r in metrics.read_csv(run.run_dir / "metrics.csv")]  # each step's, as torch's loss
    assert len(batch) == steps and all(x > 0 for x in batch) and batch[-1] < batch[0]
    assert_clean(run)
    return s


@needs_root
def test_cnn_on_the_embedded_switch_with_loss_is_bit_exact(tmp_path):
    run = MakeRun(tmp_path, "--target", "embedded", "--model", "cnn", "--workers", "2", "--steps", "12",
              "--loss", "0.02", "--p4", "committed")
    assert run.run() == 0, run.err
    s = check(run, "cnn", "embedded", 2, 12, loss=0.02)
    assert s["parameters"] == 3818 and s["retransmissions"] > 0


@needs_root
def test_gpt_on_the_embedded_switch_is_bit_exact(tmp_path):
    run = MakeRun(tmp_path, "--target", "embedded", "--model", "gpt", "--workers", "2", "--steps", "2",
              "--p4", "committed")
    assert run.run() == 0, run.err
    s = check(run, "gpt", "embedded", 2, 2)
    assert 1_000_000 <= s["parameters"] <= 5_000_000 and "M parameters)" in s["model"]
    lines = [json.loads(x) for x in (run.run_dir / "logs" / "worker-job1-1.log").read_text().splitlines()
             if x.startswith("{")]
    steps = [j for j in lines if j.get("ev") == "step" and j["step"] >= 0]
    assert len(steps) == 2 and all(j["compute"] > 0 and j["wait"] > 0 for j in steps)


@needs_root
@pytest.mark.bmv2
@needs_bmv2
@pytest.mark.parametrize("model, steps, size", [("cnn", 12, ()), ("gpt", 4, ("--gpt", SMALL_GPT, "--lr", "0.01"))])
def test_torch_models_on_bmv2_with_loss_are_bit_exact(tmp_path, model, steps, size):
    """The gpt in a smaller size (GPT=): BMv2 forwards the default's 166k frames a step in 20 s."""
    run = MakeRun(tmp_path, "--target", "bmv2", "--model", model, "--workers", "2", "--steps", str(steps),
              "--loss", "0.02", *size)
    assert run.run() == 0, run.err
    s = check(run, model, "bmv2", 2, steps, loss=0.02)
    if size:
        assert s["parameters"] < 100_000 and json.loads((run.run_dir / "config.json").read_text())["model_args"] \
            == json.loads(SMALL_GPT)
