"""Checks and choices before `make run` starts anything: tools, target and free ports, the P4
program (committed or compiled), the run directory, and the state file an earlier run may hold."""
from __future__ import annotations

import datetime
import os
import pathlib
import shutil

from mindp import protocol, targets
from p4src import artifacts

from . import config
from .console import Console, RunError
from .runstate import RunState

TOOLS = {"mnexec": "mininet", "ip": "iproute2", "ethtool": "ethtool", "taskset": "util-linux"}  # taskset: PIN


def preflight(cfg: config.RunConfig) -> str:
    """Tools, target, free ports. Returns the resolved target."""
    for tool, package in TOOLS.items():
        if not shutil.which(tool):
            raise RunError(f"{tool} not found: install the Debian package {package} (make setup does)")
    try:
        target = targets.resolve(cfg.target, protocol.K)
    except targets.TargetError as exc:
        raise RunError(str(exc)) from None
    switches = cfg.leaves + 1 if cfg.topo == "leafspine" else 1  # each switch: the next gRPC and Thrift port
    for i in range(switches):
        if targets.grpc_port_open(f"127.0.0.1:{cfg.grpc_port + i}"):
            raise RunError(f"port {cfg.grpc_port + i} (gRPC) is already in use: another switch is running "
                           f"(make stop ends ours), or choose --grpc-port")
        if targets.grpc_port_open(f"127.0.0.1:{cfg.thrift_port + i}"):  # both targets serve Thrift
            raise RunError(f"port {cfg.thrift_port + i} (Thrift) is already in use: choose --thrift-port")
    return target


def target_reason(asked: str, target: str) -> str:
    """Why TARGET=auto chose `target`, for the run's first line ('' when TARGET named it)."""
    if asked != "auto":
        return ""
    if target == "bmv2":
        return f" (TARGET=auto: BMv2 is installed, {targets.find_bmv2()}; TARGET=embedded runs the embedded one)"
    if targets.find_bmv2():
        return f" (TARGET=auto: BMv2 is installed but runs K up to {protocol.BMV2_MAX_K})"
    return " (TARGET=auto: BMv2 is not installed)"


def p4_program(mode: str, run_dir: pathlib.Path, say=lambda line: None) -> tuple[pathlib.Path, pathlib.Path, str]:
    """(BMv2 JSON, P4Info, how it was obtained): the committed program while it matches the sources
    (what p4c would make of them: ~30 s of CPU saved a run), else compiled into the run by p4c
    (`say` tells it first: at a large K that takes minutes)."""
    p4c = artifacts.find_p4c()
    if mode == "compile" and not p4c:
        raise RunError("--p4 compile but p4c-bm2-ss is not installed (PATH or /opt/p4tools/bin)")
    current = artifacts.BMV2_JSON.exists() and artifacts.P4INFO.exists() and artifacts.staleness() is None
    if mode == "compile" or (mode == "auto" and p4c and not current):
        out = run_dir / "p4"
        out.mkdir()
        json_path, p4info = out / "mindp.json", out / "mindp.p4info.txtpb"
        say(f"  P4 program: compiling {artifacts.MAIN.name} for K = {protocol.K} with {p4c} (p4c's time grows "
            f"faster than K: minutes at K = 512; docs/P4.md)")
        try:
            artifacts.compile_program(p4c, artifacts.MAIN, json_path, p4info)
        except RuntimeError as exc:
            (out / "p4c.log").write_text(str(exc) + "\n")
            raise RunError(f"p4c failed to compile p4src/mindp.p4; see {out / 'p4c.log'}") from None
        return json_path, p4info, f"compiled with {p4c}"
    if not artifacts.BMV2_JSON.exists() or not artifacts.P4INFO.exists():
        ks = " or ".join(f"K={k}" for k in artifacts.COMMITTED_K)
        if p4c:  # (--p4 committed)
            raise RunError(f"{artifacts.staleness()}: run {ks}, or without --p4 committed (make run then compiles it)")
        raise RunError(f"{artifacts.staleness()}, and p4c is not installed to compile one: run {ks}, or "
                       f"{artifacts.P4C_HINT} (make run then compiles it)")
    why = artifacts.staleness()  # never run an older program than the sources say
    if why:
        fix = "run make p4, or drop --p4 committed" if p4c else f"{artifacts.P4C_HINT} (make run then compiles it)"
        raise RunError(f"{why}: the committed program is stale; {fix}, or undo the change (git diff p4src/)")
    return artifacts.BMV2_JSON, artifacts.P4INFO, "committed p4src/compiled/ (matches the sources)"


def new_run_dir(base: str) -> pathlib.Path:
    root = pathlib.Path(base)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    for n in range(100):
        d = root / (stamp if n == 0 else f"{stamp}-{n}")
        try:
            d.mkdir(parents=True)
            return d
        except FileExistsError:
            continue
    raise RunError(f"cannot make a run directory under {root}")


def claim_state(path: pathlib.Path, console: Console) -> RunState:
    """The state file of this run; refuses while an earlier run is alive, clears a crashed one."""
    old = RunState.load(path)
    if old is not None:
        live = old.live_procs()
        if live:
            pids = ", ".join(str(p.pid) for p in live[:5])
            raise RunError(f"a run is already active (PIDs {pids}; {old.run_dir or path}): make stop ends it")
        procs, ifaces = old.teardown()
        if ifaces:
            console.say(f"removed {len(ifaces)} interface(s) left by an earlier run that crashed")
    state = RunState(path)
    state.add_proc(os.getpid(), "orchestrator", False)
    return state
