"""mindp.torch: torch models trained by workers whose gradients are pushed from backward hooks,
through the real switch (embedded always, BMv2 where installed) to the optimizer node, end
bit-identical to the single-process torch reference (same seed, batches, fp16 rounding, exact
sums, the node's optimizer), also with packet loss and with dynamic loss scaling."""
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from host_agent import optim, rawsock  # noqa: E402
from host_agent.optim import OptimizerConfig  # noqa: E402
from host_agent.worker import RtoConfig, WorkerAgent, WorkerConfig  # noqa: E402
from mindp import workload  # noqa: E402
from mindp.lossscale import LossScaler  # noqa: E402
from mindp.torch import DataParallel, layout_of, models, tasks  # noqa: E402
from tests.conftest import TARGET_PARAMS  # noqa: E402
from tests.host_agent.harness import Fabric, NodeProcess, check_against, job_bed, run_files  # noqa: E402

pytestmark = pytest.mark.net
N = 2
STEPS = 3
TINY_GPT = dict(d=16, layers=1, heads=2, ctx=8)


@pytest.fixture(scope="module")
def bed():
    yield from job_bed("hto-", N)


def torch_worker(bed, topo, cfg: workload.WorkloadConfig, w: int, steps: int, out: dict, drop: float):
    """One worker: its own module, batches, DataParallel; returns through `out`."""
    try:
        net = tasks.model(cfg)
        init = workload.init_params(cfg)
        fp16 = {n: a.astype(np.float16) for n, a in init.items()}
        models.load_params(net, fp16)
        sock = bed.hosts[topo.jobs[0].workers[w]].socket()
        rawsock.prepare(sock)
        faults = rawsock.Faults(drop, drop, 200 + w, 0.0, 0.0) if drop else None
        agent = WorkerAgent(WorkerConfig.from_topology(topo, 1, w, rto=RtoConfig(initial=0.05, min=0.01, max=0.5,
                                                                                   deadline=30.0)),
                            layout_of(net), sock, faults, initial=fp16)
        scaler = LossScaler(cfg.loss_scale, growth_interval=cfg.scale_growth_interval) if cfg.loss_scale else None
        dp = DataParallel(net, agent, scaler)
        params = None
        for step in range(steps):
            x, y = tasks.batch(cfg, w, step)
            params = dp.step(models.loss_of(cfg.model, net, x, y))
        out[w] = dict(params=params, stats=agent.stats, scale=scaler.scale if scaler else None)
        sock.close()
    except BaseException as exc:
        out[w] = exc


@pytest.mark.parametrize("target", TARGET_PARAMS)
@pytest.mark.parametrize("model,args,extra", [
    ("cnn", {}, {}),
    ("cnn", {}, dict(loss_scale=2.0**12, scale_growth_interval=2)),
    ("gpt", TINY_GPT, {}),
    ("gpt", TINY_GPT, dict(drop=0.03)),
], ids=["cnn", "cnn-loss-scaling", "gpt", "gpt-loss-3pct"])
def test_torch_models_through_the_switch_are_bit_identical(bed, tmp_path, target, model, args, extra):
    b, topo = bed
    drop = extra.pop("drop", 0.0) if "drop" in extra else 0.0
    cfg = workload.WorkloadConfig(n_workers=N, seed=5, batch=8, model=model, model_args=args, **extra)
    init = workload.init_params(cfg)
    assert list(init) == [n for n, _ in reversed(list(tasks.model(cfg).named_parameters()))]
    opt = OptimizerConfig()
    ref = workload.reference_train(cfg, init, STEPS, opt)
    out: dict = {}
    with Fabric(target, bed, tmp_path, ["--drop-prob", str(drop), "--seed", "4"] if drop else ()):
        node = NodeProcess(b.hosts["opt1"], run_files(tmp_path, topo, init, STEPS), tmp_path / "node.log").start()
        try:
            threads = [threading.Thread(target=torch_worker, args=(b, topo, cfg, w, STEPS, out, drop), daemon=True)
                       for w in range(N)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(240)
            assert node.wait(60) == 0
        finally:
            node.stop()
    errors = [r for r in out.values() if isinstance(r, BaseException)]
    if errors:
        raise errors[0]

    class Done:
        results = {w: r["params"] for w, r in out.items()}

    check_against(ref, Done, tmp_path)
    first = workload.model_eval(cfg)({n: a.astype(np.float16) for n, a in init.items()})[0]
    assert workload.model_eval(cfg)(ref.params)[0] < first  # it trained
    if drop:
        assert sum(r["stats"]["retransmitted"] for r in out.values()) > 0
    if cfg.loss_scale:
        assert all(r["scale"] == cfg.loss_scale * 2 for r in out.values())  # grew once after 2 finite steps


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

                def put(self, name, g):
                    rec.order.append((name, torch._C._current_graph_task_id() != -1))
                    self.put_names.add(name)

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
