"""Workers launched by torchrun (c10d rendezvous over TCP): the rank becomes the worker id, each
rank runs in its host's namespace, trains a torch model through the embedded switch and ends
bit-identical to the single-process torch reference."""
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")

from host_agent.optim import OptimizerConfig  # noqa: E402
from mindp import targets, workload  # noqa: E402
from tests.host_agent.harness import Fabric, NodeProcess, check_against, job_bed, run_files  # noqa: E402

pytestmark = pytest.mark.net
N = 2
STEPS = 3
PREFIX = "htr-"


@pytest.fixture(scope="module")
def bed():
    yield from job_bed(PREFIX, N)


def test_torchrun_workers_train_gpt_to_reference_bits(bed, tmp_path):
    b, topo = bed
    cfg = workload.WorkloadConfig(n_workers=N, seed=3, batch=8, model="gpt",
                                  model_args=dict(d=16, layers=1, heads=2, ctx=8))
    init = workload.init_params(cfg)
    ref = workload.reference_train(cfg, init, STEPS, OptimizerConfig())
    cfg.dump(tmp_path / "workload.json")
    args = run_files(tmp_path, topo, init, STEPS)
    with Fabric("embedded", bed, tmp_path):
        node = NodeProcess(b.hosts["opt1"], args, tmp_path / "node.log").start()
        try:
            run = subprocess.run(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(N),
                 "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{targets.free_port()}",
                 "-m", "mindp.torch.launch", "--netns-prefix", PREFIX,
                 "--topology", str(tmp_path / "topo.json"), "--job", "1", "--workload", str(tmp_path / "workload.json"),
                 "--init", str(tmp_path / "init.npz"), "--steps", str(STEPS), "--out", str(tmp_path / "w{rank}.npz")],
                capture_output=True, text=True, timeout=240)
            assert run.returncode == 0, run.stderr[-2000:]
            assert node.wait(60) == 0
        finally:
            node.stop()

    class Done:
        results = {}

    for w in range(N):
        with np.load(tmp_path / f"w{w}.npz") as z:
            Done.results[w] = {k: z[k] for k in z.files}
    check_against(ref, Done, tmp_path)
    assert '"ev": "done"' in run.stdout and '"worker": 1' in run.stdout


def test_launch_outside_torchrun_is_one_line():
    p = subprocess.run([sys.executable, "-m", "mindp.torch.launch", "--steps", "1"], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin"}, timeout=60)
    assert p.returncode == 2 and p.stderr.strip() == (
        "mindp.torch.launch: RANK/WORLD_SIZE not set: start it with torchrun")
