"""`mindp.torch.init`: a torchrun training script through mindp, a few lines changed from DDP.

    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    opt = mindp.torch.init(model, opt, sched)        # was: model = DDP(model)
    for x, y in batches:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step(); sched.step()   # unchanged

The returned object stands in for the optimizer: zero_grad() starts the step, the backward pass
pushes each gradient as autograd finishes it, step() waits for the node's parameters and writes them
into the model. The node runs AdamW/SGD and the schedule itself; step() checks that the lr the
script's torch optimizer holds (its scheduler's, stepped once after each step()) is the one the node
applied, and ends the script in one line where it is not: an lr set by hand, or by a scheduler
init was not given, is refused, never silently replaced. A resumed run's scheduler is brought to
the node's step by init.

Where things come from: the rank is torchrun's RANK (the worker id); MINDP_TOPOLOGY and MINDP_JOB
(or the arguments) name the topology file and job; the interface is the one holding the rank's
address in the topology (MINDP_IFACE overrides); MINDP_STATE names the node's state directory (a
sharded job's: every shard's, separated by ':'), from which every rank takes the parameters the
node holds (its commit: rank 0's initial parameters for a fresh node, or a resumed state), and
where `save` reads the checkpoint.

MINDP_DESCRIBE=DIR runs the script once without a network: init writes DIR/optimizer.json and
DIR/init.npz (this process's parameters, the node's initial state) and exits; `make run SCRIPT=`
does this before it starts the node (mindp-optimizer --init DIR/init.npz --optimizer-spec ...).
"""
from __future__ import annotations

import atexit
import contextlib
import datetime
import json
import math
import os
import pathlib
import sys
import time
import warnings

import numpy as np
import torch

from host_agent import agent_args, lr, optim, rawsock, state
from host_agent.optim import ConfigError
from host_agent.window import RtoConfig, StepTimeout
from host_agent.worker import WorkerAgent, WorkerConfig
from mindp import heap, listed, netutil, progress
from mindp.topology import Topology, TopologyError

from . import checkpoint
from .launch import LOSS_ENV, SEED_ENV
from .parallel import DataParallel, GradientChanged, layout_arrays, layout_of, trained
from .spec import base_lr, optimizer_config, told_groups, value

#: A torch optimizer group's hyper-parameters the node reads once, at init.
FIXED = ("weight_decay", "betas", "eps", "momentum")


def members_of(opt: torch.optim.Optimizer) -> list[tuple[int, ...]]:
    """Each parameter group's parameters (ids): the node reads them once, at init."""
    return [tuple(map(id, g["params"])) for g in opt.param_groups]


CLIP_REFUSED = ("{} is not supported through mindp: the switch sums each gradient as backward() produces it and "
                "the node applies each chunk as its sum arrives, so clipping after backward() would change nothing; drop "
                "the call (docs/TORCH.md)")
#: The directory where each rank appends its per-step figures (rank<r>.jsonl; make run sets it).
METRICS_ENV = "MINDP_METRICS"
_owned: set[int] = set()  # ids of the parameters a mindp Optimizer trains: clipping them is refused
_current: list = []  # the process's Optimizer, for log()


class MindpError(RuntimeError):
    """A script cannot join its job; the message (one line) says what to set."""


def _env(value, name: str, what: str) -> str:
    value = os.environ.get(name) if value is None else value
    if value in (None, ""):
        raise MindpError(f"no {what}: set {name} or pass it to mindp.torch.init")
    return str(value)


def faults(topo: Topology, host: str) -> rawsock.Faults | None:
    """The loss MINDP_LOSS and MINDP_SEED ask for on `host` (None: none)."""
    text, seed = os.environ.get(LOSS_ENV, "").strip(), os.environ.get(SEED_ENV, "0").strip() or "0"
    try:
        rate, seed_n = float(text or 0), int(seed)
    except ValueError:
        rate = seed_n = -1
    if not 0 <= rate <= 0.5 or seed_n < 0:
        raise MindpError(f"{LOSS_ENV}={text!r} {SEED_ENV}={seed!r}: a loss rate in [0, 0.5] and a seed >= 0 "
                         "(make run's LOSS and SEED)")
    return rawsock.Faults(rate, rate, agent_args.host_fault_seed(seed_n, topo.hosts, host)) if rate else None


def iface_with(ip: str) -> str:
    """The interface of this network namespace that holds IPv4 address `ip`."""
    name = netutil.interface_holding(ip)
    if name:
        return name
    raise MindpError(f"no interface holds {ip} here: run the rank on its topology host (with make run's network: "
                     "make run SCRIPT=... UP=1 prints the command for each host) or set MINDP_IFACE")


#: The names each line of a rank's figures keeps for itself (Optimizer.record): not mindp.torch.log's.
RECORD_FIELDS = frozenset({"ev", "step", "job", "worker", "t", "sent", "retx", "rej"})
GRAD_SCALER_REFUSED = ("mindp.torch: torch.amp.GradScaler is not supported: mindp sends each gradient as backward() "
                       "produces it, before the scaler unscales it, so the node would train on gradients times the "
                       "scale; drop the scaler (a non-finite step is skipped by the node, as GradScaler skips it)")


class Optimizer:
    """What init returns: zero_grad() / step() like a torch optimizer, save(path), the step number."""

    #: torch.amp.GradScaler.step then hands step() its scale (as `grad_scale`) instead of unscaling
    #: the gradients in place unseen (no version counter moves): step() refuses it.
    _step_supports_amp_scaling = True

    def __init__(self, module: torch.nn.Module, agent: WorkerAgent, state_dir: str | None, job: int = 0,
                 rank: int = 0, metrics: str | None = None, torch_optimizer: torch.optim.Optimizer | None = None,
                 cfg: optim.OptimizerConfig | None = None, find_unused_parameters: bool = False):
        """torch_optimizer, cfg: the script's optimizer and the node's configuration, whose lr of
        each step step() checks the optimizer's against; find_unused_parameters: DataParallel's."""
        self.module = module
        self.torch_optimizer = torch_optimizer
        # each torch parameter group's lr of every step, as the node replays it from the group's base
        self.rates = [lr.Rates(base_lr(g), cfg.schedule) for g in torch_optimizer.param_groups] \
            if cfg and cfg.schedule.kind != "script" and torch_optimizer is not None else None
        self.told: dict[int, tuple[float, ...]] = {}  # follow_lr: the lrs each step's first gradient took to the node
        # what the node took once and keeps: a script changing it (OneCycleLR's momentum cycling) is told
        self.fixed = [{k: value(g[k]) for k in FIXED if k in g} for g in torch_optimizer.param_groups] \
            if torch_optimizer is not None else []
        self.members = members_of(torch_optimizer) if torch_optimizer is not None else []
        self.told_groups = told_groups(torch_optimizer, module) if torch_optimizer is not None else [0]
        if cfg and cfg.schedule.kind == "script":
            agent.step_lr = self._tell_lr
        self.cfg = cfg
        self.dp = DataParallel(module, agent, error=lambda msg: SystemExit(f"mindp.torch: {msg}"),
                               find_unused_parameters=find_unused_parameters)
        if self.rates is not None:  # refused before the node applies a step at another lr, not after
            self.dp.before_send = lambda: self._check_schedule(agent.step, " as the step's first gradient leaves",
                                                               "will apply")
        self.agent = agent
        self.state_dir = state_dir
        self.job, self.rank = job, rank
        # a forward pass with gradients since the last step(): what mindp.torch.log reports belongs to
        # the step in progress, not to the one step() finished (zero_grad() alone starts none: a
        # loop of backward, step, zero_grad, log logs the step it finished)
        self.in_step = False
        module.register_forward_pre_hook(self._forward)
        self.began: float | None = None  # perf_counter at the step's zero_grad()
        self.metrics = pathlib.Path(metrics) / f"rank{rank}.jsonl" if metrics else None
        if self.metrics:
            self.metrics.parent.mkdir(parents=True, exist_ok=True)
        _owned.update(id(p) for _, p in trained(module))
        _guard_clipping()
        _current[:] = [self]
        self.last_t = 0.0
        # ready: the step before the first this process trains; `start`, that first step, tells the
        # script's reference where this rank's random draws began again (mindp.torch.scriptref)
        self.record(ev="step", step=agent.step - 1, start=agent.step)
        if self.metrics:
            atexit.register(self.done)

    def record(self, **rec) -> None:
        """One JSON line of this rank's figures (make run's progress, metrics.csv)."""
        if self.metrics:
            self.last_t = time.time()
            line = {"job": self.job, "worker": self.rank, "t": self.last_t, "sent": self.agent.stats["sent"],
                    "retx": self.agent.stats["retransmitted"], "rej": self.agent.rejected,
                    "cpu": round(time.process_time(), 4), **rec}
            with open(self.metrics, "a") as f:
                f.write(json.dumps(line) + "\n")

    def done(self) -> None:
        """The rank's last line as it exits, as a built-in worker's: its counters, the step digest's
        checks among them (summary.json, mindp-ctl stats --run), timed at its last step's record
        (what the script does after its last step is not training)."""
        stats = {k: int(self.agent.stats[k]) for k in ("sent", "retransmitted", "digest_checks", "digest_mismatches")}
        with contextlib.suppress(OSError), open(self.metrics, "a") as f:
            f.write(json.dumps({"ev": "done", "job": self.job, "worker": self.rank, "t": self.last_t,
                                "step": self.agent.step - 1, "stats": stats}) + "\n")

    @property
    def step_number(self) -> int:
        """The next step the job will train (0-based)."""
        return self.agent.step

    @property
    def param_groups(self) -> list[dict]:
        """The script's torch optimizer's (its lr is checked at each step(), not applied from here)."""
        return self.torch_optimizer.param_groups

    def __getattr__(self, name: str):
        raise AttributeError(f"mindp.torch's optimizer has no {name!r}: the optimizer node holds the optimizer's "
                             "state (opt.save(path) writes it as a torch checkpoint); it offers zero_grad, step, "
                             "no_sync, step_number, param_groups and save (docs/TORCH.md)")

    def _forward(self, module, args) -> None:
        if torch.is_grad_enabled():  # (an evaluation under no_grad trains no step)
            self.in_step = True

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.dp.begin(set_to_none)
        self.began = time.perf_counter()

    def no_sync(self):
        """Gradient accumulation, as DDP's model.no_sync(): backward() calls in the block add to the
        gradients and send nothing; the step's last backward() (or step()) sends the sums."""
        return self.dp.no_sync()

    def step(self, closure=None) -> None:
        if "grad_scale" in vars(self):
            raise SystemExit(GRAD_SCALER_REFUSED)
        if closure is not None:
            raise SystemExit("mindp.torch: step(closure) is not supported: call backward before step()")
        step = self.agent.step
        # the rank's own seconds from zero_grad() to here (forward and backward) and its wait then
        compute = {"compute": round(time.perf_counter() - self.began, 6)} if self.began is not None else {}
        self.began = None
        try:
            self.dp.finish()
        except GradientChanged as exc:
            raise SystemExit(f"mindp.torch: {exc}") from None
        except StepTimeout as exc:
            raise SystemExit(f"mindp.torch: {exc}; a peer working alone for longer between steps (evaluating, "
                             "saving) needs a longer mindp.torch.init(timeout=...) (docs/TORCH.md)") from None
        self.in_step = False
        if self.agent.nonfinite_chunks and self.dp.scaler is None:
            print(f"mindp.torch: step {step}: a rank's gradients were not finite (Inf or NaN): the optimizer node "
                  "skipped the step, as torch's GradScaler does, and the parameters are unchanged", file=sys.stderr)
        told = self.told.get(step, ())  # (several groups' lrs: "lrs" beside group 0's "lr")
        self.record(ev="step", step=step, **({"lr": told[0]} if told else {}),
                    **({"lrs": list(told)} if len(told) > 1 else {}), **compute, wait=round(self.dp.wait_seconds, 6))
        self._check_lr(step)
        self._check_fixed(step)

    def _check_fixed(self, step: int) -> None:
        """Every group still holds the parameters and hyper-parameters the node took at init, or
        the rank ends."""
        if members_of(self.torch_optimizer) != self.members:
            raise SystemExit(f"mindp.torch: step {step}: the optimizer's parameter groups changed since init "
                             "(add_param_group, or a parameter moved to another group): the node reads them once, "
                             "at init: build every group before mindp.torch.init (docs/TORCH.md)")
        for i, (g, fixed) in enumerate(zip(self.torch_optimizer.param_groups, self.fixed)):
            for k, v in fixed.items():
                if value(g[k]) != v:
                    raise SystemExit(f"mindp.torch: step {step}: parameter group {i}'s {k} changed from {v!r} to "
                                     f"{value(g[k])!r}: the node applies what init read, and only the lr may change "
                                     "(through the scheduler given to init, or with follow_lr) (docs/TORCH.md)")

    def _tell_lr(self) -> tuple[float, ...]:
        """The step's lrs for the node, a group each, as its first gradient leaves (follow_lr)."""
        groups = self.torch_optimizer.param_groups
        lrs = tuple(float(value(groups[i]["lr"])) for i in self.told_groups)
        self.told[self.agent.step] = lrs
        return lrs

    def _check_lr(self, step: int) -> None:
        """The lr the script's optimizer holds for `step` is the one the node applied (its schedule
        after `step` calls of the scheduler's step(); with follow_lr the lr told as the step began),
        bit for bit, or the script ends in one line."""
        if step in self.told:
            told = self.told.pop(step)
            for i, lr_told in zip(self.told_groups, told):
                have = float(value(self.torch_optimizer.param_groups[i]["lr"]))
                if have != lr_told:
                    raise SystemExit(f"mindp.torch: step {step}: parameter group {i} holds lr {have!r}, but the node "
                                     f"applied {lr_told!r}, the lr it held as the step's first gradient left "
                                     "(follow_lr): set the lrs before backward() (docs/TORCH.md)")
            return
        self._check_schedule(step, "", "applied")

    def _check_schedule(self, step: int, when: str, applies: str) -> None:
        """The lr each group holds is the node's schedule's for `step`, or the script ends in one line."""
        if self.rates is None:
            return
        groups = self.torch_optimizer.param_groups
        for i, (g, rates) in enumerate(zip(groups, self.rates)):
            have, want = float(value(g["lr"])), rates.at(step)
            if have != want:
                which = f", parameter group {i}" if len(groups) > 1 else ""
                raise SystemExit(f"mindp.torch: step {step}: the script's optimizer holds lr {have!r}{when}, the node "
                                 f"{applies} {want!r} ({self.cfg.schedule.kind} schedule from lr {rates.base!r}{which}): "
                                 "the node runs the schedule of the scheduler given to mindp.torch.init, so set the "
                                 "lr only through it and call its step() once after each opt.step() (docs/TORCH.md)")

    def clip_grad_norm_(self, *_args, **_kw):
        raise SystemExit("mindp.torch: " + CLIP_REFUSED.format("clip_grad_norm_"))

    def save(self, path: str | os.PathLike) -> dict:
        """Write the node's fp32 master weights and optimizer state as a torch checkpoint (any rank,
        between steps)."""
        if not self.state_dir:
            raise MindpError("save needs the node's state directory: set MINDP_STATE")
        self._await_commit(self.agent.step - 1)
        return checkpoint.save(state_dirs(self.state_dir), path, self.module, self.torch_optimizer)

    def _await_commit(self, step: int) -> None:
        """Until the node committed `step`, the last this rank finished: the node answers a step's last
        chunks and its digest before its commit (docs/STATE.md), so a save right after step() could
        read the step before. A sharded job: until every shard committed it."""
        dirs = [pathlib.Path(d) for d in state_dirs(self.state_dir)]

        def committed() -> int:
            try:
                return min(int(state.read_commit(d)["step"]) for d in dirs)
            except (OSError, ValueError, KeyError, TypeError):
                return -2

        try:
            progress.wait(lambda: committed() >= step, committed, stall=progress.STALL,
                          what=f"the node's commit of step {step}")
        except progress.Stalled:
            raise MindpError(f"save: the node did not commit step {step} in {progress.STALL:.0f} s "
                             f"({self.state_dir} says step {committed()})") from None

    def close(self) -> None:
        self.dp.close()
        self.agent.sock.close()
        if _current == [self]:
            _current.clear()


def log(**figures: float) -> None:
    """Report this step's figures, e.g. mindp.torch.log(loss=loss.item()): the step in progress
    (before step()) or the one step() just finished. make run shows rank 0's in its progress line,
    summary.json, curve.svg and metrics.csv; loss and acc (a fraction) are charted."""
    if not _current:
        raise SystemExit("mindp.torch.log: call mindp.torch.init first")
    opt = _current[0]
    try:
        values = {k: float(v) for k, v in figures.items()}
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"mindp.torch.log: figures must be numbers: {exc}") from None
    step = opt.agent.step if opt.in_step or opt.dp.pushed_any else opt.agent.step - 1
    reserved = sorted(set(values) & RECORD_FIELDS - {"step"})
    if reserved or values.pop("step", step) != step:
        raise SystemExit(f"mindp.torch.log: {', '.join(reserved) or 'step'}: " + (
            "names the record keeps for itself" if reserved else f"the step is {step}, the one in progress or just "
            "finished; leave step= out"))
    opt.record(ev="log", step=step, **values)


def _guard_clipping() -> None:
    """torch.nn.utils.clip_grad_norm_/clip_grad_value_ on a parameter mindp trains end the script in
    one line at the call (the gradients already left during backward()); on others they run as ever."""
    import torch.nn.utils as nn_utils
    from torch.nn.utils import clip_grad

    for name in ("clip_grad_norm_", "clip_grad_value_"):
        original = getattr(clip_grad, name)
        if getattr(original, "_mindp_guard", False):
            continue

        def guarded(parameters, *args, _name=name, _original=original, **kw):
            params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
            if any(id(p) in _owned for p in params):
                raise SystemExit("mindp.torch: torch.nn.utils." + CLIP_REFUSED.format(_name))
            return _original(params, *args, **kw)

        guarded._mindp_guard = True
        setattr(clip_grad, name, guarded)
        setattr(nn_utils, name, guarded)


def describe(dirname: str, module: torch.nn.Module, cfg: optim.OptimizerConfig) -> None:
    d = pathlib.Path(dirname)
    d.mkdir(parents=True, exist_ok=True)
    (d / "optimizer.json").write_text(json.dumps(cfg.to_dict(), indent=1) + "\n")
    np.savez(d / "init.npz", **layout_arrays(module))


def state_dirs(state_dir: str) -> list[str]:
    """MINDP_STATE's directories: the node's, or each shard's of a sharded job (':' between them)."""
    return [d for d in state_dir.split(os.pathsep) if d]


def _start(module: torch.nn.Module, state_dir: str | None) -> tuple[dict, int, optim.OptimizerConfig | None]:
    """The parameters every rank starts from, the first step and the node's optimizer: the node's
    committed state if its directory is readable, else this module's own (the ranks must then be
    seeded alike) and None."""
    own = layout_arrays(module)
    if not state_dir:
        return own, 0, None
    for d in state_dirs(state_dir):
        if not state.exists(d):
            raise MindpError(f"MINDP_STATE={state_dir}: {d} holds no optimizer state: start the node first")
    try:
        commit, cfg, layout, records = state.read_committed(state_dirs(state_dir))
    except ConfigError as exc:
        raise MindpError(str(exc)) from None
    if optim.layout_to_json(layout) != optim.layout_to_json(layout_of(module)):
        raise MindpError(f"this rank's model is not the one the node holds ({state_dir}): layouts differ "
                         "(same model class and arguments on every rank?)")
    flat = np.array(records[:, state.MASTER, :].reshape(-1)[: layout.total])
    return {s.name: flat[layout.offsets[s.name]:][: s.size].reshape(s.shape) for s in layout.specs}, \
        int(commit["step"]) + 1, cfg


def _catch_up(scheduler, steps: int) -> None:
    """A resumed run: bring the script's fresh scheduler to the node's step, as `steps` steps would
    (ReduceLROnPlateau, which steps on the script's metrics, stays the script's to restore)."""
    if scheduler is None or not steps or scheduler.last_epoch != 0 \
            or isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (no optimizer.step() before it: the node steps)
        for _ in range(steps):
            scheduler.step()


def init(module: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler=None, *, topology: str | None = None,
         job: int | None = None, iface: str | None = None, state_dir: str | None = None,
         timeout: float | datetime.timedelta | None = None, follow_lr: bool = False,
         find_unused_parameters: bool = False) -> Optimizer:
    """Join the job as worker RANK; see the module docstring. A piece missing ends the script with one
    line on stderr (SystemExit), not a traceback. `timeout` (seconds or a timedelta, as
    torch.distributed's): how long step() waits with no parameters arriving before the rank fails;
    default mindp.progress.STALL (60 s). A rank waits for its peers' gradients, so a script whose
    rank works alone between steps for longer (rank 0 evaluating, saving) gives more.
    `follow_lr`: the node applies, each step, the lr the optimizer holds as the step's first
    gradient leaves (set by hand, or by any scheduler), instead of replaying `scheduler`.
    `find_unused_parameters`: a parameter the step's loss does not depend on is sent as a zero
    gradient (the node's weight decay and momentum still move it); without it, such a step ends the
    rank in one line, as DDP ends it by default."""
    try:
        return _init(module, optimizer, scheduler, topology, job, iface, state_dir, _seconds(timeout),
                     bool(follow_lr), bool(find_unused_parameters))
    except (MindpError, ConfigError) as exc:
        raise SystemExit(f"mindp.torch.init: {exc}") from None


def _seconds(timeout: float | datetime.timedelta | None) -> float:
    if timeout is None:
        return progress.STALL
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < math.inf:
        raise MindpError(f"timeout={timeout!r}: give seconds > 0 or a datetime.timedelta")
    return float(seconds)


def _check_params(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """The node trains the module's parameters that require a gradient: the optimizer must hold every
    one of them and none from elsewhere (frozen ones it may hold: they get no gradient, as under DDP),
    or the node would train what the script's optimizer would not."""
    trainable = dict(trained(module))
    lazy = [n for n, p in trainable.items() if isinstance(p, torch.nn.parameter.UninitializedParameter)]
    if lazy:
        raise MindpError(f"{listed(lazy, 3)}: not initialized yet (a lazy "
                         "module): run a forward pass on a dummy batch before init, as DDP requires")
    if not trainable:
        raise MindpError("the model has no parameter that requires a gradient: nothing to train")
    other = [f"{n} ({p.dtype})" for n, p in trainable.items() if p.dtype != torch.float32]
    if other:
        raise MindpError(f"{listed(other, 3)}: the node keeps float32 master weights and the ranks hold their fp16 "
                         "values, so this would train in another precision than your optimizer: keep parameters "
                         "float32 (torch.autocast for lower-precision compute)")
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    foreign = len(held - {id(p) for p in module.parameters()})
    if foreign:
        raise MindpError(f"the optimizer holds {foreign} parameter(s) that are not the model's: mindp trains the "
                         "model given to init (give the optimizer its parameters)")
    missing = [n for n, p in trainable.items() if id(p) not in held]
    if missing:
        raise MindpError(f"{listed(missing, 3)}: require a gradient but the "
                         "optimizer does not hold them, and the node would train them: freeze them "
                         "(requires_grad_(False)) or give them to the optimizer")


def _init(module, optimizer, scheduler, topology, job, iface, state_dir, timeout: float, follow_lr: bool,
          find_unused: bool) -> Optimizer:
    if isinstance(module, torch.nn.parallel.DistributedDataParallel):
        raise MindpError("the model is wrapped in DistributedDataParallel, whose allreduce would overwrite the "
                         "gradients mindp sends: pass the module itself (mindp replaces DDP; docs/TORCH.md)")
    _check_params(module, optimizer)
    cfg = optimizer_config(optimizer, scheduler, module, follow_lr)
    if os.environ.get("MINDP_DESCRIBE"):
        describe(os.environ["MINDP_DESCRIBE"], module, cfg)
        sys.exit(0)
    try:
        rank = int(os.environ["RANK"])
        world = int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        raise MindpError("RANK/WORLD_SIZE not set: start the script with torchrun") from None
    topo_path = _env(topology, "MINDP_TOPOLOGY", "topology")
    try:
        topo = Topology.load(topo_path)
        job_id = int(_env(job, "MINDP_JOB", "job"))
        spec = next((j for j in topo.jobs if j.job_id == job_id), None)
        if spec is None:
            raise MindpError(f"job {job_id} is not in {topo_path} (jobs: {[j.job_id for j in topo.jobs]})")
        if world != spec.n_workers:
            raise MindpError(f"torchrun started {world} ranks, job {job_id} has {spec.n_workers} workers")
        state_dir = state_dir or os.environ.get("MINDP_STATE") or None
        start, first, node_cfg = _start(module, state_dir)
        if node_cfg is not None and node_cfg != cfg:
            raise MindpError(f"the node's state ({state_dir}) keeps the optimizer it was created with, and this "
                             f"script's differs: {node_cfg.differences(cfg)}: train on with the same optimizer and "
                             "schedule, or start a fresh state")
        wcfg = WorkerConfig.from_topology(topo, job_id, rank, first_step=first, rto=RtoConfig(deadline=timeout))
    except (TopologyError, ValueError) as exc:
        raise MindpError(str(exc)) from None
    with torch.no_grad():
        named = dict(trained(module))
        for n, a in start.items():  # the fp16 parameters the workers hold, as the reference does
            named[n].copy_(torch.from_numpy(a.astype(np.float16).astype(np.float32)))
    if _current:
        raise MindpError("init was already called in this process: a job trains one model with one optimizer "
                         "(close() the first one's optimizer before another init)")
    heap.keep_freed()  # each step's activations and gradients reused, not faulted in again (mindp/heap.py)
    rank_faults = faults(topo, spec.workers[rank])
    name = iface or os.environ.get("MINDP_IFACE") or iface_with(wcfg.ip)
    try:
        sock = rawsock.open_raw(name)
    except rawsock.SocketError as exc:
        raise MindpError(f"interface {name}: {exc}") from None
    agent = WorkerAgent(wcfg, layout_of(module), sock, rank_faults,
                        initial={n: a.astype(np.float16) for n, a in start.items()})
    agent.check_digests()  # each step checked against the optimizer node's digest (host_agent.digest)
    optimizer._opt_called = True  # its scheduler's step() need not warn: the node steps, not this optimizer
    _catch_up(scheduler, first)
    return Optimizer(module, agent, state_dir, job_id, rank, os.environ.get(METRICS_ENV) or None, optimizer, cfg,
                     find_unused)
