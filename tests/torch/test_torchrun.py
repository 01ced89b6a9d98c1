"""Workers launched by torchrun (c10d rendezvous over TCP): the rank becomes the worker id, each
rank runs in its host's namespace, trains a torch model through the embedded switch and ends
bit-identical to the single-process torch reference."""
import json
import subprocess
import sys

import numpy as np
import pytest

from mindp import INSTALL_TORCH

pytest.importorskip("torch", reason=f"torch is not installed: {INSTALL_TORCH}")

from host_agent.optim import OptimizerConfig  # noqa: E402
from mindp import progress, targets, workload  # noqa: E402
from tests.host_agent.harness import STALL, AgentFabric, NodeProcess, check_against, job_bed, run_files  # noqa: E402

pytestmark = pytest.mark.net
N = 2
STEPS = 3
PREFIX = "htr-"


@pytest.fixture(scope="module")
def bed():
    yield from job_bed(PREFIX, N)


def train_with_torchrun(bed, tmp_path, agents: list[tuple[list[str], str]]) -> str:
    """Start the node, then each torchrun agent (its arguments before `-m`, its workers' --out
    pattern); check every worker's w<rank>.npz against the reference bits; the agents' stdout."""
    b, topo = bed
    cfg = workload.WorkloadConfig(n_workers=N, seed=3, batch=8, model="gpt",
                                  model_args=dict(d=16, layers=1, heads=2, ctx=8))
    init = workload.init_params(cfg)
    ref = workload.reference_train(cfg, init, STEPS, OptimizerConfig())
    cfg.dump(tmp_path / "workload.json")
    args = run_files(tmp_path, topo, init, STEPS)
    worker_args = ["-m", "mindp.torch.launch", "--netns-prefix", b.prefix, "--topology", str(tmp_path / "topo.json"),
                   "--job", "1", "--workload", str(tmp_path / "workload.json"), "--init", str(tmp_path / "init.npz"),
                   "--steps", str(STEPS)]
    with AgentFabric("embedded", bed, tmp_path):
        node = NodeProcess(b.hosts["opt1"], args, tmp_path / "node.log").start()
        procs = []
        try:
            for agent, out in agents:
                procs.append(subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *agent,
                                               "--log-dir", str(tmp_path / "torchrun"), *worker_args,
                                               "--out", str(tmp_path / out)],
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            everyone = progress.activity(*(p.pid for p in procs))  # a rank waits on the others
            outs = [progress.communicate(p, stall=STALL, progress=everyone) for p in procs]
            for p, (_, err) in zip(procs, outs):
                assert p.returncode == 0, err[-2000:]
            assert node.finish() == 0
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            node.stop()

    class Done:
        results = {}

    for w in range(N):
        (path,) = tmp_path.glob(f"*w{w}.npz")
        with np.load(path) as z:
            Done.results[w] = {k: z[k] for k in z.files}
    check_against(ref, Done, tmp_path)
    return "".join(out for out, _ in outs)


def test_torchrun_workers_train_gpt_to_reference_bits(bed, tmp_path):
    out = train_with_torchrun(bed, tmp_path, [([
        "--nnodes", "1", "--nproc-per-node", str(N), "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{targets.free_port()}"], "w{rank}.npz")])
    assert '"ev": "done"' in out and '"worker": 1' in out


def test_torchrun_on_two_nodes_gives_rank_by_node_rank(bed, tmp_path):
    """docs/RUN.md's multi-host command line: one torchrun per machine, static rendezvous, so node
    rank r runs worker r whichever machine comes first (node 1 starts first here)."""
    port = str(targets.free_port())
    agents = [(["--nnodes", str(N), "--node-rank", str(r), "--nproc-per-node", "1", "--rdzv-backend", "static",
                "--master-addr", "127.0.0.1", "--master-port", port], f"node{r}-w{{rank}}.npz")
              for r in reversed(range(N))]
    out = train_with_torchrun(bed, tmp_path, agents)
    assert sorted(p.name for p in tmp_path.glob("node*.npz")) == [f"node{r}-w{r}.npz" for r in range(N)]
    done = [json.loads(line) for line in out.splitlines() if '"ev": "done"' in line]
    assert sorted(d["worker"] for d in done) == list(range(N))


def test_launch_outside_torchrun_is_one_line():
    p = progress.run([sys.executable, "-m", "mindp.torch.launch", "--steps", "1"], capture_output=True, text=True,
                     env={"PATH": "/usr/bin:/bin"})
    assert p.returncode == 2 and p.stderr.strip() == (
        "mindp.torch.launch: RANK/WORLD_SIZE not set: start it with torchrun")
