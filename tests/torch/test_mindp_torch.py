"""mindp.torch: torch models trained by workers whose gradients are pushed from backward hooks,
through the real switch (embedded always, BMv2 where installed) to the optimizer node, end
bit-identical to the single-process torch reference (same seed, batches, fp16 rounding, exact
sums, the node's optimizer), also with packet loss and with dynamic loss scaling."""
import json
import subprocess
import sys
import time

import numpy as np
import pytest

from mindp import INSTALL_TORCH

torch = pytest.importorskip("torch", reason=f"torch is not installed: {INSTALL_TORCH}")

from host_agent.optim import OptimizerConfig  # noqa: E402
from mindp import progress, workload  # noqa: E402
from mindp.lossscale import LossScaler  # noqa: E402
from mindp.torch import DataParallel, layout_of, models, tasks  # noqa: E402
from tests.target_params import TARGET_PARAMS  # noqa: E402
from tests.host_agent.harness import STALL, AgentFabric, NodeProcess, check_against, job_bed, run_files  # noqa: E402

pytestmark = pytest.mark.net
N = 2
STEPS = 3
TINY_GPT = dict(d=16, layers=1, heads=2, ctx=8)


@pytest.fixture(scope="module")
def bed():
    yield from job_bed("hto-", N)


def start_worker(bed, topo, tmp_path, w: int, steps: int, drop: float):
    """One worker process (the make-run worker: mindp.torch.DataParallel for torch models) in its
    host's namespace."""
    nh = bed.hosts[topo.jobs[0].workers[w]]
    faults = ["--drop-send", str(drop), "--drop-recv", str(drop), "--fault-seed", str(200 + w)] if drop else []
    log = open(tmp_path / f"w{w}.log", "w")
    return nh.popen(sys.executable, "-m", "mininet_topos.trainer", "--topology", str(tmp_path / "topo.json"),
                    "--job", "1", "--worker", str(w), "--workload", str(tmp_path / "workload.json"),
                    "--init", str(tmp_path / "init.npz"), "--steps", str(steps), "--out", str(tmp_path / f"w{w}.npz"),
                    "--rto-min", "0.01", "--rto-max", "0.5", "--deadline", str(STALL), *faults,
                    stdout=log, stderr=subprocess.STDOUT)


@pytest.mark.parametrize("target", TARGET_PARAMS)
@pytest.mark.parametrize("model,args,extra", [
    ("cnn", {}, {}),
    ("cnn", {}, dict(loss_scale=2.0**12, scale_growth_interval=2)),
    ("gpt", TINY_GPT, {}),
    ("gpt", TINY_GPT, dict(drop=0.03)),
], ids=["cnn", "cnn-loss-scaling", "gpt", "gpt-loss-3pct"])
def test_torch_models_through_the_switch_are_bit_identical(bed, tmp_path, target, model, args, extra):
    b, topo = bed
    extra = dict(extra)
    drop = extra.pop("drop", 0.0)
    cfg = workload.WorkloadConfig(n_workers=N, seed=5, batch=8, model=model, model_args=args, **extra)
    init = workload.init_params(cfg)
    assert list(init) == [n for n, _ in reversed(list(tasks.model(cfg).named_parameters()))]
    ref = workload.reference_train(cfg, init, STEPS, OptimizerConfig())
    cfg.dump(tmp_path / "workload.json")
    node_args = run_files(tmp_path, topo, init, STEPS)
    with AgentFabric(target, bed, tmp_path, ["--drop-prob", str(drop), "--seed", "4"] if drop else ()):
        node = NodeProcess(b.hosts["opt1"], node_args, tmp_path / "node.log").start()
        try:
            procs = [start_worker(b, topo, tmp_path, w, STEPS, drop) for w in range(N)]
            for w, p in enumerate(procs):
                code = progress.wait_process(p, stall=STALL, progress=progress.file_sizes(tmp_path / f"w{w}.log"))
                assert code == 0, (tmp_path / f"w{w}.log").read_text()[-2000:]
            assert node.finish() == 0
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            node.stop()

    class Done:
        results = {}

    for w in range(N):
        with np.load(tmp_path / f"w{w}.npz") as z:
            Done.results[w] = {k: z[k] for k in z.files}
    check_against(ref, Done, tmp_path)
    first = workload.model_eval(cfg)({n: a.astype(np.float16) for n, a in init.items()})[0]
    assert workload.model_eval(cfg)(ref.params)[0] < first  # it trained
    if drop:
        done = [json.loads(line) for w in range(N) for line in (tmp_path / f"w{w}.log").read_text().splitlines()
                if line.startswith('{"ev": "done"')]
        assert sum(d["stats"].get("retransmitted", 0) for d in done) > 0


BURN = 0.001  # CPU seconds the recorder's put spends


def test_hooks_push_gradients_during_backward_in_backward_order():
    cfg = workload.WorkloadConfig(n_workers=1, seed=1, batch=4, model="gpt", model_args=TINY_GPT)
    net = tasks.model(cfg)
    lay = layout_of(net)

    class Recorder:  # the agent's seam: records when each gradient is put, relative to backward
        layout = lay
        nonfinite_chunks: list = []

        def start_step(self):
            rec = self

            class H:
                put_names: set = set()

                def put(self, name, g, scale=1.0):
                    rec.order.append((name, torch._C._current_graph_task_id() != -1))
                    self.put_names.add(name)
                    t = time.thread_time()
                    while time.thread_time() - t < BURN:  # a put's own CPU, which hooks_cpu counts
                        pass

                def holds(self, name, g, scale=1.0):
                    return True

                def wait(self):
                    return {s.name: np.zeros(s.shape, np.float16) for s in lay.specs}
            return H()

    rec = Recorder()
    rec.order = []
    dp = DataParallel(net, rec)
    x, y = tasks.batch(cfg, 0, 0)
    loss = models.loss_of("gpt", net, x, y)
    params = dp.step(loss)
    names = [n for n, _ in rec.order]
    assert sorted(names) == sorted(s.name for s in lay.specs) and len(names) == len(set(names))
    assert all(inside for _, inside in rec.order)  # every gradient was put while backward still ran
    # Backward order is chunk order within each block: the head (last registered) comes first.
    assert names[0] == "head.weight" and names[-1] in ("tok.weight", "pos.weight")
    assert all(float(p.detach().abs().max()) == 0 for p in net.parameters())  # parameters came back into the module
    assert set(params) == set(dict(net.named_parameters()))
    assert dp.backward_seconds > 0  # the step line's compute: forward and this
    assert dp.wait_seconds > 0  # the step line's wait: finish()'s wait for the parameters
    assert len(names) * BURN <= dp.hooks_cpu <= dp.backward_cpu  # the hooks' own CPU, within backward's
    dp.begin()
    assert dp.hooks_cpu == 0.0  # each step's own
    dp.close()


def test_loss_scaler_backs_off_and_grows_like_grad_scaler():
    s = LossScaler(8.0, growth_interval=3)
    ref = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=3)
    for found in [False, False, True, False, False, False, True, False, False, False, False]:
        s.update(found)
        ref._scale = ref._scale if ref._scale is not None else torch.full((), 8.0)
        ref._growth_tracker = ref._growth_tracker if ref._growth_tracker is not None else torch.zeros((), dtype=torch.int32)
        torch._amp_update_scale_(ref._scale, ref._growth_tracker, torch.full((), float(found)), 2.0, 0.5, 3)
        assert s.scale == float(ref._scale) and s.growth_tracker == int(ref._growth_tracker)
    with pytest.raises(ValueError):
        LossScaler(0.0)
