"""make run's reference of a torch model computes a step's workers in threads (each its own
module): the same bits as one thread, loss scaling included."""
import numpy as np
import pytest

pytest.importorskip("torch")

from host_agent import optim  # noqa: E402
from mindp import workload  # noqa: E402


@pytest.mark.parametrize("scale", [0.0, 1024.0])
def test_threaded_reference_of_a_gpt_equals_one_thread(monkeypatch, scale):
    cfg = workload.WorkloadConfig(n_workers=3, model="gpt", model_args={"d": 64, "layers": 2}, loss_scale=scale)
    init = workload.init_params(cfg)
    assert sum(a.size for a in init.values()) >= workload.THREADED_REFERENCE
    opt = optim.OptimizerConfig(lr=0.003)
    threaded = workload.reference_train(cfg, init, 3, opt)
    monkeypatch.setattr(workload, "THREADED_REFERENCE", float("inf"))
    single = workload.reference_train(cfg, init, 3, opt)
    assert all(np.array_equal(threaded.master[n], single.master[n]) for n in single.master)
    assert threaded.nonfinite == single.nonfinite
