"""What a mindp script may not do silently: frozen parameters stay out of the layout (as DDP leaves
them out), clipping or changing gradients after backward() ends the rank in one line, a failing
rank's exception reaches torchrun's error file; the one-line failure make run prints from it."""
import collections
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from host_agent import gradframes  # noqa: E402
from mindp import codec, progress  # noqa: E402
from mindp.lossscale import LossScaler  # noqa: E402
from mindp.protocol import Kind  # noqa: E402
from mindp.torch import parallel, runscript, script, widened  # noqa: E402
from mininet_topos import rankerrors  # noqa: E402


def frozen_model():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    m[0].weight.requires_grad_(False)
    return m


def test_frozen_parameters_are_left_out_of_the_layout():
    m = frozen_model()
    assert list(parallel.layout_arrays(m)) == ["1.bias", "1.weight", "0.bias"]
    assert parallel.layout_of(m).total == 11
    from mindp.torch import models

    before = m[0].weight.detach().clone()
    models.load_params(m, {n: np.zeros(a.shape, np.float16) for n, a in parallel.layout_arrays(m).items()})
    assert torch.equal(m[0].weight, before) and not m[1].weight.any()


class FakeHandle:
    """A step's handle without a network: its frames hold what put() was given, as the agent's do."""

    def __init__(self, layout):
        self.layout, self.put_names, self.got = layout, set(), {}
        self.frames = np.zeros((layout.n_chunks, codec.frame_len(Kind.GRAD)), np.uint8)

    def put(self, name, grad, scale=1.0):
        self.put_names.add(name)
        self.got[name] = grad.detach() / scale
        gradframes.put(self.frames, self.layout.offsets[name], gradframes.as_array(grad), np.zeros(len(self.frames), np.uint8),
                       scale=scale)

    def holds(self, name, grad, scale=1.0):
        return gradframes.holds(self.frames, self.layout.offsets[name], gradframes.as_array(grad), scale=scale)

    def wait(self):
        return {s.name: np.zeros(s.shape, np.float16) for s in self.layout.specs}


class FakeAgent:
    """A worker agent without a network: start_step hands out a handle that keeps what it is given."""

    def __init__(self, layout):
        self.layout, self.nonfinite_chunks, self.handles = layout, 0, []

    def start_step(self):
        self.handles.append(FakeHandle(self.layout))
        return self.handles[-1]


def test_a_gradient_changed_after_backward_is_refused_not_lost():
    m = frozen_model()
    dp = parallel.DataParallel(m, FakeAgent(parallel.layout_of(m)))
    dp.begin()
    m(torch.ones(2, 4)).sum().backward()
    dp.finish()  # unchanged: fine
    assert m[0].weight.grad is None  # frozen: no gradient, nothing pushed
    dp.begin()
    m(torch.ones(2, 4)).sum().backward()
    torch.nn.utils.clip_grad_value_([m[1].weight], 1e-3)  # not a mindp Optimizer's: torch's own function
    with pytest.raises(parallel.GradientChanged, match=r"^the gradient of 1.weight changed after backward"):
        dp.finish()


@pytest.mark.parametrize("scale", [None, 1000.0])
def test_a_gradient_edited_through_grad_data_is_refused_though_no_counter_moved(scale):
    """`p.grad.data.clamp_(-1, 1)` (old DQN scripts) moves no version counter: the step's frames
    tell. An edit that leaves every fp16 value as sent changes nothing the network holds: no error.
    With a loss scale the frames hold each gradient over it, and are compared so."""
    m = frozen_model()
    dp = parallel.DataParallel(m, FakeAgent(parallel.layout_of(m)), scaler=LossScaler(scale) if scale else None)
    dp.begin()
    m(torch.ones(2, 4)).sum().backward()
    m[1].bias.grad.data.add_(1e-6)  # 2.0 + 1e-6 rounds to fp16's 2.0: as sent
    dp.finish()
    dp.begin()
    m(torch.ones(2, 4)).sum().backward()
    m[1].bias.grad.data.clamp_(-1, 1)  # the bias's gradient is 2 (two examples)
    with pytest.raises(parallel.GradientChanged, match=r"^the gradient of 1.bias changed after backward"):
        dp.finish()


def test_clipping_a_mindp_parameter_ends_the_script_at_the_call_and_others_clip_as_ever():
    m, other = frozen_model(), torch.nn.Linear(2, 2)
    script._owned.update(id(p) for _, p in parallel.trained(m))
    try:
        script._guard_clipping()
        script._guard_clipping()  # twice: still one guard
        for fn in (torch.nn.utils.clip_grad_norm_, torch.nn.utils.clip_grad.clip_grad_norm_,
                   torch.nn.utils.clip_grad_value_):
            with pytest.raises(SystemExit) as exc:
                fn(m.parameters(), 1.0)
            assert str(exc.value.code).startswith("mindp.torch: torch.nn.utils.clip_grad_")
            assert "is not supported" in str(exc.value.code) and "\n" not in str(exc.value.code)
        other(torch.ones(1, 2)).sum().mul(100).backward()
        norm = torch.nn.utils.clip_grad_norm_(other.parameters(), 1.0)
        assert float(norm) > 1.0
        assert float(torch.cat([p.grad.reshape(-1) for p in other.parameters()]).norm()) == pytest.approx(1.0)
    finally:
        script._owned.clear()


def test_log_before_init_is_one_line():
    script._current.clear()
    with pytest.raises(SystemExit, match="call mindp.torch.init first"):
        script.log(loss=1.0)


def test_runscript_writes_the_error_file_and_keeps_the_exit(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nprint(sys.argv[1:])\nraise ValueError('no such column: x\\nmore')\n")
    refused = tmp_path / "refused.py"
    refused.write_text("raise SystemExit('mindp.torch: step(closure) is not supported')\n")
    coded = tmp_path / "coded.py"
    coded.write_text("import sys\nsys.exit(3)\n")
    for path, code, want in ((bad, 1, ("ValueError", "no such column: x")),
                             (refused, 1, ("SystemExit", "mindp.torch: step(closure) is not supported")),
                             (coded, 3, ("SystemExit", "exit 3"))):
        err = tmp_path / f"{path.stem}.json"
        proc = subprocess.run([sys.executable, "-m", "mindp.torch.runscript", str(path), "--x=1"], capture_output=True,
                              text=True, env={**os.environ, "RANK": "3", runscript.ERROR_FILE_ENV: str(err)})
        assert proc.returncode == code
        rec = json.loads(err.read_text())
        assert (rec["mindp"]["type"], rec["mindp"]["message"], rec["mindp"]["rank"]) == (*want, 3)
        assert "Traceback" in rec["message"]["extraInfo"]["py_callstack"]
        assert proc.stdout == ("['--x=1']\n" if path is bad else "")  # the script's own argv


def test_first_failure_from_error_files_then_from_torchrun_log(tmp_path):
    d = tmp_path / "torchrun" / "run_x" / "attempt_0"
    for rank, t, msg in ((1, 50.0, "late"), (0, 20.0, "first")):
        (d / str(rank)).mkdir(parents=True)
        (d / str(rank) / "error.json").write_text(json.dumps(
            runscript.error_record(RuntimeError(msg), str(rank), t)))
    log = tmp_path / "torchrun.log"
    assert rankerrors.first_failure(tmp_path / "torchrun", log) == "rank 0 failed: RuntimeError: first"
    # torch's own @record format (no mindp part): the rank from the directory
    (d / "0" / "error.json").unlink()
    (d / "1" / "error.json").write_text(json.dumps({"message": {"message": "KeyError: 'x'",
                                                                "extraInfo": {"timestamp": "7"}}}))
    assert rankerrors.first_failure(tmp_path / "torchrun", log) == "rank 1 failed: KeyError: 'x'"
    # no file (a script run without runscript): torchrun's own lines
    (d / "1" / "error.json").unlink()
    log.write_text("[default0]:step 0\n[default1]:Traceback (most recent call last):\n"
                   '[default1]:  File "s.py", line 4, in <module>\n[default1]:    raise RuntimeError("boom")\n'
                   "[default1]:RuntimeError: boom\n"
                   "E1128 api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 22413) of binary: python\n"
                   "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n")
    assert rankerrors.first_failure(tmp_path / "torchrun", log) == "rank 1 failed: RuntimeError: boom"
    log.write_text("failed (exitcode: -9) local_rank: 0 (pid: 1) of binary: python\n")
    assert rankerrors.first_failure(tmp_path / "torchrun", log) == "rank 0 failed: killed by SIGKILL"
    log.write_text("[default0]:step 2\n[default0]:terminate called without an active exception\n"
                   "failed (exitcode: -6) local_rank: 0 (pid: 1) of binary: python\n")
    assert rankerrors.first_failure(tmp_path / "torchrun", log) == \
        "rank 0 failed: killed by SIGABRT: terminate called without an active exception"


@pytest.mark.parametrize("how", ["no_sync", "require_backward_grad_sync"])
def test_gradients_accumulated_under_no_sync_leave_once_as_their_sum(how):
    """opt.no_sync(), or DDP's attribute set on the model as nanoGPT's loop sets it on its DDP model
    (`model.require_backward_grad_sync = micro_step == last`)."""
    m = frozen_model()
    agent = FakeAgent(parallel.layout_of(m))
    dp = parallel.DataParallel(m, agent)
    xs = [torch.full((2, 4), float(i + 1)) for i in range(3)]
    dp.begin()
    if how == "no_sync":
        with dp.no_sync():
            for x in xs[:2]:
                m(x).sum().backward()
    else:
        for micro, x in enumerate(xs[:2]):
            m.require_backward_grad_sync = micro == 2
            m(x).sum().backward()
        m.require_backward_grad_sync = True
    assert agent.handles[-1].got == {}  # nothing sent while accumulating
    m(xs[2]).sum().backward()
    sent = agent.handles[-1].got
    dp.finish()
    ref = frozen_model()
    for x in xs:
        ref(x).sum().backward()
    assert set(sent) == {"1.weight", "1.bias", "0.bias"}
    for name, p in ref.named_parameters():
        if p.requires_grad:
            assert torch.equal(sent[name], p.grad), name


def test_a_second_backward_without_no_sync_is_refused_from_the_backward_pass():
    m = frozen_model()
    dp = parallel.DataParallel(m, FakeAgent(parallel.layout_of(m)))
    dp.begin()
    m(torch.ones(2, 4)).sum().backward()
    with pytest.raises(parallel.GradientChanged, match=r"^a second backward\(\) in one step accumulated into the "
                                                       r"gradient of 1.bias .* under `with opt.no_sync\(\):`"):
        m(torch.ones(2, 4)).sum().backward()
    dp.close()
    # a script's optimizer ends the rank with the line instead (SystemExit out of backward())
    dp = parallel.DataParallel(m, FakeAgent(parallel.layout_of(m)), error=lambda msg: SystemExit(f"mindp.torch: {msg}"))
    dp.begin()
    m(torch.ones(2, 4)).sum().backward()
    with pytest.raises(SystemExit) as exc:
        m(torch.ones(2, 4)).sum().backward()
    assert str(exc.value.code).startswith("mindp.torch: a second backward()") and "\n" not in str(exc.value.code)


def test_zero_grad_keeps_zeros_when_asked_and_sends_the_same_gradients():
    sent = []
    for set_to_none in (True, False):
        m = frozen_model()
        agent = FakeAgent(parallel.layout_of(m))
        dp = parallel.DataParallel(m, agent)
        m(torch.ones(2, 4)).sum().backward()  # a gradient left from before the step
        dp.begin(set_to_none)
        assert (m[1].weight.grad is None) == set_to_none
        if not set_to_none:
            assert not m[1].weight.grad.any()
        m(torch.ones(2, 4)).sum().backward()
        sent.append(agent.handles[-1].got)
        dp.close()
    assert sent[0].keys() == sent[1].keys() and all(torch.equal(sent[0][n], sent[1][n]) for n in sent[0])


def test_the_describe_run_makes_a_scripts_process_group_inert(tmp_path):
    """Alone, init_process_group would wait for peers that never come: in the describe run it returns,
    rank and world size are RANK's and WORLD_SIZE's, barrier and broadcast do nothing."""
    script = tmp_path / "group.py"
    script.write_text("import torch, torch.distributed as dist, mindp.torch\n"
                      "dist.init_process_group('gloo')\n"
                      "assert dist.is_initialized() and (dist.get_rank(), dist.get_world_size()) == (0, 4)\n"
                      "dist.barrier()\n"
                      "m = torch.nn.Linear(2, 2)\n"
                      "dist.broadcast(m.weight.data, 0)\n"
                      "mindp.torch.init(m, torch.optim.SGD(m.parameters(), lr=0.5 * dist.get_world_size()))\n"
                      "raise SystemExit('not reached: init exits in a describe run')\n")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("MINDP_", "MASTER_"))},
           "MINDP_DESCRIBE": str(tmp_path / "spec"), "RANK": "0", "WORLD_SIZE": "4",
           "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[2])}
    proc = progress.run([sys.executable, "-m", "mindp.torch.describe", str(script)], capture_output=True, text=True,
                        env=env)  # (a process group that waits for peers uses no CPU: a stall, not a hang)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "spec" / "optimizer.json").read_text())["lr"] == 2.0


def test_a_model_still_wrapped_in_ddp_is_refused_in_one_line():
    """A ported script that kept model = DDP(model): its allreduce would overwrite what mindp sent."""
    ddp = torch.nn.parallel.DistributedDataParallel.__new__(torch.nn.parallel.DistributedDataParallel)
    with pytest.raises(SystemExit) as exc:
        script.init(ddp, torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1))
    msg = str(exc.value.code)
    assert msg.startswith("mindp.torch.init: the model is wrapped in DistributedDataParallel") and "\n" not in msg


@pytest.mark.parametrize("timeout", [0, -1.0, float("inf"), float("nan"), "60", True])
def test_a_timeout_that_is_no_duration_ends_init_in_one_line(timeout):
    m = torch.nn.Linear(3, 2)
    with pytest.raises(SystemExit) as exc:
        script.init(m, torch.optim.SGD(m.parameters(), lr=0.1), timeout=timeout)
    assert str(exc.value.code) == f"mindp.torch.init: timeout={timeout!r}: give seconds > 0 or a datetime.timedelta"


def test_make_runs_loss_reaches_the_ranks_seeded_per_host_as_every_agent(monkeypatch):
    """With SCRIPT= make run's LOSS was injected on the optimizer node only: the ranks ignored it."""
    from host_agent import agent_args
    from mindp.topology import star

    topo = star([2], slots=8)
    host = topo.jobs[0].workers[1]
    monkeypatch.delenv("MINDP_LOSS", raising=False)
    assert script.faults(topo, host) is None
    monkeypatch.setenv("MINDP_LOSS", "0.02")
    monkeypatch.setenv("MINDP_SEED", "7")
    f = script.faults(topo, host)
    assert (f.drop_send, f.drop_recv) == (0.02, 0.02)
    twin = __import__("random").Random(agent_args.host_fault_seed(7, topo.hosts, host))
    assert [f.rng.random() for _ in range(3)] == [twin.random() for _ in range(3)]
    for loss, seed in (("0.7", "7"), ("x", "7"), ("0.02", "-1"), ("0.02", "y")):
        monkeypatch.setenv("MINDP_LOSS", loss)
        monkeypatch.setenv("MINDP_SEED", seed)
        with pytest.raises(script.MindpError, match="make run's LOSS and SEED"):
            script.faults(topo, host)


class SteppingAgent(FakeAgent):
    """FakeAgent whose steps count and whose counters a mindp Optimizer's records read."""

    def __init__(self, layout):
        super().__init__(layout)
        self.step, self.rejected, self.nonfinite_chunks = 0, 0, []
        self.stats = collections.Counter()

    def start_step(self):
        handle = super().start_step()
        wait = handle.wait

        def waited():
            self.step += 1
            return wait()
        handle.wait = waited
        return handle


@pytest.mark.parametrize("order", ["zero_grad forward log backward step", "forward backward step zero_grad log",
                                   "zero_grad forward backward step log", "forward log backward step zero_grad"])
def test_log_reports_the_step_the_loss_was_computed_in_whatever_the_loops_order(order, tmp_path):
    """The Hugging Face loop (backward, step, zero_grad, then log) had each loss labelled a step late:
    zero_grad() counted as the next step's start."""
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 2)
    agent = SteppingAgent(parallel.layout_of(m))
    opt = script.Optimizer(m, agent, None, 1, 0, str(tmp_path), torch.optim.SGD(m.parameters(), lr=0.1))
    try:
        for step in range(3):
            for op in order.split():
                if op == "forward":
                    loss = m(torch.ones(1, 4)).sum()
                    with torch.no_grad():
                        m(torch.ones(1, 4))  # an evaluation's forward starts no step
                elif op == "log":
                    script.log(loss=float(step))
                elif op == "backward":
                    loss.backward()
                else:
                    getattr(opt, op)()
        lines = [json.loads(x) for x in (tmp_path / "rank0.jsonl").read_text().splitlines()]
        assert [(r["step"], r["loss"]) for r in lines if r["ev"] == "log"] == [(0, 0.0), (1, 1.0), (2, 2.0)]
        with pytest.raises(SystemExit, match=r"^mindp.torch.log: step: the step is 2, "):
            script.log(step=5, loss=1.0)
        script.log(step=2, loss=1.0)  # the step it is: accepted
        with pytest.raises(SystemExit, match=r"^mindp.torch.log: job, t: names the record keeps for itself"):
            script.log(job=7, t=1.0, loss=1.0)
    finally:
        script._current.clear()
        script._owned.clear()


@pytest.mark.parametrize("change", ["load_state_dict", "edit", "unfreeze", "freeze"])
def test_parameters_changed_outside_the_network_are_refused_not_undone(change):
    """Weights loaded after init were undone by the node's at the next step, and a parameter
    unfrozen after init trained nothing: each without a word."""
    m = frozen_model()
    dp = parallel.DataParallel(m, FakeAgent(parallel.layout_of(m)))
    dp.begin()
    m(torch.ones(2, 4)).sum().backward()
    dp.finish()
    dp.begin()  # the network's own writes are no change
    m(torch.ones(2, 4)).sum().backward()
    dp.finish()
    if change == "load_state_dict":
        m.load_state_dict({k: v + 1 for k, v in m.state_dict().items()})
    elif change == "edit":
        with torch.no_grad():
            m[1].bias.clamp_(-0.1, 0.1)
    else:
        m[0].weight.requires_grad_(change == "unfreeze")
        m[1].weight.requires_grad_(change != "freeze")
    with pytest.raises(parallel.GradientChanged) as exc:
        dp.begin()
    why = "changed in place since the network last wrote" if change in ("load_state_dict", "edit") else \
        "the trained parameters changed since init"
    assert why in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("dtype,block,compiled", [(torch.float32, parallel.CHECK_BLOCK, True),
                                                  (torch.float32, parallel.CHECK_BLOCK, False),
                                                  (torch.float32, 2, False), (torch.float64, 4, False)])
@pytest.mark.parametrize("edit", ["add", "clamp", "nan"])
def test_an_in_place_edit_through_data_is_refused_at_the_next_step_not_undone(edit, dtype, block, compiled,
                                                                               monkeypatch):
    """p.data.clamp_() (WGAN's weight clipping) moves no version counter: the node's next parameters
    undid it without a word. The values the network wrote are compared at the next step, bit for bit,
    in the parameters' dtype (a DataParallel of a float64 module too): float32 in one compiled pass
    (widened), else through torch a block at a time."""
    if compiled and not widened.COMPILED:
        pytest.skip("no numba: float32 parameters are compared through torch")
    monkeypatch.setattr(parallel, "CHECK_BLOCK", block)
    monkeypatch.setattr(widened, "COMPILED", compiled)
    m = frozen_model().to(dtype)
    dp = parallel.DataParallel(m, FakeAgent(parallel.layout_of(m)))
    for _ in range(2):  # the network's own writes (zeros here; a NaN among them the same) are no change
        dp.begin()
        m(torch.ones(2, 4, dtype=dtype)).sum().backward()
        dp.agent.handles[-1].wait = lambda: {"1.bias": np.array([np.nan, 0], np.float16),
                                             "1.weight": np.zeros((2, 3), np.float16), "0.bias": np.zeros(3, np.float16)}
        dp.finish()
    p = m[1].weight
    {"add": lambda: p.data.add_(1e-3), "clamp": lambda: p.data.clamp_(0.01, 0.1),
     "nan": lambda: p.data.__setitem__((0, 0), float("nan"))}[edit]()
    dp.begin()  # no counter moved
    m(torch.ones(2, 4, dtype=dtype)).sum().backward()
    with pytest.raises(parallel.GradientChanged) as exc:
        dp.finish()
    assert str(exc.value).startswith("1.weight: values changed since the network last wrote the parameters (an "
                                     "in-place edit through .data") and "\n" not in str(exc.value)


def test_a_sparse_gradient_is_refused_in_one_line():
    """nn.Embedding(sparse=True): a TypeError traceback from inside the backward hook."""
    m = torch.nn.Embedding(10, 4, sparse=True)
    dp = parallel.DataParallel(m, FakeAgent(parallel.layout_of(m)))
    dp.begin()
    with pytest.raises(parallel.GradientChanged, match=r"^the gradient of weight is sparse \(nn.Embedding"):
        m(torch.tensor([1, 2])).sum().backward()


def test_a_sparse_gradient_accumulated_under_no_sync_is_refused_in_one_line():
    m = torch.nn.Embedding(10, 4, sparse=True)
    dp = parallel.DataParallel(m, FakeAgent(parallel.layout_of(m)))
    dp.begin()
    with dp.no_sync():
        m(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(parallel.GradientChanged, match=r"^the gradient of weight is sparse"):
        dp.finish()


def half_used_model():
    """A module whose loss below depends on `used` only (a second head, an unused branch)."""
    torch.manual_seed(0)
    return torch.nn.ModuleDict({"used": torch.nn.Linear(4, 2), "head": torch.nn.Linear(4, 2)})


def test_a_parameter_without_a_gradient_is_refused_unless_asked_then_sent_as_zeros():
    """torch's optimizer skips a parameter whose grad is None; the node would move it on a zero
    gradient (AdamW's decay, momentum). DDP refuses such a step by default and takes
    find_unused_parameters=True; so does mindp, which then sends zeros. A zero gradient left by
    zero_grad(set_to_none=False) is a gradient, stepped by torch too: sent, not refused."""
    for find in (False, True):
        m = half_used_model()
        agent = FakeAgent(parallel.layout_of(m))
        dp = parallel.DataParallel(m, agent, find_unused_parameters=find)
        dp.begin()
        m["used"](torch.ones(2, 4)).sum().backward()
        if not find:
            with pytest.raises(parallel.GradientChanged, match=r"^head.weight, head.bias: no gradient in this step "
                                                               r"\(the loss does not depend on them\).*"
                                                               r"pass find_unused_parameters=True"):
                dp.finish()
            m.zero_grad(set_to_none=False)  # zeros where a backward left a gradient: still None for head
            dp.begin(set_to_none=False)
            m["used"](torch.ones(2, 4)).sum().backward()
            with pytest.raises(parallel.GradientChanged, match=r"^head.weight, head.bias: no gradient"):
                dp.finish()
            m["head"](torch.ones(2, 4)).sum().backward()  # head gets a gradient once ...
            dp.begin(set_to_none=False)  # ... which zero_grad(set_to_none=False) keeps as zeros
            m["used"](torch.ones(2, 4)).sum().backward()
            dp.finish()
            assert not agent.handles[-1].got["head.weight"].any()
            continue
        dp.finish()
        got = agent.handles[-1].got
        assert not got["head.weight"].any() and not got["head.bias"].any() and got["used.weight"].any()
        assert got["head.weight"].shape == m["head"].weight.shape


class StepAgent(FakeAgent):
    """FakeAgent with what a script Optimizer reads of a worker agent."""

    step, stats, rejected = 0, {"sent": 0, "retransmitted": 0}, 0


@pytest.mark.parametrize("find", [False, True])
def test_a_script_whose_loss_leaves_a_parameter_out_ends_in_one_line_or_sends_zeros(find):
    m = half_used_model()
    o = torch.optim.AdamW(m.parameters(), lr=0.01)
    opt = script.Optimizer(m, StepAgent(parallel.layout_of(m)), None, torch_optimizer=o,
                           cfg=script.optimizer_config(o, None, m), find_unused_parameters=find)
    script._current.clear()  # (log()'s optimizer: this process's other tests make their own)
    opt.zero_grad()
    m["used"](torch.ones(2, 4)).sum().backward()
    if find:
        opt.step()
        assert not opt.agent.handles[-1].got["head.bias"].any()
        return
    with pytest.raises(SystemExit) as exc:
        opt.step()
    msg = str(exc.value.code)
    assert msg.startswith("mindp.torch: head.weight, head.bias: no gradient in this step") and "\n" not in msg
    assert "requires_grad_(False)" in msg and "find_unused_parameters=True" in msg


def test_zero_grad_after_a_backward_sent_the_step_is_refused():
    """The switch keeps a step's first gradients from a worker: a backward discarded by zero_grad()
    (a skipped batch, an out-of-memory retry) cannot be taken back. Under no_sync nothing has left,
    so a discard there is fine; a backward that failed midway has sent part of the step."""
    m = frozen_model()
    dp = parallel.DataParallel(m, FakeAgent(parallel.layout_of(m)))
    dp.begin()
    with dp.no_sync():
        m(torch.ones(2, 4)).sum().backward()
    dp.begin()  # nothing sent yet: discarded as torch discards it
    m(torch.ones(2, 4)).sum().backward()
    with pytest.raises(parallel.GradientChanged, match=r"^zero_grad\(\) after a backward\(\) sent this step's "
                                                       r"gradients: .* under `with opt.no_sync\(\):`"):
        dp.begin()
    dp.close()

    class Boom(torch.autograd.Function):  # fails once the later layer's gradients have left
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            raise MemoryError("out of memory")

    dp = parallel.DataParallel(m, FakeAgent(parallel.layout_of(m)))
    with pytest.raises(MemoryError):
        dp.step(m[1](Boom.apply(m[0](torch.ones(2, 4)))).sum())
    with pytest.raises(parallel.GradientChanged, match=r"^zero_grad\(\) after a backward\(\) sent"):
        dp.begin()


@pytest.mark.parametrize("change", ["data", "double"])
def test_a_parameter_replaced_or_converted_after_init_is_refused(change):
    """`p.data = ...` and .double() move no version counter: the storage and dtype tell."""
    m = frozen_model()
    dp = parallel.DataParallel(m, FakeAgent(parallel.layout_of(m)))
    dp.step(m(torch.ones(2, 4)).sum())
    if change == "data":
        m[1].weight.data = m[1].weight.data.clamp(-0.01, 0.01)
    else:
        m.double()
    with pytest.raises(parallel.GradientChanged, match=r"changed in place since the network last wrote the "
                                                       r"parameters \(load_state_dict, an edit, `.data =`"):
        dp.begin()


@pytest.mark.parametrize("find", [False, True])
def test_step_without_a_backward_is_refused(find):
    m = frozen_model()
    dp = parallel.DataParallel(m, FakeAgent(parallel.layout_of(m)), find_unused_parameters=find)
    dp.step(m(torch.ones(2, 4)).sum())
    dp.begin()
    with pytest.raises(parallel.GradientChanged, match=r"^step\(\) without a backward\(\) since the last step\(\)"):
        dp.finish()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_parameters_that_are_not_float32_are_refused_at_init(monkeypatch, dtype):
    for k in list(os.environ):
        if k.startswith(("MINDP_", "RANK", "WORLD_SIZE")):
            monkeypatch.delenv(k)
    m = torch.nn.Linear(3, 2).to(dtype)
    with pytest.raises(SystemExit) as exc:
        script.init(m, torch.optim.SGD(m.parameters(), lr=0.1))
    assert str(exc.value.code) == (f"mindp.torch.init: weight ({dtype}), bias ({dtype}): the node keeps float32 master "
                                   "weights and the ranks hold their fp16 values, so this would train in another "
                                   "precision than your optimizer: keep parameters float32 (torch.autocast for "
                                   "lower-precision compute)")


def test_an_lr_off_the_schedule_is_refused_before_the_steps_first_gradient_leaves():
    """sched.step() before opt.step() (or by epoch): the node would apply a step at its own lr first."""
    m = half_used_model()
    o = torch.optim.AdamW(m.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.5)
    agent = StepAgent(parallel.layout_of(m))
    opt = script.Optimizer(m, agent, None, torch_optimizer=o, cfg=script.optimizer_config(o, sched, m))
    try:
        opt.zero_grad()
        with pytest.warns(UserWarning, match=r"before `optimizer.step\(\)`"):  # torch's warning of it
            sched.step()
        with pytest.raises(SystemExit) as exc:
            m["used"](torch.ones(2, 4)).sum().backward()
    finally:
        script._current.clear()
    assert str(exc.value.code).startswith("mindp.torch: step 0: the script's optimizer holds lr 0.005 as the step's "
                                          "first gradient leaves, the node will apply 0.01 (step schedule")
    assert agent.handles[-1].got == {}  # nothing left


def test_a_complex_parameter_is_refused_by_data_parallel_in_one_line():
    """The switch sums real gradients: a complex parameter is refused when the module is wrapped,
    not cast to its real part (torch's .float()) nor failed on at a later step."""
    m = torch.nn.Linear(2, 2)
    m.weight = torch.nn.Parameter(torch.zeros(2, 2, dtype=torch.complex64))
    with pytest.raises(ValueError, match=r"^weight \(complex64\): the switch sums real floating-point gradients"):
        parallel.DataParallel(m, FakeAgent(None))
