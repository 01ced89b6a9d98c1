"""`make run`: Mininet + P4 switch + controller + optimizer node + workers train a model.

    python -m mininet_topos.run --target auto --model mlp --workers 4 --steps 60 --loss 0 --jobs 1 --seed 0

Everything the run starts is recorded in build/run-state.json before the next
thing starts, so `python -m mininet_topos.stop` (make stop) can remove it after
a crash. Each run writes runs/<timestamp>/: summary.json, curve.svg,
topology.json, logs/ (every process), pcaps/ (PCAP=1), and per job the
workload, initial parameters and final parameters. This module reads the
settings and starts the run they ask for: mininet_topos.star's on one switch,
leafspine's on a tree, script_run's for SCRIPT=. The agent processes are
started and watched by mininet_topos.agents; what the run prints (and keeps in
logs/run.log) goes through mininet_topos.console.
"""
from __future__ import annotations

import os

# Bits must agree with the reference trainer: one BLAS thread everywhere (before numpy loads).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import contextlib  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

from mindp import interrupts, protocol, targets  # noqa: E402

from . import clean, config, resume  # noqa: E402
from .console import Console, RunError, Stopped, one_line  # noqa: E402
from .leafspine import TreeRun  # noqa: E402
from .own_torchrun import UpRun  # noqa: E402
from .preflight import claim_state, new_run_dir, p4_program, preflight, target_reason  # noqa: E402
from .runstate import DEFAULT_PATH  # noqa: E402
from .script_run import ScriptRun  # noqa: E402
from .star import Run  # noqa: E402
from .tree_script import TreeScriptRun, TreeUpRun  # noqa: E402


#: Seconds the end of a run (a stopped run's record, the teardown) may take before every thread's
#: stack goes to its run.log: it ignores a second Ctrl-C, so a hang there must say where it is.
STUCK_STACKS = 60.0


def _stopped(signum: int) -> Stopped:
    return Stopped(signal.Signals(signum).name)


#: What each stop signal raises in the main thread (at a point where raising leaves no lock held).
STOP_SIGNALS = {signal.SIGINT: interrupts.keyboard_interrupt, signal.SIGTERM: _stopped, signal.SIGHUP: _stopped}


def if_prefix(text: str) -> str:
    if not re.fullmatch(r"[a-z][a-z0-9-]{0,5}", text):
        raise argparse.ArgumentTypeError("1..6 characters: a lowercase letter, then letters, digits or '-'")
    return text


P_DEFAULTS = f"{protocol.HARDWARE_K} on BMv2, {protocol.DEFAULT_K} on the embedded switch"


def _by_model(defaults: dict) -> str:
    return ", ".join(f"{m} {n}" for m, n in defaults.items())


#: Flags no make variable carries, named as flags where refused (`--hidden sizes MODEL=mlp ...`).
FLAG_ONLY = ("hidden", "batch", "lr", "slots")
#: Flags for where and how this process runs, never a run's setting that could go unused.
PLUMBING = ("grpc_port", "thrift_port", "p4", "runs_dir", "state_file", "if_prefix", "given")


def given_names(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """The settings this command sets, each by its make variable (TARGET ...), or its flag where make
    has none (--hidden ...), for config.parse and resume to refuse one the run would not use. make
    passes every variable's flag, defaults too, and names those given in --given; run directly, a
    flag sets what differs from its default."""
    ours = [f"--{d}" for d in FLAG_ONLY if getattr(args, d) != parser.get_default(d)]
    if args.given is not None:
        return args.given.split() + ours
    return [d.upper() for d, v in vars(args).items()
            if d not in PLUMBING + FLAG_ONLY and v != parser.get_default(d)] + ours


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mininet_topos.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="auto", help="auto|bmv2|embedded|embedded-python (auto: BMv2 when installed)")
    p.add_argument("--k", default="", help=f"elements a frame (default: {P_DEFAULTS})")
    p.add_argument("--model", default="mlp", help="mlp|cnn|gpt (cnn, gpt: PyTorch, the torch extra)")
    p.add_argument("--workers", default="auto", help=f"workers per job (auto: {_by_model(config.DEFAULT_WORKERS)})")
    p.add_argument("--steps", default="auto", help=f"training steps (auto: {_by_model(config.DEFAULT_STEPS)})")
    p.add_argument("--loss", default="0", help="loss rate injected on every host's send and receive paths "
                   "(with --script the ranks' too: mindp.torch reads MINDP_LOSS and MINDP_SEED)")
    p.add_argument("--jobs", default="1", help="1, or 2 jobs sharing the switch")
    p.add_argument("--seed", default="0")
    p.add_argument("--pcap", default="0", help="1: per-port pcaps in runs/<ts>/pcaps/")
    p.add_argument("--hidden", default="64", help="MLP hidden units")
    p.add_argument("--batch", default="32", help="examples per worker and step")
    p.add_argument("--lr", default="auto", help="AdamW learning rate (auto: 0.01, gpt 0.003)")
    p.add_argument("--slots", default="auto", help="aggregation slots per job, its window of chunks in flight "
                   "(auto: 512 on the embedded switch, half its pool; 64 on BMv2)")
    p.add_argument("--grpc-port", default="9559")
    p.add_argument("--thrift-port", default="9090", help="the switch's Thrift runtime port (simple_switch_CLI)")
    p.add_argument("--p4", choices=("auto", "compile", "committed"), default="auto",
                   help="auto: p4src/compiled/ while it matches p4src/, else compile with p4c")
    p.add_argument("--runs-dir", default="runs")
    p.add_argument("--state-file", default=str(DEFAULT_PATH))
    p.add_argument("--cli", default="auto",
                   help="1: the Mininet CLI after training; 0: never; auto: when stdin and stdout are a terminal")
    p.add_argument("--log", default="off", help="switch log level off|info|debug|trace (debug, trace: every packet)")
    p.add_argument("--topo", default="star", help="star: one switch; leafspine: LEAVES leaves under a spine")
    p.add_argument("--leaves", default="1", help="leafspine: leaf switches, each with --workers workers")
    p.add_argument("--optimizers", default="1", help="leafspine: optimizer nodes (shards) on the spine")
    p.add_argument("--script", default="", help="a torchrun script using mindp.torch.init (docs/TORCH.md)")
    p.add_argument("--args", default="", help="the script's arguments, one string (--args='--steps=3')")
    p.add_argument("--resume", default="", help="continue this earlier run (a directory or a name under runs/)")
    p.add_argument("--up", nargs="?", const="1", default="0",
                   help="1 (or no value), with --script: start no ranks; print a torchrun command per host")
    p.add_argument("--given", help="make variables set explicitly (refused where this run ignores them); without "
                   "it, each flag that differs from its default")
    p.add_argument("--eval", default="auto", help="worker 0 evaluates the model every N-th step (0: only before the "
                   "first and after the last; auto: by model, " + _by_model(config.DEFAULT_EVAL) + ")")
    p.add_argument("--gpt", default="", help='MODEL=gpt: its size as JSON, e.g. \'{"d": 64, "layers": 2}\'')
    p.add_argument("--node-ram", default=config.NODE_RAM_DEFAULT, help="each optimizer node's RAM budget for its state (64M, 2G, ...; "
                   "a state over half of it runs out of core)")
    p.add_argument("--sync", default="step", help="when each optimizer node makes a committed step durable: "
                   "step (at each commit) or exit (when it stops; docs/STATE.md)")
    p.add_argument("--check", default="1", help="1: compare the run's bits with the reference trained in this "
                   "process after training (about as long again); 0: do not (its summary says so)")
    p.add_argument("--pin", default="auto", help="1: worker N on core N, then each switch and node on the next "
                   "cores; 0: the kernel places them; auto: 1 where each worker has a core but the switch and node do not")
    p.add_argument("--if-prefix", default="mnr-", type=if_prefix,
                   help="prefix of the switch-side interface names (<prefix>p<port>)")
    return p


def execute(cfg: config.RunConfig, args, console: Console, resumed: resume.Resumed | None = None) -> int:
    t_start = time.monotonic()
    if os.geteuid() != 0:
        raise RunError("must run as root (Mininet needs network namespaces): sudo make run")
    state = claim_state(pathlib.Path(args.state_file), console)  # first: a live run explains a busy port
    run = run_dir = None
    refused = False  # a setting refused before the network came up: nothing of the run is kept
    try:
        target = preflight(cfg)
        cfg = cfg.on(target)
        run_dir = new_run_dir(args.runs_dir)
        clean.point_latest(run_dir.parent, run_dir)
        state.run_dir = str(run_dir)
        state.save()
        if cfg.script and cfg.topo == "leafspine":
            run = (TreeUpRun if up(args) else TreeScriptRun)(cfg, target, run_dir, state, args.p4, console,
                                                             args.if_prefix)
            shape = f"{cfg.leaves} leaves x {cfg.workers} torchrun ranks, {cfg.optimizers} optimizer node(s)"
        elif cfg.script:
            run = (UpRun if up(args) else ScriptRun)(cfg, target, run_dir, state, args.p4, console, args.if_prefix)
            shape = f"{cfg.workers} torchrun ranks"
        elif cfg.topo == "leafspine":
            run = TreeRun(cfg, target, run_dir, state, args.p4, console, args.if_prefix)
            shape = f"{cfg.leaves} leaves x {cfg.workers} workers, {cfg.optimizers} optimizer node(s)"
        else:
            run = Run(cfg, target, run_dir, state, args.p4, console, args.if_prefix)
            shape = f"{cfg.workers} workers"
        run.resumed = resumed
        jobs = f"{cfg.jobs} jobs" if cfg.jobs > 1 else "1 job"
        steps = "" if cfg.script else f"{cfg.steps} steps, "  # a script's steps are its own
        # a script's SEED seeds only the loss: without loss, none to name
        loss = f"loss {cfg.loss:g}, seed {cfg.seed}" if cfg.loss or not cfg.script else "loss 0"
        console.say(f"mindp run {run_dir}: {cfg.script or cfg.model} on the {target} switch"
            f"{target_reason(cfg.target, target)}, {jobs} x {shape}, {steps}{loss}"
            f"{'; node state made durable at exit (SYNC=exit)' if cfg.sync == 'exit' else ''}")
        json_path, p4info, how = p4_program(args.p4, run_dir, console.say)
        console.say(f"  P4 program: {how}; K = {protocol.K} elements a frame, link MTU {protocol.link_mtu()}")
        try:
            run.prepare_files()
        except config.RunConfigError as exc:  # the header above named the run: say it is gone
            refused = True
            raise config.RunConfigError(f"{exc} (nothing of {run_dir} is kept)") from None
        if resumed:
            console.say(f"  resuming {resumed.run} after its node's commit: from step {run.first_step()}")
        model = run.model_text()
        console.say(f"  model: {model}")
        run.start_network(json_path)
        console.say(f"  Mininet up: {run.network_text()}, {len(run.topo.hosts)} hosts")
        run.configure(json_path, p4info)
        console.say(f"  controller: pipeline pushed, forwarding and {jobs} installed")
        run.start_agents()
        workers = "" if up(args) else f" and {cfg.jobs * cfg.total_workers} workers"
        console.say(f"  optimizer node(s){workers} started; logs in {run.logs}/")
        if run.placement:
            console.say(f"  pinned (PIN={cfg.pin}): {run.placement.describe()}")
        setup = time.monotonic() - t_start
        code = train_and_report(run, console, model, setup)
        if cfg.cli == "1" or (cfg.cli == "auto" and sys.stdin.isatty() and sys.stdout.isatty()):
            run.cli(p4info)
        return code
    finally:
        interrupts.ignore(signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # a second Ctrl-C must not cut the cleanup short
        console.stacks_after(STUCK_STACKS)
        if run is not None:
            run.close()
        state.teardown()
        console.stacks_cancelled()
        if refused:
            clean.withdraw(run_dir)


def train_and_report(run: Run, console: Console, model: str, setup: float) -> int:
    """Train, then report (the check against the reference included). A stop in either keeps what
    the run's steps showed (during the check: saying its bits were not compared) and goes on up."""
    trained = False
    try:
        progress, wall = run.train()
        trained = True
        return run.report(progress, wall, setup, model)
    except (KeyboardInterrupt, Stopped) as exc:
        console.stacks_after(STUCK_STACKS)
        with contextlib.suppress(Exception):  # what is kept must not hide why the run ended
            run.keep_partial(model, str(exc) or "interrupted", checking=trained)
        raise


def run_k(k: str, target: str, old: resume.Resumed | None = None, given: tuple[str, ...] = ()) -> int:
    """The run's K: K= if given, else a resumed run's own (its state's chunks are K elements), else
    MINDP_K where the environment sets it, else the target's default (BMv2 interprets every element
    of a frame, so it runs the hardware-faithful size; the embedded switch runs the large default)."""
    if old is not None and not k and "k" in old.cfg:
        n = int(old.cfg["k"])
        target = target if "TARGET" in given else str(old.cfg.get("target", target))
        if _resolved(target) == "bmv2" and not protocol.bmv2_fits(n):
            raise config.RunConfigError(f"RESUME: {old.run.name} trained at K = {n}, which BMv2 cannot run (K up to "
                                        f"{protocol.BMV2_MAX_K}): TARGET=embedded")
        return n
    k = k or os.environ.get(protocol.K_ENV, "").strip()
    if k:
        k = k.strip()
        if (error := protocol.k_error(k)) is not None:
            raise config.RunConfigError(f"K={k}: {error}")
        n = int(k)
        if target == "bmv2" and not protocol.bmv2_fits(n):
            raise config.RunConfigError(f"K={n}: BMv2 runs K up to {protocol.BMV2_MAX_K} (it lets a packet grow "
                                        f"by {protocol.BMV2_HEADROOM} bytes; a GRAD becomes a SUM 6 bytes an element "
                                        "longer): TARGET=embedded runs any K")
        return n
    return protocol.HARDWARE_K if _resolved(target) == "bmv2" else protocol.DEFAULT_K


def _resolved(target: str) -> str:
    try:
        return targets.resolve(target)
    except targets.TargetError:
        return target  # config.parse names the problem


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    given = given_names(args, parser)
    try:  # an earlier run is found before this run's directory moves runs/latest
        old = resume.find(args.resume, pathlib.Path(args.runs_dir)) if args.resume else None
        k = run_k(args.k, args.target, old, tuple(given))
    except config.RunConfigError as exc:
        Console().fail(str(exc))
        return 2
    if k != protocol.K and (argv is None or args.k or old is not None):
        # Every module of this process and of the processes it starts takes K from MINDP_K at import.
        if argv is not None:
            raise RuntimeError(f"main(argv) runs at this process's K = {protocol.K}, not {k}: set MINDP_K")
        os.execve(sys.executable, [sys.executable, "-m", "mininet_topos.run", *sys.argv[1:]],
                  {**os.environ, protocol.K_ENV: str(k)})
    console = Console()
    try:
        with interrupts.deferred(STOP_SIGNALS):
            return _main(args, given, console, old)
    except (KeyboardInterrupt, Stopped) as exc:
        return _stopped_exit(console, exc)


def _stopped_exit(console: Console, exc: BaseException) -> int:
    console.fail(f"stopped ({str(exc) or 'interrupted'}); everything it started is cleaned up")
    return 130


def up(args: argparse.Namespace) -> bool:
    """UP: 1 (`--up` alone too) brings up a SCRIPT= run's network for your own torchrun; 0 does not."""
    if args.up.strip() not in ("0", "1"):
        raise config.RunConfigError(f"UP must be 0 or 1, got {args.up!r}")
    return args.up.strip() == "1"


def settings(args: argparse.Namespace, given: list[str], old: resume.Resumed | None) -> config.RunConfig:
    """The run's settings from this command's flags, `given` those it sets (given_names), and the
    run it resumes; config.RunConfigError names what is refused."""
    if old is not None:
        resume.check_given(old, given)
    cfg = config.parse(target=args.target, model=args.model, workers=args.workers, steps=args.steps,
                       loss=args.loss, jobs=args.jobs, seed=args.seed, pcap=args.pcap, hidden=args.hidden,
                       batch=args.batch, lr=args.lr, slots=args.slots, grpc_port=args.grpc_port,
                       thrift_port=args.thrift_port, cli=args.cli, log=args.log, topo=args.topo,
                       leaves=args.leaves, optimizers=args.optimizers,
                       script=args.script or (old.cfg.get("script", "") if old is not None else ""),
                       script_args=args.args, gpt=args.gpt, eval_every=args.eval, node_ram=args.node_ram,
                       sync=args.sync, check=args.check, pin=args.pin, given=" ".join(given))
    if up(args) and not cfg.script:
        raise config.RunConfigError("UP=1 brings up a SCRIPT= run's network for your own torchrun: give SCRIPT=")
    return cfg if old is None else resume.settings(old, cfg, given)


def _main(args: argparse.Namespace, given: list[str], console: Console, old: resume.Resumed | None) -> int:
    try:
        return execute(settings(args, given, old), args, console, old)
    except (config.RunConfigError, RunError) as exc:
        console.fail(str(exc))
        return 2 if isinstance(exc, config.RunConfigError) else 1
    except (KeyboardInterrupt, Stopped) as exc:
        return _stopped_exit(console, exc)
    except Exception as exc:  # a bug: cleaned up already (finally); the traceback goes to a file, not the screen
        log = pathlib.Path(args.state_file).parent / "make-run-error.log"
        with contextlib.suppress(OSError):
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(traceback.format_exc())
        console.fail(f"internal error {type(exc).__name__}: {one_line(str(exc))}; traceback in {log}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
