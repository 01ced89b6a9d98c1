"""The settings of one `make run`, checked with one-line errors (pure, no I/O)."""
from __future__ import annotations

import json
import math
import pathlib
import shlex
from argparse import ArgumentTypeError
from dataclasses import asdict, dataclass, field, replace

from host_agent.agent_args import RAM_BUDGET, parse_size
from host_agent.state import SYNC_MODES
from mindp import INSTALL_TORCH
from mindp.protocol import MAX_WORKERS
from mindp.switch_constants import MAX_SHARDS, POOL_SLOTS
from mindp.targets import TARGETS
from mindp.workload import MODELS

from .placement import PIN_MODES

MAX_STEPS = 100_000
MAX_LOSS = 0.5  # beyond this a run spends its time retransmitting
CLI_MODES = ("auto", "0", "1")  # auto: the Mininet CLI when stdin and stdout are a terminal
LOG_LEVELS = ("off", "info", "debug", "trace")  # the switch's log level; debug and trace log every packet
# AdamW's learning rate when --lr is auto: at 0.01 the transformer's loss jumps back up after 3 steps.
DEFAULT_LR = {"mlp": 0.01, "cnn": 0.01, "gpt": 0.003}
# WORKERS and STEPS when auto (make's defaults): every parameter crosses the network every step, so
# the gpt's steps are slow (docs/RUN.md, Models) and it runs fewer.
DEFAULT_WORKERS = {"mlp": 4, "cnn": 4, "gpt": 2}
DEFAULT_STEPS = {"mlp": 60, "cnn": 60, "gpt": 6}
# EVAL=auto: worker 0 evaluates every N-th step. The gpt's evaluation costs a third of a worker's
# step at any size (81 ms against 234 at 1.3M parameters, 1.34 s against 3.78 at 25.5M): every step
# it took 23.5 % of a core and cut a run from 3.5 to 2.57 steps/s; every 10th costs about 3 %.
DEFAULT_EVAL = {"mlp": 1, "cnn": 1, "gpt": 10}
# --slots auto: a job's slots are each worker's window of chunks in flight. The embedded switch
# (8 MiB of socket buffer a port) takes half the pool, so that two jobs still fit: the gpt ran 0.19
# steps/s with 64, 0.33 with 512. BMv2 drops what its queues cannot hold: with 512 its gpt run
# retransmitted 45,771 times in 3 steps (160 with 64) at the same speed.
AUTO_SLOTS = {"embedded": POOL_SLOTS // 2, "bmv2": 64}
NODE_RAM_DEFAULT = RAM_BUDGET  # NODE_RAM: mindp-optimizer's own default


#: Variables (and flags make has no variable for) a SCRIPT= run does not use: the script brings its
#: own model, batches, optimizer and step count.
NOT_WITH_SCRIPT = ("MODEL", "STEPS", "GPT", "EVAL", "--hidden", "--batch", "--lr")
#: RunConfig's fields only the built-in trainer reads: a SCRIPT= run's config.json leaves them out.
#: ARGS set (even empty) where no SCRIPT takes them: refused, never ignored.
ARGS_WITHOUT_SCRIPT = "ARGS are the arguments of SCRIPT: give SCRIPT=path/to/train.py"
BUILTIN_ONLY = ("model", "steps", "hidden", "batch", "lr", "model_args", "eval_every")
#: Variables only a leaf-spine run uses.
ONLY_LEAFSPINE = ("LEAVES", "OPTIMIZERS")


class RunConfigError(ValueError):
    """A bad variable; the message names it (as the Makefile spells it) and says what is allowed."""


@dataclass(frozen=True)
class RunConfig:
    target: str = "auto"
    model: str = "mlp"
    workers: int = DEFAULT_WORKERS["mlp"]
    steps: int = DEFAULT_STEPS["mlp"]
    loss: float = 0.0
    jobs: int = 1
    seed: int = 0
    pcap: bool = False
    hidden: int = 64
    batch: int = 32
    lr: float = 0.01
    slots: int = 0  # 0: auto, made a number for the resolved target by on()
    grpc_port: int = 9559
    thrift_port: int = 9090
    cli: str = "auto"
    log: str = "off"
    topo: str = "star"  # star: one switch; leafspine: `leaves` leaf switches of `workers` each under a spine
    leaves: int = 1
    optimizers: int = 1  # optimizer nodes (shards) of the job, on the spine
    script: str = ""  # SCRIPT: a torchrun script using mindp.torch.init, run on every worker host
    script_args: str = ""  # ARGS: its arguments (one string, split as a shell would)
    model_args: dict = field(default_factory=dict)  # GPT: the gpt's size, e.g. {"d": 64, "layers": 2}
    eval_every: int = 1  # EVAL: worker 0 evaluates every N-th step (0: only before the first and after the last)
    # NODE_RAM: each optimizer node's RAM budget for its state (mindp-optimizer --ram-budget): a
    # state larger than half of it (two copies) is streamed from disk, out of core (docs/STATE.md).
    node_ram: int = parse_size(NODE_RAM_DEFAULT)
    # SYNC: when each node makes a committed step durable (mindp-optimizer --sync): step, at each
    # commit; exit, when it stops (a machine crash then loses the state; docs/STATE.md).
    sync: str = "step"
    # CHECK: after training, train the reference in make run's process and compare bits (about as
    # long as the training); False: the run's summary says it was not compared.
    check: bool = True
    # PIN: auto, 0 or 1: each worker, switch and node on a core, round-robin (placement.plan says
    # where auto pins).
    pin: str = "auto"

    @property
    def total_workers(self) -> int:
        """Workers per job: WORKERS on one switch, WORKERS per leaf in a leaf-spine."""
        return self.workers * (self.leaves if self.topo == "leafspine" else 1)

    def to_dict(self) -> dict:
        return asdict(self)

    def recorded(self) -> dict:
        """The settings a run's config.json keeps: a SCRIPT= run's without the built-in trainer's
        (its script brings its own model and steps; RESUME takes the defaults for them)."""
        return {k: v for k, v in asdict(self).items() if not (self.script and k in BUILTIN_ONLY)}

    def on(self, target: str) -> RunConfig:
        """This run on the resolved `target`: --slots auto made a number."""
        return self if self.slots else replace(self, slots=AUTO_SLOTS[target])


def _int(name: str, text: str, lo: int, hi: int) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise RunConfigError(f"{name} must be an integer in {lo}..{hi}, got {text!r}") from None
    if not lo <= value <= hi:
        raise RunConfigError(f"{name} must be an integer in {lo}..{hi}, got {value}")
    return value


def _float(name: str, text: str, lo: float, hi: float) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise RunConfigError(f"{name} must be a number in [{lo}, {hi}], got {text!r}") from None
    if not (math.isfinite(value) and lo <= value <= hi):
        raise RunConfigError(f"{name} must be a number in [{lo}, {hi}], got {text!r}")
    return value


def _auto(name: str, text: str, default: int, lo: int, hi: int) -> int:
    """auto: the model's `default`; else an integer in lo..hi."""
    return default if str(text).strip().lower() == "auto" else _int(name, text, lo, hi)


def _eval(text: str, model: str) -> int:
    try:
        return _auto("EVAL", text, DEFAULT_EVAL[model], 0, MAX_STEPS)
    except RunConfigError:
        raise RunConfigError(f"EVAL must be auto or an integer in 0..{MAX_STEPS}, got {text!r}") from None


def _model(text: str) -> str:
    name = str(text).strip().lower()
    if name not in MODELS:
        raise RunConfigError(f"MODEL must be one of {'|'.join(MODELS)}, got {text!r}")
    if name != "mlp":
        try:
            import torch  # noqa: F401  (the torch models need the optional extra)
        except ImportError:
            raise RunConfigError(f"MODEL={name} needs PyTorch, which is not installed: {INSTALL_TORCH}") from None
    return name


def parse(*, target: str = "auto", model: str = "mlp", workers: str = "auto", steps: str = "auto", loss: str = "0",
          jobs: str = "1", seed: str = "0", pcap: str = "0", hidden: str = "64", batch: str = "32", lr: str = "auto",
          slots: str = "auto", grpc_port: str = "9559", thrift_port: str = "9090", cli: str = "auto",
          log: str = "off", topo: str = "star", leaves: str = "1", optimizers: str = "1", script: str = "",
          script_args: str = "", gpt: str = "", eval_every: str = "auto", node_ram: str = NODE_RAM_DEFAULT,
          sync: str = "step", check: str = "1", pin: str = "auto", given: str = "") -> RunConfig:
    """Strings as given on the command line (make variables) -> a checked RunConfig. `given`: the
    make variables set on make's command line or in the environment (not defaults), and flags make
    has no variable for (--hidden ...), space-separated (mininet_topos.run.given_names): one the run
    would not use is refused rather than silently ignored."""
    target = str(target).strip()
    if target not in TARGETS:
        raise RunConfigError(f"TARGET must be one of {'|'.join(TARGETS)}, got {target!r}")
    pcap_text = str(pcap).strip()
    if pcap_text not in ("0", "1"):
        raise RunConfigError(f"PCAP must be 0 or 1, got {pcap!r}")
    jobs_n = _int("JOBS", jobs, 1, 2)
    model_name = _model(model)
    cli_text, log_text = str(cli).strip(), str(log).strip().lower()
    if cli_text not in CLI_MODES:
        raise RunConfigError(f"CLI must be 0, 1 or auto, got {cli!r}")
    if log_text not in LOG_LEVELS:
        raise RunConfigError(f"LOG must be one of {'|'.join(LOG_LEVELS)}, got {log!r}")
    if str(check).strip() not in ("0", "1"):
        raise RunConfigError(f"CHECK must be 0 or 1, got {check!r}")
    if str(pin).strip() not in PIN_MODES:
        raise RunConfigError(f"PIN must be auto, 0 or 1, got {pin!r}")
    cfg = RunConfig(
        target=target,
        model=model_name,
        workers=_auto("WORKERS", workers, DEFAULT_WORKERS[model_name], 1, MAX_WORKERS),
        steps=_auto("STEPS", steps, DEFAULT_STEPS[model_name], 1, MAX_STEPS),
        loss=_float("LOSS", loss, 0.0, MAX_LOSS),
        jobs=jobs_n,
        seed=_int("SEED", seed, 0, 2**31 - 1),
        pcap=pcap_text == "1",
        hidden=_int("--hidden", hidden, 1, 4096),
        batch=_int("--batch", batch, 1, 1024),
        lr=DEFAULT_LR[model_name] if str(lr).strip() == "auto" else _float("--lr", lr, 1e-9, 10.0),
        slots=0 if str(slots).strip() == "auto" else _int("--slots", slots, 1, POOL_SLOTS // jobs_n),
        grpc_port=_int("--grpc-port", grpc_port, 1, 65535),
        thrift_port=_int("--thrift-port", thrift_port, 1, 65535),
        cli=cli_text,
        log=log_text,
        **_tree(topo, leaves, optimizers),
        **_script(script, script_args),
        model_args={} if str(script).strip() else gpt_sizes(gpt, model_name),  # SCRIPT: GPT refused by _unused
        eval_every=_eval(eval_every, model_name),
        node_ram=_size("NODE_RAM", node_ram),
        sync=_sync(sync),
        check=str(check).strip() == "1",
        pin=str(pin).strip(),
    )
    _unused(cfg, str(given or "").split())
    if cfg.script and cfg.jobs != 1:
        raise RunConfigError("SCRIPT runs one job: JOBS must be 1")
    if cfg.topo == "leafspine":
        if cfg.jobs != 1:
            raise RunConfigError("TOPO=leafspine runs one job: JOBS must be 1")
        if cfg.total_workers > MAX_WORKERS:
            raise RunConfigError(f"LEAVES x WORKERS must be at most {MAX_WORKERS} (worker ids), "
                                 f"got {cfg.leaves} x {cfg.workers}")
    check_ports(cfg)
    return cfg


def check_ports(cfg: RunConfig) -> None:
    """The switches' gRPC and Thrift ports: each switch of a tree takes the next of each, so the two
    runs of ports must not meet (a resumed run checks again: its ports are this command's)."""
    switches = cfg.leaves + 1 if cfg.topo == "leafspine" else 1
    if switches > 1 and (abs(cfg.grpc_port - cfg.thrift_port) < switches
                         or max(cfg.grpc_port, cfg.thrift_port) + switches > 65536):
        raise RunConfigError(f"--grpc-port and --thrift-port need {switches} free ports each, apart")
    if cfg.grpc_port == cfg.thrift_port:
        raise RunConfigError("--grpc-port and --thrift-port must differ")


def _sync(text: str) -> str:
    mode = str(text).strip()
    if mode not in SYNC_MODES:
        raise RunConfigError(f"SYNC must be one of {'|'.join(SYNC_MODES)}, got {text!r}")
    return mode


def _size(name: str, text: str) -> int:
    try:
        return parse_size(str(text))
    except ArgumentTypeError as exc:
        raise RunConfigError(f"{name}: {exc}") from None


TOPOS = ("star", "leafspine")
GPT_LIMITS = {"d": 4096, "layers": 64, "heads": 64, "ctx": 4096}  # what GPT may set (the vocabulary is bytes)


def gpt_sizes(text: str, model: str) -> dict:
    """GPT: a JSON object giving some of the gpt's d, layers, heads, ctx (the rest keep their
    defaults); only with MODEL=gpt."""
    text = str(text or "").strip()
    if not text:
        return {}
    if model != "gpt":
        raise RunConfigError(f"GPT sizes MODEL=gpt, not MODEL={model}")
    what = 'GPT must be a JSON object of positive integers d, layers, heads, ctx, e.g. \'{"d": 64, "layers": 2}\''
    try:
        args = json.loads(text)
    except ValueError:
        raise RunConfigError(f"{what}, got {text!r}") from None
    if not isinstance(args, dict) or not all(
            k in GPT_LIMITS and type(v) is int and 1 <= v <= GPT_LIMITS[k] for k, v in args.items()):
        raise RunConfigError(f"{what} (at most {GPT_LIMITS}), got {text!r}")
    from mindp.torch.models import GptSpec  # PyTorch is there: MODEL=gpt was checked

    spec = GptSpec(**args)
    if spec.d % spec.heads:
        raise RunConfigError(f"GPT: d ({spec.d}) must be a multiple of heads ({spec.heads})")
    return args


def _tree(topo: str, leaves: str, optimizers: str) -> dict:
    """TOPO, LEAVES, OPTIMIZERS: LEAVES and OPTIMIZERS only mean something in a leaf-spine."""
    topo = str(topo).strip()
    if topo not in TOPOS:
        raise RunConfigError(f"TOPO must be one of {'|'.join(TOPOS)}, got {topo!r}")
    out = {"topo": topo, "leaves": _int("LEAVES", leaves, 1, MAX_WORKERS),
           "optimizers": _int("OPTIMIZERS", optimizers, 1, MAX_SHARDS)}
    if topo == "star" and (out["leaves"], out["optimizers"]) != (1, 1):
        raise RunConfigError("LEAVES and OPTIMIZERS need TOPO=leafspine")
    return out


def _unused(cfg: RunConfig, given: list[str]) -> None:
    """Refuse a variable set explicitly that this run would ignore."""
    if not cfg.script and "ARGS" in given:  # even empty: ARGS= names a script's arguments
        raise RunConfigError(ARGS_WITHOUT_SCRIPT)
    if cfg.script:
        unused = [v for v in NOT_WITH_SCRIPT if v in given]
        if unused:
            raise RunConfigError(f"{', '.join(unused)} {'is' if len(unused) == 1 else 'are'} not used with SCRIPT= "
                                 "(the script builds its own model, batches and optimizer and runs its own steps): "
                                 f"leave {'it' if len(unused) == 1 else 'them'} out and give the script's own "
                                 "arguments in ARGS, e.g. ARGS='--steps 20'")
    if cfg.script and not cfg.loss and "SEED" in given:
        raise RunConfigError("SEED is not used with SCRIPT= and LOSS=0: it seeds only the loss injected on the "
                             "node's and the ranks' paths; the script seeds its own model and data")
    if cfg.model != "mlp" and "--hidden" in given:
        raise RunConfigError(f"--hidden sizes MODEL=mlp, not MODEL={cfg.model}")
    if cfg.topo != "leafspine":
        unused = [v for v in ONLY_LEAFSPINE if v in given]
        if unused:
            raise RunConfigError(f"{' and '.join(unused)} need{'s' if len(unused) == 1 else ''} TOPO=leafspine")


def _script(script: str, args: str) -> dict:
    """SCRIPT and ARGS: an existing Python file (PyTorch needed), its arguments as shell words."""
    script = str(script or "").strip()
    if not script:
        if str(args or "").strip():
            raise RunConfigError(ARGS_WITHOUT_SCRIPT)
        return {}
    if not pathlib.Path(script).is_file():
        raise RunConfigError(f"SCRIPT {script!r} is not a file")
    try:
        shlex.split(str(args or ""))
    except ValueError as exc:
        raise RunConfigError(f"ARGS cannot be split into words: {exc}") from None
    _model("cnn")  # PyTorch present
    return {"script": str(pathlib.Path(script).resolve()), "script_args": str(args or "")}
