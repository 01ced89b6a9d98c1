"""make stress's scenario configurations: what config.json holds (replayed as it is) and how the
loop draws one at random. Pure logic: no process, no network."""
from __future__ import annotations

import importlib.util
import json
import pathlib
import random
import sys
from dataclasses import MISSING, asdict, dataclass, field, fields

from mindp import INSTALL_TORCH, protocol
from p4src import artifacts

#: A busy loop taking a core; the terminal's Ctrl-C ends it quietly (no traceback of its own).
BUSY_LOOP = [sys.executable, "-c", "import signal\nsignal.signal(signal.SIGINT, signal.SIG_DFL)\nwhile True: pass"]

FAMILIES = ("loopback", "threads", "embedded", "bmv2", "makerun")
#: Families on a switch (the embedded one or BMv2) configured by a controller process of their own.
SWITCH_FAMILIES = ("embedded", "bmv2")
#: The K a bmv2 scenario draws from: those BMv2 runs (up to protocol.BMV2_MAX_K, 80) with a
#: committed compiled program (p4src/compiled/k<K>/: the controller pushes it; no p4c call mid-run).
BMV2_KS = tuple(k for k in artifacts.COMMITTED_K if protocol.bmv2_fits(k))
#: make run's torchrun examples a makerun scenario may run (SCRIPT=), with their arguments' sizes.
SCRIPTS = ("examples/train_cnn.py", "examples/train_gpt.py")
#: A gpt small enough for a busy 2-core machine (MODEL=gpt's GPT=, train_gpt.py's --gpt).
SMALL_GPT = '{"d": 16, "layers": 1, "heads": 2, "ctx": 8}'
#: Socket buffers a scenario's agents may be given (bytes asked; the kernel doubles them): a few frames.
SOCKBUFS = (32 << 10, 64 << 10, 256 << 10)
#: A scenario that takes longer than this (seconds) is stopped and counted as failed.
SCENARIO_CAP = 900


def torch_installed() -> bool:
    """Whether PyTorch imports here (make run's cnn, gpt and scripts need it; setup may leave it out)."""
    return importlib.util.find_spec("torch") is not None


class ConfigError(ValueError):
    """A config.json that is not one dump() writes; the message says what is wrong."""


@dataclass
class Event:
    """At `at` seconds after the workers started: `action` ("stop": SIGSTOP, SIGCONT after `hold`
    s; "starve": a CPU quota of 10 % for `hold` s; "kill": SIGKILL, restarted after `hold` s) on
    `target` ("node", "worker<w>", "switch", "controller": kill only)."""

    at: float
    action: str
    target: str
    hold: float


@dataclass
class Config:
    family: str
    seed: int
    workers: int = 3
    steps: int = 5
    slots: int = 8
    agent_loss: float = 0.0  # each agent's loss on send and receive
    node_dup: float = 0.0
    node_reorder: float = 0.0
    fabric_drop: float = 0.0  # the aggregator's or the embedded switch's (BMv2 injects none)
    fabric_dup: float = 0.0
    fabric_reorder: float = 0.0
    busy_loops: int = 0
    stall_resend: float = 1.0
    streamed: bool = False  # the node's state streamed through a small RAM budget (pages), not mapped whole
    model: str = "mlp"  # makerun: MODEL, JOBS, TOPO (leafspine: 2 leaves), OPTIMIZERS
    jobs: int = 1
    topo: str = "star"
    optimizers: int = 1
    events: list[Event] = field(default_factory=list)
    k: int = 0  # elements a frame (MINDP_K of the scenario's processes); 0: the stress process's own
    sockbuf: int = 0  # bytes of SO_RCVBUF/SO_SNDBUF on the agents' raw sockets, receive ring off; 0: their own
    target: str = "embedded"  # makerun: TARGET
    script: str = ""  # makerun: SCRIPT= (a torchrun example) instead of MODEL
    gpt: str = ""  # makerun: the gpt's size (GPT=, or the gpt script's --gpt)

    @classmethod
    def load(cls, path: pathlib.Path) -> Config:
        """config.json as dump() wrote it (an older one lacks later keys: their defaults); OSError
        or ValueError (ConfigError, json's) naming what is wrong, before the scenario starts anything."""
        d = checked(cls, json.loads(path.read_text()), "")
        if d["family"] not in FAMILIES:
            raise ConfigError(f"unknown family {d['family']!r} (families: {', '.join(FAMILIES)})")
        events = d.get("events", [])
        if not isinstance(events, list):
            raise ConfigError("events: want a list")
        d["events"] = [Event(**checked(Event, e, f"event {i}: ")) for i, e in enumerate(events)]
        return cls(**d)

    def dump(self, path: pathlib.Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")

    def skip_reason(self) -> str | None:
        """Why this scenario cannot run on this machine (None: it can)."""
        from mindp import targets

        if self.family == "bmv2" or (self.family == "makerun" and self.target == "bmv2"):
            if not targets.find_bmv2():
                return "BMv2 (simple_switch_grpc) is not installed"
            k = self.k or protocol.K
            if not protocol.bmv2_fits(k):
                return f"BMv2 runs K up to {protocol.BMV2_MAX_K}, not {k}"
        if self.family == "makerun" and self.model != "mlp" and not torch_installed():
            return f"PyTorch is not installed ({'SCRIPT=' if self.script else 'MODEL=' + self.model} needs it: {INSTALL_TORCH})"
        k = self.k or protocol.K
        if self.family in SWITCH_FAMILIES and not artifacts.program(k).exists():
            return f"no compiled program for K = {k} (p4src/compiled/k{k}/: make p4 K={k})"
        return None


#: The JSON types of the fields' annotations (an int stands for a float: a hand-written 0).
JSON_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,)}


def checked(cls, d, where: str) -> dict:
    """d, a JSON object of cls's fields: no unknown key, every field without a default there,
    each of its annotation's type (a mistyped value would fail only mid-scenario)."""
    if not isinstance(d, dict):
        raise ConfigError(f"{where}want a JSON object, got {type(d).__name__}")
    kinds = {f.name: f.type for f in fields(cls)}
    unknown = sorted(set(d) - set(kinds))
    if unknown:
        raise ConfigError(f"{where}unknown key {unknown[0]!r}")
    missing = [f.name for f in fields(cls) if f.name not in d and f.default is MISSING
               and f.default_factory is MISSING]
    if missing:
        raise ConfigError(f"{where}no {missing[0]!r}")
    for name, value in d.items():
        want = JSON_TYPES.get(kinds[name])
        if want and (not isinstance(value, want) or isinstance(value, bool) and bool not in want):
            raise ConfigError(f"{where}{name}: want {kinds[name]}, got {value!r}")
    return d


def random_config(rng: random.Random, family: str) -> Config:
    """A scenario: sizes, loss rates (none half the time: the divergence of issue 44 had none),
    contention, small socket buffers and timed faults."""
    def rate(most: float) -> float:
        return round(rng.choice([0.0, 0.0, rng.uniform(0, most)]), 3)

    cfg = Config(family, rng.randrange(1 << 30), workers=rng.randint(2, 4), steps=rng.randint(3, 8),
                 slots=rng.choice([4, 8, 64]), agent_loss=rate(0.05), node_dup=rate(0.05), node_reorder=rate(0.05),
                 fabric_drop=rate(0.05), fabric_dup=rate(0.05), fabric_reorder=rate(0.05),
                 busy_loops=rng.choice([0, 0, 1, 2]), stall_resend=rng.choice([0.2, 0.5, 1.0]),
                 streamed=rng.random() < 0.3, sockbuf=rng.choice([0, 0, 0, *SOCKBUFS]))
    if family == "bmv2":  # BMv2 runs a small K and injects no faults of its own
        cfg.k = rng.choice(BMV2_KS)
        cfg.fabric_drop = cfg.fabric_dup = cfg.fabric_reorder = 0.0
    targets = ["node"] + ([f"worker{w}" for w in range(cfg.workers)] if family != "threads" else []) \
        + (["switch", "controller"] if family in SWITCH_FAMILIES else [])
    for _ in range(rng.choice([0, 0, 1, 2, 3])):
        target = rng.choice(targets)
        action = "kill" if target == "controller" else rng.choice(["stop", "stop", "starve", "kill"])
        cfg.events.append(Event(round(rng.uniform(0.2, 4.0), 2), action, target,
                                round(rng.uniform(0.05, 0.5 if action == "kill" else 2.5), 2)))
    cfg.events.sort(key=lambda e: e.at)
    if family == "makerun":
        makerun_config(rng, cfg)
    return cfg


def makerun_config(rng: random.Random, cfg: Config) -> None:
    """make run's own faults (LOSS on every host; no timed events, no socket sizes): the mlp, the
    cnn or a small gpt, 1-2 jobs, a star or a leaf-spine with 1-2 shards, on the embedded switch or
    (the mlp at a K it runs) BMv2; one in five a torchrun example (SCRIPT=, 2 ranks, a few steps; on a
    star, or one rank on each of two leaves with 1-2 shards)."""
    cfg.events, cfg.streamed, cfg.sockbuf = [], False, 0
    cfg.fabric_drop = cfg.fabric_dup = cfg.fabric_reorder = cfg.node_dup = cfg.node_reorder = 0.0
    if rng.random() < 0.2:
        cfg.script = rng.choice(SCRIPTS)
        cfg.gpt = SMALL_GPT if cfg.script.endswith("gpt.py") else ""
        cfg.model, cfg.topo, cfg.jobs = "script", rng.choice(["star", "leafspine"]), 1
        cfg.optimizers = rng.choice([1, 2]) if cfg.topo == "leafspine" else 1
        cfg.workers, cfg.steps = 2 if cfg.topo == "star" else 1, rng.randint(2, 4)  # (workers: a leaf's)
        return
    cfg.model, cfg.topo = rng.choice(["mlp", "mlp", "cnn", "gpt"]), rng.choice(["star", "leafspine"])
    cfg.gpt = SMALL_GPT if cfg.model == "gpt" else ""
    # a leaf-spine runs one job, with 1 or 2 optimizer shards; a star 1 or 2 jobs, one node each
    cfg.jobs = 1 if cfg.topo == "leafspine" else rng.choice([1, 2])
    cfg.optimizers = rng.choice([1, 2]) if cfg.topo == "leafspine" else 1
    cfg.steps = rng.randint(4, 12)
    if cfg.model == "mlp" and rng.random() < 0.3:
        cfg.target, cfg.k = "bmv2", protocol.HARDWARE_K
