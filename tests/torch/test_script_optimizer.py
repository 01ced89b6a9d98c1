"""What a mindp script's optimizer may not do silently: the lr the node applies is checked at every
step (a scheduler's, or each group's under follow_lr), other hyper-parameters and the groups stay as
init read them, the optimizer holds just the parameters the node trains, and what the node owns (its
state, GradScaler's unscaling) is refused in one line."""
import os

import pytest

torch = pytest.importorskip("torch")

from mindp.torch import script  # noqa: E402


def exit_line(call, *args) -> str:
    """The line a refused call ends the rank with (SystemExit's code): one line, as every refusal."""
    with pytest.raises(SystemExit) as exc:
        call(*args)
    msg = str(exc.value.code)
    assert "\n" not in msg, msg
    return msg


def lr_checker(torch_opt, sched=None) -> script.Optimizer:
    """step()'s lr check alone: a mindp Optimizer without a network over `torch_opt`."""
    from host_agent import lr
    from mindp.torch.spec import base_lr, optimizer_config

    opt = script.Optimizer.__new__(script.Optimizer)
    opt.torch_optimizer, opt.cfg = torch_opt, optimizer_config(torch_opt, sched, torch_opt.module)
    opt.rates = [lr.Rates(base_lr(g), opt.cfg.schedule) for g in torch_opt.param_groups]
    opt.told = {}
    opt.members = script.members_of(torch_opt)
    return opt


def cosine(lr: float = 0.01):
    """Two parameter groups, the second at twice the lr."""
    m = torch.nn.Linear(2, 2)
    o = torch.optim.AdamW([{"params": [m.weight]}, {"params": [m.bias], "lr": 2 * lr, "weight_decay": 0.0}], lr=lr)
    o.module = m
    return o, torch.optim.lr_scheduler.SequentialLR(o, [torch.optim.lr_scheduler.LinearLR(o, 0.1, 1.0, 2),
                                                        torch.optim.lr_scheduler.CosineAnnealingLR(o, 6)], [2])


def test_the_lr_of_a_scheduler_stepped_after_each_step_passes_every_step():
    o, sched = cosine()
    opt = lr_checker(o, sched)
    o._opt_called = True  # as init sets it
    for step in range(8):
        opt._check_lr(step)
        sched.step()
    assert opt.param_groups is o.param_groups


def test_an_lr_the_node_does_not_apply_ends_the_script_in_one_line():
    o, sched = cosine()
    opt = lr_checker(o, sched)
    o._opt_called = True
    opt._check_lr(0)
    msg = exit_line(opt._check_lr, 1)  # the scheduler not stepped: the node's lr moved on, the script's not
    assert msg.startswith("mindp.torch: step 1: the script's optimizer holds lr 0.001, the node applied ")
    assert "(cosine schedule from lr 0.01, parameter group 0)" in msg
    sched.step()
    opt._check_lr(1)
    right = o.param_groups[0]["lr"]
    opt.param_groups[0]["lr"] = 0.5  # set by hand
    with pytest.raises(SystemExit, match=r"^mindp.torch: step 1: the script's optimizer holds lr 0.5,"):
        opt._check_lr(1)
    opt.param_groups[0]["lr"] = right
    opt._check_lr(1)
    opt.param_groups[1]["lr"] = right  # the second group's, by hand: its own schedule runs from its base, 0.02
    with pytest.raises(SystemExit, match=r"holds lr .*, the node applied .* \(cosine schedule from lr 0.02, "
                                         r"parameter group 1\)"):
        opt._check_lr(1)
    # a scheduler init was not given: the node's lr is constant
    o, sched = cosine()
    opt = lr_checker(o)
    with pytest.raises(SystemExit, match=r"the node applied 0.01 \(constant schedule from lr 0.01, parameter group 0\)"):
        opt._check_lr(0)  # LinearLR's warmup already took the lr to a tenth


def test_a_resumed_runs_fresh_scheduler_is_brought_to_the_nodes_step():
    o, sched = cosine()
    script._catch_up(sched, 5)
    ref_o, ref = cosine()
    ref_o._opt_called = True
    for _ in range(5):
        ref.step()
    assert o.param_groups[0]["lr"] == ref_o.param_groups[0]["lr"] and sched.last_epoch == 5
    script._catch_up(sched, 3)  # already stepped (the script caught up itself): left alone
    assert sched.last_epoch == 5
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(ref_o)  # (follow_lr) steps on metrics: not replayed
    script._catch_up(plateau, 5)
    assert plateau.last_epoch == 0
    lr_checker(o, sched)._check_lr(5)


def test_an_optimizer_method_the_node_owns_is_a_clear_attribute_error():
    o, _ = cosine()
    opt = lr_checker(o)
    with pytest.raises(AttributeError, match=r"has no 'state_dict': the optimizer node holds the optimizer's state"):
        opt.state_dict()
    assert not hasattr(opt, "add_param_group")


def test_the_optimizer_must_hold_just_the_parameters_the_node_trains(monkeypatch):
    """The node trains the module's parameters that require a gradient: an optimizer over others, or
    over a part of them, would train differently under DDP, so init refuses it in one line; frozen
    parameters it may hold (they get no gradient)."""
    for k in list(os.environ):
        if k.startswith(("MINDP_", "RANK", "WORLD_SIZE")):
            monkeypatch.delenv(k)
    def refused(module, params) -> str:
        with pytest.raises(SystemExit) as exc:
            script.init(module, torch.optim.SGD(params, lr=0.1))
        return str(exc.value.code)

    m = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))
    assert refused(m, [torch.nn.Parameter(torch.zeros(1)), *m.parameters()]) == (
        "mindp.torch.init: the optimizer holds 1 parameter(s) that are not the model's: mindp trains the model "
        "given to init (give the optimizer its parameters)")
    assert refused(m, m[1].parameters()).startswith(
        "mindp.torch.init: 0.weight, 0.bias: require a gradient but the optimizer does not hold them")
    m[0].requires_grad_(False)
    line = refused(m, m.parameters())  # frozen ones held: past the check, to the next missing piece
    assert "RANK/WORLD_SIZE not set" in line, line
    m[1].requires_grad_(False)
    assert refused(m, m.parameters()) == \
        "mindp.torch.init: the model has no parameter that requires a gradient: nothing to train"
    lazy = torch.nn.Sequential(torch.nn.LazyLinear(4), torch.nn.Linear(4, 2))
    assert refused(lazy, lazy.parameters()) == ("mindp.torch.init: 0.weight, 0.bias: not initialized yet (a lazy "
                                                "module): run a forward pass on a dummy batch before init, as DDP "
                                                "requires")


def test_follow_lr_tells_each_groups_lr_and_checks_every_group_still_holds_it():
    """init(follow_lr=True): the step's lrs go to the node as its first gradient leaves, one for
    each group holding a trained parameter (a layer-wise scale: groups at different lrs, those at
    one lr told apart); at step() every such group must still hold its own, or the rank ends in
    one line (an lr set after backward began would train otherwise than the script says)."""
    from mindp.torch.spec import optimizer_config

    m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    m[1].bias.requires_grad_(False)
    o = torch.optim.AdamW([{"params": [m[0].weight, m[1].weight]}, {"params": [m[1].bias], "lr_scale": 9.0},
                           {"params": [m[0].bias], "weight_decay": 0.0, "lr_scale": 0.5}], lr=0.01)
    opt = script.Optimizer.__new__(script.Optimizer)
    opt.torch_optimizer, opt.cfg, opt.rates, opt.told = o, optimizer_config(o, None, m, follow_lr=True), None, {}
    opt.told_groups = script.told_groups(o, m)
    assert opt.cfg.schedule.kind == "script" and opt.told_groups == [0, 2]  # group 1 trains nothing (frozen)
    assert [g.params for g in opt.cfg.groups] == [("0.bias",)]
    opt.agent = type("Agent", (), {"step": 3})()
    for g in o.param_groups:
        g["lr"] = 0.004 * g.get("lr_scale", 1.0)
    assert opt._tell_lr() == (0.004, 0.002) and opt.told == {3: (0.004, 0.002)}
    opt._check_lr(3)  # unchanged: passes, and forgets the step
    opt._tell_lr()
    o.param_groups[1]["lr"] = 7.0  # a group training nothing: not told, not checked
    o.param_groups[2]["lr"] = 0.5  # changed after the step's first gradient left
    msg = exit_line(opt._check_lr, 3)
    assert msg.startswith("mindp.torch: step 3: parameter group 2 holds lr 0.5, but the node applied 0.002") \
        and "set the lrs before backward()" in msg
    same = torch.optim.SGD([{"params": [m[0].weight]}, {"params": [m[0].bias]}], lr=0.01)
    assert [g.params for g in optimizer_config(same, None, m, follow_lr=True).groups] == [("0.bias",)]
    assert optimizer_config(same, None, m).groups == ()  # replayed schedules: the same lr, one group


def test_a_hyper_parameter_other_than_the_lr_changed_by_the_script_ends_the_rank_in_one_line():
    """OneCycleLR cycles AdamW's betas (cycle_momentum, its default), a script may set a group's
    weight decay: the node applies what init read, so step() says so instead of training on."""
    m = torch.nn.Linear(2, 2)
    o = torch.optim.AdamW(m.parameters(), lr=0.01)
    o.module = m
    opt = lr_checker(o)
    opt.fixed = [{k: v for k, v in g.items() if k in script.FIXED} for g in o.param_groups]
    opt._check_fixed(0)
    sched = torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=10)
    o._opt_called = True
    sched.step()
    msg = exit_line(opt._check_fixed, 1)
    assert msg.startswith("mindp.torch: step 1: parameter group 0's betas changed from (0.9, 0.999) to (") \
        and "only the lr may change" in msg


def test_a_parameter_group_added_after_init_ends_the_rank_in_one_line():
    """The node reads the groups once, at init: a group added later (a fine-tuning script unfreezing
    the backbone with add_param_group) would train at the node with the group its tensors had then,
    whatever its lr says; step() says so instead."""
    m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    o = torch.optim.SGD(m[1].parameters(), lr=0.01)
    o.module = m
    opt = lr_checker(o)
    opt.fixed = [{}]
    opt._check_fixed(0)
    o.add_param_group({"params": list(m[0].parameters()), "lr": 0.001})
    msg = exit_line(opt._check_fixed, 1)
    assert msg.startswith("mindp.torch: step 1: the optimizer's parameter groups changed since init") \
        and "build every group before mindp.torch.init" in msg


def test_torch_amp_grad_scaler_is_refused_in_one_line():
    """GradScaler unscaled the gradients in place after the hooks had sent them scaled (no version
    counter moved): the node trained on gradients times 65,536, without a word."""
    m = torch.nn.Linear(2, 2)
    opt = script.Optimizer.__new__(script.Optimizer)
    opt.torch_optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(m(torch.ones(1, 2)).sum()).backward()
    msg = exit_line(scaler.step, opt)
    assert msg == script.GRAD_SCALER_REFUSED and msg.startswith("mindp.torch: torch.amp.GradScaler is not supported")
