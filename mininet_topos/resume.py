"""`make run RESUME=<run>`: continue an earlier run from its optimizer nodes' committed state.

The new run takes the earlier run's settings (its config.json; STEPS may be raised to train on,
TARGET, LOSS, PCAP, LOG and CLI may change) and, per job, a copy of its node state (the earlier run
stays as it was). Each node resumes after its last commit; the workers start at the step after it
from the parameters the node committed (the fp16 values they held then), so the run ends on the
same bits as one that was never interrupted: the comparison with the reference trainer (from the
earlier run's initial parameters, over all steps) says so. A SCRIPT= run resumes the same way: its
ranks take the node's step (opt.step_number) and weights from MINDP_STATE.
"""
from __future__ import annotations

import json
import pathlib
import shutil
from dataclasses import dataclass, fields, replace

import numpy as np

from host_agent import state
from host_agent.optim import ConfigError

from .config import RunConfig, RunConfigError

#: What may differ from the resumed run: none of them changes a bit of the training.
MAY_CHANGE = ("TARGET", "LOSS", "PCAP", "LOG", "CLI", "STEPS", "RESUME")
#: A node's state directory in a job directory (one node per job: sharded jobs are not resumed).
STATE = "optimizer-state"


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
    if cfg.get("topo", "star") != "star":
        raise RunConfigError(f"RESUME={name}: a leaf-spine run (sharded node state) cannot be resumed")
    for j in range(1, int(cfg.get("jobs", 1)) + 1):
        if not state.exists(d / f"job{j}" / STATE):
            raise RunConfigError(f"RESUME={name}: {d / f'job{j}' / STATE} holds no committed state")
    return Resumed(d, cfg)


def settings(old: Resumed, now: RunConfig, given: list[str]) -> RunConfig:
    """The resumed run's settings: the earlier run's, with what may change taken from this command."""
    fixed = [v for v in given if v not in MAY_CHANGE]
    if fixed:
        raise RunConfigError(f"RESUME continues {old.run.name} with its own settings: {', '.join(fixed)} cannot "
                             f"change (only {', '.join(MAY_CHANGE[:-1])})")
    known = {f.name for f in fields(RunConfig)}
    base = RunConfig(**{k: v for k, v in old.cfg.items() if k in known})
    steps = now.steps if "STEPS" in given else base.steps
    if steps < base.steps:
        raise RunConfigError(f"RESUME: STEPS={steps} is fewer than the run's own {base.steps}")
    return replace(base, target=now.target if "TARGET" in given else base.target, loss=now.loss, pcap=now.pcap,
                   log=now.log, cli=now.cli, steps=steps, grpc_port=now.grpc_port, thrift_port=now.thrift_port,
                   slots=base.slots if "TARGET" not in given else 0)


def take_state(old: Resumed, job: int, job_dir: pathlib.Path) -> tuple[int, dict[str, np.ndarray]]:
    """Copy the job's node state into the new run; returns (first step to train, the committed
    parameters the workers start from)."""
    src, dst = old.run / f"job{job}" / STATE, job_dir / STATE
    shutil.copytree(src, dst)
    for name in ("init.npz", "workload.json"):  # the reference trains from the same start
        if (old.run / f"job{job}" / name).exists():
            shutil.copy2(old.run / f"job{job}" / name, job_dir / name)
    try:
        commit, _, layout, records = state.read_committed(dst)
    except ConfigError as exc:
        raise RunConfigError(f"RESUME: {exc}") from None
    flat = np.array(records[:, state.MASTER, :].reshape(-1)[: layout.total])
    params = {s.name: flat[layout.offsets[s.name]:][: s.size].reshape(s.shape) for s in layout.specs}
    return int(commit["step"]) + 1, params
