"""Checkpoints: the node's committed state -> a torch checkpoint -> a fresh node that resumes
bit-exactly; the checkpoint loads into a plain torch model; the torch spec translation."""
import random
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from host_agent import lr, node_core, optim, reference, state  # noqa: E402
from host_agent.optim import ConfigError, OptimizerConfig, ParamGroup, Schedule  # noqa: E402
from mindp.torch import checkpoint, layout_arrays, models, spec  # noqa: E402
from mindp.topology import JobSpec  # noqa: E402
from tests.host_agent.helpers import initial_fp16, same_bits, step_sums  # noqa: E402
from tests.host_agent.node_steps import JOB, N, S, assemble, run_step  # noqa: E402
from tests.host_agent.shard_steps import as_worker, feed  # noqa: E402

L = torch.optim.lr_scheduler


def train_core(state_dir, lay, gf, steps, params, create=None):
    if create is not None:
        state.create(state_dir, lay, state.init_pieces(lay, create[0]), create[1], page_chunks=32)
    core = node_core.NodeCore(state.Store(state_dir, 1 << 20), JOB, N, S)
    rng = random.Random(steps.start)
    for step in steps:
        params = assemble(lay, run_step(core, lay, gf, step, params, rng), params)
    core.store.close()
    return params


def flat_group(net) -> tuple:
    """A second parameter group: the 1-D parameters (biases) at weight decay 0 and twice the lr."""
    return (ParamGroup(tuple(n for n, p in net.named_parameters() if p.dim() < 2), 2e-2, 0.0),)


@pytest.mark.parametrize("kind, groups", [("adamw", False), ("sgd", False), ("adamw", True)])
def test_checkpoint_resumes_bit_exactly_in_a_fresh_node(tmp_path, kind, groups):
    net = models.build("cnn", {"channels": 4}, 0)
    init = layout_arrays(net)
    lay = optim.layout_of(init)
    cfg = OptimizerConfig(kind=kind, lr=1e-2, schedule=Schedule("cosine", total=6, warmup=2),
                          groups=flat_group(net) if groups else ())
    gf = reference.synthetic_grads(3)
    params = train_core(tmp_path / "a", lay, gf, range(3), initial_fp16(init), (init, cfg))
    ckpt = checkpoint.save(tmp_path / "a", tmp_path / "ckpt.pt", net)
    assert ckpt["step"] == 2 and ckpt["mindp"]["updates"] == 3
    assert checkpoint.restore(tmp_path / "ckpt.pt", tmp_path / "b") == 2
    resumed = train_core(tmp_path / "b", lay, gf, range(3, 6), params)
    uninterrupted = reference.train(init, gf, N, 6, cfg)
    assert same_bits(resumed, uninterrupted.params)
    final = checkpoint.save(tmp_path / "b", tmp_path / "final.pt", net)
    assert all(np.array_equal(final["model"][n].numpy(), uninterrupted.master[n]) for n in init)

    plain = models.build("cnn", {"channels": 4}, 1)  # torch alone: load_state_dict and run it
    loaded = torch.load(tmp_path / "final.pt", weights_only=True)
    plain.load_state_dict(loaded["model"])
    assert plain(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    opt = spec.torch_optimizer(cfg, list(plain.named_parameters()), 0)
    opt.load_state_dict(loaded["optimizer"])  # the matching torch optimizer takes its state
    key = "exp_avg" if kind == "adamw" else "momentum_buffer"
    assert all(torch.count_nonzero(opt.state[p][key]) for p in plain.parameters())
    if groups:  # a script's own two groups take it as well, tensor by tensor, each at its lr of the next step
        own = torch.optim.AdamW([{"params": [p for p in plain.parameters() if p.dim() >= 2]},
                                 {"params": [p for p in plain.parameters() if p.dim() < 2], "weight_decay": 0.0}])
        own.load_state_dict(loaded["optimizer"])
        assert [g["weight_decay"] for g in own.param_groups] == [cfg.weight_decay, 0.0]
        assert [g["lr"] for g in own.param_groups] == [lr.Rates(b, cfg.schedule).at(6) for b in (1e-2, 2e-2)]
        assert all(torch.equal(own.state[p][key], opt.state[p][key]) for p in plain.parameters())


def own_optimizer(net, kind: str) -> torch.optim.Optimizer:
    """A script's optimizer in no order the node keeps: the biases' group first, each group's
    parameters reversed, and a frozen parameter held among them."""
    weights = [p for p in net.parameters() if p.dim() >= 2][::-1]
    biases = [p for p in net.parameters() if p.dim() < 2][::-1]
    groups = [{"params": biases, "lr": 2e-2, "weight_decay": 0.0}, {"params": weights}]
    return torch.optim.AdamW(groups, lr=1e-2) if kind == "adamw" else \
        torch.optim.SGD(groups, lr=1e-2, momentum=0.9, weight_decay=1e-2)


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_checkpoint_optimizer_loads_into_the_scripts_own_optimizer(tmp_path, kind):
    """opt.save hands checkpoint.save the script's torch optimizer: 'optimizer' is that optimizer's
    state_dict (its groups, order and frozen parameters) with the node's state under each index, so
    load_state_dict puts every tensor on its own parameter; restore reads it back bit for bit, and
    a checkpoint of before 'state_index' (the node's grouping) still restores."""
    def build(seed):
        net = models.build("cnn", {"channels": 4}, seed)
        next(net.parameters()).requires_grad_(False)
        return net

    net = build(0)
    own = own_optimizer(net, kind)
    cfg = spec.optimizer_config(own, None, net)
    init = layout_arrays(net)
    lay = optim.layout_of(init)
    train_core(tmp_path / "a", lay, reference.synthetic_grads(3), range(3), initial_fp16(init), (init, cfg))
    ckpt = checkpoint.save(tmp_path / "a", tmp_path / "own.pt", net, own)
    grouped = checkpoint.save(tmp_path / "a", tmp_path / "grouped.pt", net)  # no script optimizer: the node's groups

    plain = build(1)
    named = dict(plain.named_parameters())
    mine = own_optimizer(plain, kind)
    mine.load_state_dict(torch.load(tmp_path / "own.pt", weights_only=True)["optimizer"])
    ref = spec.torch_optimizer(cfg, [(n, named[n]) for n in ckpt["mindp"]["params"]], 0)
    ref.load_state_dict(grouped["optimizer"])
    key = "exp_avg" if kind == "adamw" else "momentum_buffer"
    frozen = next(plain.parameters())
    assert frozen not in mine.state and [g["lr"] for g in mine.param_groups] == [2e-2, 1e-2]
    for n in ckpt["mindp"]["params"]:
        assert torch.count_nonzero(mine.state[named[n]][key]) and torch.equal(mine.state[named[n]][key],
                                                                              ref.state[named[n]][key]), n
    with pytest.raises(ValueError):  # the node's grouping is not the script's optimizer's
        own_optimizer(build(2), kind).load_state_dict(grouped["optimizer"])

    records = state.read_committed(tmp_path / "a")[3].view(np.uint32)
    old = dict(grouped, mindp={k: v for k, v in grouped["mindp"].items() if k != "state_index"})
    torch.save(old, tmp_path / "old.pt")
    for name in ("own.pt", "grouped.pt", "old.pt"):
        checkpoint.restore(tmp_path / name, tmp_path / f"from-{name}")
        assert np.array_equal(state.read_committed(tmp_path / f"from-{name}")[3].view(np.uint32), records), name


@pytest.mark.parametrize("m", [2, 3])
def test_checkpoint_restored_into_shards_resumes_bit_exactly(tmp_path, m, capsys):
    """A checkpoint of a whole-model node restored into M shard directories (the ranges a job of M
    optimizers gives its nodes): the shards read as the checkpoint's state and train on bit-exactly."""
    net = models.build("cnn", {"channels": 16}, 0)  # 4 chunks or more at any K up to 1,024
    init = layout_arrays(net)
    lay = optim.layout_of(init)
    assert lay.n_chunks > m
    cfg = OptimizerConfig(lr=1e-2, schedule=Schedule("cosine", total=6, warmup=2), groups=flat_group(net))
    gf = reference.synthetic_grads(3)
    params = train_core(tmp_path / "a", lay, gf, range(3), initial_fp16(init), (init, cfg))
    checkpoint.save(tmp_path / "a", tmp_path / "ckpt.pt", net)
    dirs = [tmp_path / f"shard{i}" for i in range(m)]
    job = JobSpec(JOB, {0: "w0", 1: "w1"}, tuple(f"opt{i}" for i in range(m)), S, lay.n_chunks)
    assert checkpoint.restore(tmp_path / "ckpt.pt", dirs) == 2
    assert [state.Store(d, 1 << 20).chunks for d in dirs] == [(lo, hi) for lo, hi, _ in job.shard_ranges()]
    whole, joined = state.read_committed(tmp_path / "a"), state.read_committed(dirs)
    assert whole[0] == joined[0] and np.array_equal(whole[3].view(np.uint32), joined[3].view(np.uint32))
    cores = [node_core.NodeCore(state.Store(d, 1 << 20), JOB, N, S) for d in dirs]
    for step in range(3, 6):
        sums, nf = step_sums(lay, gf, N, step, params)
        got = {}
        for core in cores:
            lo, hi = core.store.chunks
            got.update(feed(core, lay, step, list(range(lo, hi + 1)), sums, nf))
        params = as_worker(lay, got, params)
    uninterrupted = reference.train(init, gf, N, 6, cfg)
    assert same_bits(params, uninterrupted.params)
    with pytest.raises(ConfigError, match="named twice"):
        checkpoint.restore(tmp_path / "ckpt.pt", [tmp_path / "x", tmp_path / "x"])
    with pytest.raises(ConfigError, match="already holds a state"):
        checkpoint.restore(tmp_path / "ckpt.pt", [tmp_path / "y", dirs[0]])
    assert not state.exists(tmp_path / "y")  # refused before any directory is written
    with pytest.raises(ConfigError, match="at most one shard a chunk"):
        checkpoint.restore(tmp_path / "ckpt.pt", [tmp_path / f"z{i}" for i in range(lay.n_chunks + 1)])
    cli = [tmp_path / f"cli{i}" for i in range(m)]  # python -m mindp.torch.checkpoint CKPT DIR0 DIR1 ...
    assert checkpoint.main([str(tmp_path / "ckpt.pt"), *map(str, cli)]) == 0
    assert "resumes after step 2" in capsys.readouterr().out
    assert np.array_equal(state.read_committed(cli)[3].view(np.uint32), joined[3].view(np.uint32))
    assert checkpoint.main([str(tmp_path / "ckpt.pt"), *map(str, cli)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mindp.torch.checkpoint: ") and "already holds a state" in err and err.count("\n") == 1


def test_restore_refuses_an_existing_state_and_a_foreign_file(tmp_path):
    net = models.build("cnn", {"channels": 4}, 0)
    init = layout_arrays(net)
    lay = optim.layout_of(init)
    state.create(tmp_path / "a", lay, state.init_pieces(lay, init), OptimizerConfig(), page_chunks=32)
    checkpoint.save(tmp_path / "a", tmp_path / "c.pt", net)
    with pytest.raises(ConfigError, match="already holds a state"):
        checkpoint.restore(tmp_path / "c.pt", tmp_path / "a")
    torch.save({"model": net.state_dict()}, tmp_path / "plain.pt")
    with pytest.raises(ConfigError, match="is not a mindp checkpoint"):
        checkpoint.restore(tmp_path / "plain.pt", tmp_path / "b")
    with pytest.raises(ConfigError, match="another model"):
        checkpoint.save(tmp_path / "a", tmp_path / "x.pt", models.build("cnn", {"channels": 8}, 0).fc)


def test_hyper_parameters_given_as_tensors_translate_as_their_numbers():
    """torch takes tensors for lr, betas, eps, weight decay and momentum (capturable and compiled
    optimizers hold them so): the node gets their numbers, and the step's check of the groups
    compares numbers (a tuple of tensors was refused as 'must be a finite number')."""
    p = [torch.nn.Parameter(torch.zeros(3))]
    t = torch.tensor
    opt = torch.optim.AdamW(p, lr=t(3e-3), betas=(t(0.8), t(0.99)), eps=t(1e-6), weight_decay=t(0.1))
    assert spec.optimizer_config(opt) == OptimizerConfig(
        "adamw", lr=t(3e-3).item(), betas=(t(0.8).item(), t(0.99).item()), eps=t(1e-6).item(),
        weight_decay=t(0.1).item())
    sgd = torch.optim.SGD(p, lr=t(0.1), momentum=t(0.9), weight_decay=t(1e-4))
    assert spec.optimizer_config(sgd) == OptimizerConfig("sgd", lr=t(0.1).item(), momentum=t(0.9).item(),
                                                         weight_decay=t(1e-4).item())
    assert spec.value([t(0.5), (t(2.0), 3)]) == (0.5, (2.0, 3))


def test_torch_optimizer_and_scheduler_translate():
    p = [torch.nn.Parameter(torch.zeros(3))]
    opt = torch.optim.AdamW(p, lr=3e-3, betas=(0.8, 0.99), weight_decay=0.1)
    seq = L.SequentialLR(opt, [L.LinearLR(opt, 0.2, 1.0, 4), L.CosineAnnealingLR(opt, 16, 1e-5)], [4])
    assert spec.optimizer_config(opt, seq) == OptimizerConfig(
        "adamw", lr=3e-3, betas=(0.8, 0.99), weight_decay=0.1,
        schedule=Schedule("cosine", total=20, warmup=4, warmup_start=0.2, eta_min=1e-5))
    sgd = torch.optim.SGD(p, lr=0.1, momentum=0.9)
    assert spec.optimizer_config(sgd, L.StepLR(sgd, 5, 0.5)).schedule == Schedule("step", step_size=5, gamma=0.5)
    assert spec.optimizer_config(sgd, L.MultiStepLR(sgd, [30, 10, 30], 0.2)).schedule == \
        Schedule("multistep", milestones=(10, 30, 30), gamma=0.2)
    assert spec.optimizer_config(sgd, L.ExponentialLR(sgd, 0.95)).schedule == Schedule("exponential", gamma=0.95)
    assert spec.optimizer_config(sgd, L.CosineAnnealingWarmRestarts(sgd, 10, 2, 1e-5)).schedule == \
        Schedule("restarts", t_0=10, t_mult=2, eta_min=1e-5)
    warm = L.SequentialLR(sgd, [L.LinearLR(sgd, 0.1, 1.0, 5), L.MultiStepLR(sgd, [30, 60], 0.1)], [5])
    assert spec.optimizer_config(sgd, warm).schedule == Schedule("multistep", milestones=(30, 60), gamma=0.1, warmup=5)
    assert spec.optimizer_config(torch.optim.Adam(p, lr=2e-3, betas=(0.8, 0.99))) == OptimizerConfig(
        "adamw", lr=2e-3, betas=(0.8, 0.99), weight_decay=0.0)  # Adam without decay: AdamW's update, no decay
    assert spec.optimizer_config(torch.optim.Adam(p, weight_decay=0.1, decoupled_weight_decay=True)) == \
        OptimizerConfig("adamw", lr=1e-3, weight_decay=0.1)
    for bad, msg in [(torch.optim.RMSprop(p), "optimizer RMSprop is not supported"),
                     (torch.optim.Adam(p, weight_decay=0.01), r"Adam\(weight_decay=0.01\) adds the decay to the gradient"),
                     (torch.optim.AdamW(p, amsgrad=True), "amsgrad=True"),
                     (torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True), "nesterov=True")]:
        with pytest.raises(ConfigError, match=msg):
            spec.optimizer_config(bad)
    opt = torch.optim.AdamW(p)
    with pytest.raises(ConfigError, match=r"LambdaLR is not supported: use StepLR, MultiStepLR, ExponentialLR, .*; "
                                          r"or init\(\.\.\., follow_lr=True\)"):
        spec.optimizer_config(opt, L.LambdaLR(opt, lambda s: 0.9 ** s))


def test_parameter_groups_differing_in_weight_decay_only_become_the_nodes_per_tensor_decay():
    net = models.build("cnn", {"channels": 4}, 0)
    frozen = next(p for p in net.parameters() if p.dim() < 2)
    frozen.requires_grad_(False)
    params = list(net.parameters())
    decay, flat = [p for p in params if p.dim() >= 2], [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": flat, "weight_decay": 0.0}], lr=3e-3)
    cfg = spec.optimizer_config(opt, None, net)
    trained_flat = tuple(n for n, p in net.named_parameters() if p.dim() < 2 and p is not frozen)
    assert (cfg.lr, cfg.weight_decay) == (3e-3, 0.1) and cfg.groups == (ParamGroup(trained_flat, 3e-3, 0.0),)
    same = torch.optim.AdamW([{"params": decay}, {"params": flat}], weight_decay=0.1)
    assert spec.optimizer_config(same, None, net).groups == ()  # groups of one lr and decay: nothing to tell
    head = torch.optim.SGD([{"params": decay}, {"params": flat, "lr": 0.5}], lr=0.1, momentum=0.9)
    sched = L.StepLR(head, 2, 0.5)  # the group's base: its initial_lr
    assert spec.optimizer_config(head, sched, net).groups == (ParamGroup(trained_flat, 0.5, 0.0),)
    for groups, msg in [([{"params": decay}, {"params": flat, "betas": (0.8, 0.9)}], "parameter group 1 of AdamW "
                         "differs from the first in betas: the node runs one optimizer, whose groups may differ in "
                         "lr and weight_decay only"),
                        ([{"params": decay}, {"params": flat, "amsgrad": True}], "amsgrad=True")]:
        with pytest.raises(ConfigError, match=msg):
            spec.optimizer_config(torch.optim.AdamW(groups, weight_decay=0.1), None, net)
    follows = spec.optimizer_config(opt, None, net, follow_lr=True)  # a checkpoint of it: at the base lr
    assert follows.schedule == Schedule("script")
    assert [g["lr"] for g in spec.torch_optimizer(follows, list(net.named_parameters()), 7).param_groups] == [3e-3] * 2
    l2 = torch.optim.Adam([{"params": decay, "weight_decay": 0.0}, {"params": flat, "weight_decay": 0.01}])
    with pytest.raises(ConfigError, match=r"Adam\(weight_decay=0.01\) adds the decay to the gradient"):
        spec.optimizer_config(l2, None, net)


class Tied(torch.nn.Module):
    """nanoGPT's weight tying: the head's weight is the embedding's (one parameter, two names)."""

    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(10, 4)
        self.mid = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.wte.weight


def test_a_tied_parameter_is_saved_as_the_master_under_each_of_its_names(tmp_path):
    net = Tied()
    init = layout_arrays(net)
    assert sorted(init) == ["mid.bias", "mid.weight", "wte.weight"]  # trained once, under its first name
    lay = optim.layout_of(init)
    master = {k: v + 0.5 for k, v in init.items()}  # the node's fp32 master, not the rank's values
    state.create(tmp_path / "s", lay, state.init_pieces(lay, master), OptimizerConfig())
    ckpt = checkpoint.save(tmp_path / "s", tmp_path / "c.pt", net)
    assert np.array_equal(ckpt["model"]["head.weight"].numpy(), master["wte.weight"])
    plain = Tied()
    plain.load_state_dict(torch.load(tmp_path / "c.pt", weights_only=True)["model"])  # (head.weight loads last)
    assert np.array_equal(plain.head.weight.detach().numpy(), master["wte.weight"])


def test_ranks_saving_the_same_path_at_once_each_write_a_whole_checkpoint(tmp_path):
    # Any rank may save: each writes a temporary of its own, so no rename takes another's file away.
    net = Tied()
    init = layout_arrays(net)
    state.create(tmp_path / "s", optim.layout_of(init), state.init_pieces(optim.layout_of(init), init),
                 OptimizerConfig())
    errors = []

    def saves():
        try:
            for _ in range(100):
                checkpoint.save(tmp_path / "s", tmp_path / "c.pt", net)
        except Exception as exc:  # (a thread's exception would not fail the test)
            errors.append(exc)

    writers = [threading.Thread(target=saves) for _ in range(2)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    assert errors == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt", "s"]
    assert checkpoint.restore(tmp_path / "c.pt", tmp_path / "r") == -1


def test_a_save_that_fails_leaves_no_temporary_and_the_old_checkpoint(tmp_path, monkeypatch):
    net = Tied()
    init = layout_arrays(net)
    state.create(tmp_path / "s", optim.layout_of(init), state.init_pieces(optim.layout_of(init), init),
                 OptimizerConfig())
    checkpoint.save(tmp_path / "s", tmp_path / "c.pt", net)
    old = (tmp_path / "c.pt").read_bytes()

    def full_disk(obj, f):
        f.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save(tmp_path / "s", tmp_path / "c.pt", net)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt", "s"] and (tmp_path / "c.pt").read_bytes() == old
