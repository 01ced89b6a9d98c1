"""LR schedules: the node's replay against torch.optim.lr_scheduler (each schedule, bit for bit),
the node applying them (also across a restart) against the reference fed torch's lrs."""
import math
import random
import warnings

import pytest

from host_agent import lr, node_core, optim, reference, state
from host_agent.optim import ConfigError, OptimizerConfig, ParamGroup, Schedule

from .helpers import BUDGET, initial_fp16, same_bits, small_model
from .node_steps import JOB, N, S, assemble, run_step

torch = pytest.importorskip("torch")
L = torch.optim.lr_scheduler


def torch_scheduler(opt, s: Schedule):
    """The torch.optim.lr_scheduler composition a Schedule stands for (host_agent/lr.py's table)."""
    if s.kind == "constant":
        return None
    tmax = s.total - s.warmup
    decay = {"step": lambda: L.StepLR(opt, s.step_size, s.gamma),
             "multistep": lambda: L.MultiStepLR(opt, list(s.milestones), s.gamma),
             "exponential": lambda: L.ExponentialLR(opt, s.gamma),
             "cosine": lambda: L.CosineAnnealingLR(opt, tmax, s.eta_min),
             "restarts": lambda: L.CosineAnnealingWarmRestarts(opt, s.t_0, s.t_mult, s.eta_min),
             "linear": lambda: L.LinearLR(opt, 1.0, s.end_factor, tmax)}[s.kind]()
    if not s.warmup:
        return decay
    return L.SequentialLR(opt, [L.LinearLR(opt, s.warmup_start, 1.0, s.warmup), decay], [s.warmup])


def torch_lrs(base: float, s: Schedule, n: int) -> list[float]:
    """The lr of steps 0..n-1 of a torch loop: optimizer.step() at that lr, then scheduler.step()."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base)
    sched = torch_scheduler(opt, s)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scheduler.step() before any optimizer.step()
        for _ in range(n):
            out.append(opt.param_groups[0]["lr"])
            if sched:
                sched.step()
    return out


SCHEDULES = {
    "constant": [Schedule()],
    "step": [Schedule("step", step_size=ss, gamma=g, warmup=w, warmup_start=0.25)
             for ss, g in ((3, 0.5), (7, 0.1)) for w in (0, 1, 5)],
    "cosine": [Schedule("cosine", total=t, warmup=w, warmup_start=ws, eta_min=em)
               for t in (10, 37, 100) for w in (0, 1, 5) for ws in (0.1, 0.01) for em in (0.0, 1e-5)],
    "linear": [Schedule("linear", total=t, warmup=w, warmup_start=ws, end_factor=ef)
               for t in (10, 37, 100) for w in (0, 1, 5) for ws in (0.1, 0.333) for ef in (0.0, 0.1)],
    # a milestone twice decays by gamma ** 2; milestone 0 already at construction
    "multistep": [Schedule("multistep", milestones=m, gamma=g, warmup=w) for m in ((3, 7, 20), (5, 5, 9), (0, 4), ())
                  for g in (0.1, 0.37) for w in (0, 1, 4)],
    "exponential": [Schedule("exponential", gamma=g, warmup=w, warmup_start=0.01) for g in (0.9, 0.99, 0.123, 1.0)
                    for w in (0, 1, 6)],
    "restarts": [Schedule("restarts", t_0=t0, t_mult=tm, eta_min=em, warmup=w) for t0 in (1, 3, 10) for tm in (1, 2, 3)
                 for em in (0.0, 1e-5) for w in (0, 2)],
}


@pytest.mark.parametrize("kind", list(SCHEDULES))
def test_schedule_replays_torch_bit_for_bit(kind):
    """Every step's float64 lr equals torch's, past the end of the schedule too (cosine rises again)."""
    for base in (1e-3, 3e-4, 0.0123):
        for s in SCHEDULES[kind]:
            n = 3 * max(s.total, 10)
            rates = lr.Rates(base, s)
            assert [rates.at(i) for i in range(n)] == torch_lrs(base, s, n), (base, s)


def test_closed_form_would_differ():
    """Why the replay: torch's recursive cosine is not its closed form in float64."""
    s = Schedule("cosine", total=100, warmup=5)
    got = torch_lrs(1e-3, s, 100)
    closed = [s.eta_min + (1e-3 - s.eta_min) * (1 + math.cos(math.pi * (e - 5) / 95)) / 2 for e in range(5, 100)]
    assert got[5:] != closed


def reference_with_torch_lrs(init, gf, steps, cfg):
    """reference.train with the lr of each step taken from torch's scheduler, not from host_agent.lr."""
    lrs = torch_lrs(cfg.lr, cfg.schedule, steps)
    with pytest.MonkeyPatch.context() as mp:  # the seam: the reference's lr of each step
        mp.setattr(lr.Rates, "at", lambda self, step: lrs[step])
        return reference.train(init, gf, N, steps, cfg)


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_node_applies_the_schedule_across_a_restart(tmp_path, kind):
    """6 steps of warmup + cosine, the node reopened from its state after step 2: the parameters
    equal the reference's that took each step's lr from torch's SequentialLR."""
    init = small_model()
    lay = optim.layout_of(init)
    cfg = OptimizerConfig(kind=kind, lr=1e-2, schedule=Schedule("cosine", total=6, warmup=2, warmup_start=0.25))
    gf = reference.synthetic_grads(9)
    state.create(tmp_path, lay, state.init_pieces(lay, init), cfg, page_chunks=32)
    params = initial_fp16(init)
    rng = random.Random(0)
    for step in range(6):
        if step in (0, 3):
            core = node_core.NodeCore(state.Store(tmp_path, BUDGET), JOB, N, S)
        params = assemble(lay, run_step(core, lay, gf, step, params, rng), params)
        if step == 2:
            core.store.close()
    ref = reference_with_torch_lrs(init, gf, 6, cfg)
    assert same_bits(params, ref.params)
    assert not same_bits(params, reference.train(init, gf, N, 6, OptimizerConfig(kind=kind, lr=1e-2)).params)


def test_schedule_round_trips_through_the_state(tmp_path):
    cfg = OptimizerConfig(schedule=Schedule("step", step_size=4, gamma=0.5))
    lay = optim.layout_of(small_model())
    state.create(tmp_path, lay, state.init_pieces(lay, small_model()), cfg, page_chunks=32)
    store = state.Store(tmp_path, BUDGET)
    assert store.cfg == cfg and store.cfg.schedule.step_size == 4
    store.close()


@pytest.mark.parametrize("bad, message", [
    (dict(kind="poly"), "unknown lr schedule 'poly'"),
    (dict(kind="cosine", total=5, warmup=5), "need 0 <= warmup < total"),
    (dict(kind="cosine", total=5, warmup=1, warmup_start=0.0), "warmup_start must be in (0, 1]"),
    (dict(kind="linear", total=5, end_factor=2.0), "end_factor must be in [0, 1]"),
    (dict(kind="step", step_size=0), "step_size >= 1"),
    (dict(kind="step", gamma=float("nan")), "gamma must be a finite number"),
    (dict(kind="cosine", total="10"), "total must be an integer"),
    (dict(kind="cosine", total=10, bogus=1), "malformed lr schedule"),
    (dict(kind="multistep", milestones=[3, -1]), "milestones must be a list of steps (integers >= 0)"),
    (dict(kind="multistep", milestones=[2.5]), "milestones must be a list of steps (integers >= 0)"),
    (dict(kind="multistep", milestones=5), "milestones must be a list of steps"),
    (dict(kind="exponential", gamma=1.5), "exponential schedule: need gamma in (0, 1]"),
    (dict(kind="step", warmup=-1), "warmup must be >= 0 steps"),
    (dict(kind="restarts", t_0=0), "restarts schedule: need t_0 >= 1 and t_mult >= 1"),
    (dict(kind="restarts", t_mult=1.5), "t_mult must be an integer"),
    (dict(warmup=3), "warmup must be >= 0 steps before a decaying schedule, got 3 (constant)"),
    (dict(kind="multistep", warmup=2, warmup_start=1.5), "warmup_start must be in (0, 1]"),
])
def test_bad_schedule_is_one_line(bad, message):
    with pytest.raises(ConfigError) as exc:
        OptimizerConfig.from_dict({"schedule": bad})
    assert message in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("kind,groups", [("adamw", ()), ("sgd", ()),
                                          ("adamw", (ParamGroup(("w",), 1e-2, 0.01), ParamGroup(("b",), 3e-2, 0.1)))])
def test_a_script_schedule_applies_each_step_at_the_lr_the_workers_told(tmp_path, kind, groups):
    """The "script" schedule (a script that sets its lr itself): a step's sums wait until a worker
    told its lrs, a parameter group each (counted, not answered: the workers' retransmissions bring
    them again); then the step applies them, bit for bit as the reference given the same lrs; a
    worker telling other lrs for the step is counted and changes nothing, as are lrs that are not
    positive or not one a group. Groups are told apart even where they start at one lr and decay
    (w beside the first group's embed): the script may scale each later (layer-wise)."""
    init = small_model()
    lay = optim.layout_of(init)
    cfg = OptimizerConfig(kind=kind, lr=1e-2, schedule=Schedule("script"), groups=groups)
    gf = reference.synthetic_grads(5)
    state.create(tmp_path, lay, state.init_pieces(lay, init), cfg, page_chunks=32)
    core = node_core.NodeCore(state.Store(tmp_path, BUDGET), JOB, N, S)
    scales = (1.0, 0.25, 2.0)[: 1 + len(groups)]
    told = {s: tuple(r * f for f in scales) for s, r in {0: 0.003, 1: 0.0071, 2: 0.00123, 3: 0.0005}.items()}
    params, rng = initial_fp16(init), random.Random(0)
    assert run_step(core, lay, gf, 0, params, rng) == {}  # no lr yet: nothing applied, nothing answered
    assert core.stats["sums_before_lr"] > 0 and core.store.committed == -1
    for step, rates in told.items():
        core.learn_lr(step, rates)
        core.learn_lr(step, tuple(r * 2 for r in rates))  # another worker's, later: the first told stands
        params = assemble(lay, run_step(core, lay, gf, step, params, rng), params)
    assert core.stats["lr_disagreements"] == len(told)
    core.learn_lr(9, (float("nan"),) * len(scales))
    core.learn_lr(9, (0.001,) * (len(scales) + 1))
    assert core.stats["lr_rejected"] == 2
    assert same_bits(params, reference.train(init, gf, N, 4, cfg, told_lrs=told).params)
    one = {s: (r[0],) * len(scales) for s, r in told.items()}  # every group at the first's lr
    assert same_bits(params, reference.train(init, gf, N, 4, cfg, told_lrs=one).params) == (not groups)
    assert not same_bits(params, reference.train(init, gf, N, 4, cfg, told_lrs={s: (1e-2,) * len(scales)
                                                                                  for s in told}).params)
