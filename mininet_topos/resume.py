"""`make run RESUME=<run>`: continue an earlier run from its optimizer nodes' committed state.

The new run takes the earlier run's settings (its config.json; those of MAY_CHANGE below keep their
value too unless given: STEPS may be raised to train on) and, per job, a copy of its node state (the
earlier run stays as it was). Each node resumes after its last commit; the workers start at the step
after it from the parameters the node committed (the fp16 values they held then), so the run ends on
the same bits as one that was never interrupted: the comparison with the reference trainer (from the
earlier run's initial parameters, over all steps) says so. A SCRIPT= run resumes the same way: its
ranks take the node's step (opt.step_number) and weights from MINDP_STATE; its ARGS may change (its
reference replays each step with the arguments it ran with), as may UP.

A leaf-spine job's shards commit each on its own: one may be a step ahead of another (never more:
no worker sends step s + 1 before every shard committed s). The workers start after the earliest
commit, with the ahead shard's chunks from the copy its last step read (host_agent.state.read_state);
that shard answers the step it committed already by resending its parameters, as after a lost answer.
"""
from __future__ import annotations

import json
import pathlib
import shutil
from dataclasses import dataclass, fields, replace

import numpy as np

from host_agent import optim, state
from host_agent.optim import ConfigError, OptimizerConfig
from mindp.layout import Layout

from .agents import STATE
from .config import RunConfig, RunConfigError, check_ports

#: What may differ from the resumed run (none of them changes a bit of the training): variable ->
#: its RunConfig field (None: none), which keeps the earlier run's value unless the variable is given,
#: so a resumed run goes on as it was configured (LOSS=0.02 CHECK=0 stay so).
MAY_CHANGE = {"TARGET": "target", "LOSS": "loss", "PCAP": "pcap", "LOG": "log", "CLI": "cli", "STEPS": "steps",
              "NODE_RAM": "node_ram", "SYNC": "sync", "CHECK": "check", "PIN": "pin", "RESUME": None}
#: A SCRIPT= run's: its steps are its script's own, so ARGS may change (to train on, say) and STEPS
#: does not apply. A model or optimizer the new arguments change is refused (check_script), and the
#: reference replays each step with the arguments it ran with (script_run.args_from). UP=1 or not:
#: the ranks are the script's either way, started by make run or by your torchrun.
SCRIPT_MAY_CHANGE = {**{v: f for v, f in MAY_CHANGE.items() if v != "STEPS"}, "ARGS": "script_args", "UP": None}


def state_dirs(job_dir: pathlib.Path) -> list[pathlib.Path]:
    """The job's node state directories: STATE, or one per shard."""
    return sorted(d for d in job_dir.glob(STATE + "*") if d.is_dir())


@dataclass(frozen=True)
class Resumed:
    run: pathlib.Path  # the earlier run's directory
    cfg: dict  # its config.json


def find(name: str, runs_dir: pathlib.Path) -> Resumed:
    """The earlier run named by RESUME (a directory, or a name under runs/, `latest` included),
    refused in one line when it cannot be continued."""
    d = next((p for p in (pathlib.Path(name), runs_dir / name) if p.is_dir()), None)
    if d is None:
        raise RunConfigError(f"RESUME={name}: no such run (a run directory, or a name under {runs_dir}/)")
    d = d.resolve()
    try:
        cfg = json.loads((d / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise RunConfigError(f"RESUME={name}: {d} has no readable config.json ({exc})") from None
    nodes = int(cfg.get("optimizers", 1))
    for j in range(1, int(cfg.get("jobs", 1)) + 1):
        dirs = [p for p in state_dirs(d / f"job{j}") if state.exists(p)]
        if len(dirs) != nodes:
            raise RunConfigError(f"RESUME={name}: {d / f'job{j}'} holds the committed state of {len(dirs)} of its "
                                 f"{nodes} optimizer node(s) ({STATE}*)")
    return Resumed(d, cfg)


def check_given(old: Resumed, given: list[str]) -> None:
    """Refuse, in one line, a variable of this command that may not change on RESUME."""
    script = bool(old.cfg.get("script"))
    if script and "STEPS" in given:
        raise RunConfigError(f"RESUME: {old.run.name} is a SCRIPT= run, whose steps are its script's own: STEPS "
                             "does not apply (give the script's arguments in ARGS, e.g. ARGS='--steps 40')")
    may = SCRIPT_MAY_CHANGE if script else MAY_CHANGE
    fixed = [v for v in given if v not in may]
    if fixed:
        raise RunConfigError(f"RESUME continues {old.run.name} with its own settings: {', '.join(fixed)} cannot "
                             f"change (only {', '.join(v for v in may if v != 'RESUME')})")


def settings(old: Resumed, now: RunConfig, given: list[str]) -> RunConfig:
    """The resumed run's settings: the earlier run's, with each variable given that may change taken
    from this command; the switch's ports are this command's (they are free now, not then)."""
    check_given(old, given)
    known = {f.name for f in fields(RunConfig)}
    base = RunConfig(**{k: v for k, v in old.cfg.items() if k in known})
    may = SCRIPT_MAY_CHANGE if base.script else MAY_CHANGE
    cfg = replace(base, **{f: getattr(now, f) for v, f in may.items() if f and v in given},
                  grpc_port=now.grpc_port, thrift_port=now.thrift_port,
                  slots=base.slots if "TARGET" not in given else 0)  # 0: auto, for the new target
    if cfg.steps < base.steps:
        raise RunConfigError(f"RESUME: STEPS={cfg.steps} is fewer than the run's own {base.steps}")
    check_ports(cfg)
    return cfg


def check_script(old: Resumed, job: int, cfg: OptimizerConfig, layout: Layout) -> None:
    """Refuse, before the network comes up, a SCRIPT= run whose script now describes another model or
    optimizer than the earlier run trained with (the file was edited): its node would refuse the state."""
    for d in state_dirs(old.run / f"job{job}"):
        try:
            meta = state.read_meta(d)
            held, model = OptimizerConfig.from_dict(meta["optimizer"]), optim.layout_from_json(meta["layout"])
        except (ConfigError, KeyError, TypeError, ValueError) as exc:
            raise RunConfigError(f"RESUME: {exc}") from None
        if optim.layout_to_json(model) != optim.layout_to_json(layout):  # the node's test of its model
            raise RunConfigError(f"RESUME: the script's model is not the one {old.run.name} trained (its parameters' "
                                 "names or shapes differ): resume with the script as it was, or start a run "
                                 "without RESUME=")
        if held != cfg:
            raise RunConfigError(f"RESUME: the script's optimizer is not the one {old.run.name} trained with: "
                                 f"{held.differences(cfg)} (resume with the same optimizer and schedule, or start "
                                 "a run without RESUME=)")


def take_state(old: Resumed, job: int, job_dir: pathlib.Path) -> tuple[int, dict[str, np.ndarray]]:
    """Copy the job's node state (every shard's) into the new run; returns (first step to train, the
    committed parameters the workers start from)."""
    src = old.run / f"job{job}"
    for d in state_dirs(src):
        shutil.copytree(d, job_dir / d.name)
    for name in ("init.npz", "workload.json"):  # the reference trains from the same start
        if (src / name).exists():
            shutil.copy2(src / name, job_dir / name)
    try:
        commit, _, layout, records = state.read_committed(state_dirs(job_dir))
    except ConfigError as exc:
        raise RunConfigError(f"RESUME: {exc}") from None
    step = int(commit["step"])
    flat = np.array(records[:, state.MASTER, :].reshape(-1))
    params = {s.name: flat[layout.offsets[s.name]:][: s.size].reshape(s.shape).copy() for s in layout.specs}
    return step + 1, params
