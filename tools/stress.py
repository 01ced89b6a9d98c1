"""make stress: bit-exact training scenarios, again and again, with random seeds, faults and
contention, until MINUTES are over; every divergence is kept with the one command that replays it.

    sudo python -m tools.stress --minutes 30 [--seed S] [--families loopback,embedded] [--out DIR]
    sudo python -m tools.stress --replay DIR/config.json [--load N]   # one scenario again

A scenario trains a small model with mindp-worker processes (synthetic gradients, resume files,
the step digest checked) and the mindp-optimizer node, in namespaces on veths, through
- `loopback`: the in-test aggregator (tests/host_agent/aggregator.py: exact sums, its own seeded
  loss, duplicates, reordering), or
- `threads`: the same aggregator with the workers as threads of the scenario's process, as the
  tests run them (tests/host_agent/harness.py: one GIL for all workers and the aggregator), or
- `embedded`: the embedded switch (its own loss, duplicates and reordering), or
- `bmv2`: BMv2's simple_switch_grpc at a K it runs and that has a committed program (32; skipped where it is not installed),
  each configured by a controller process (tools.stress_ctl); switch and controller may be killed,
or `makerun`: `make run` itself (mininet_topos.run under `flock /tmp/mindp-run.lock`: the mlp, the
cnn or a small gpt, 1 or 2 jobs, a star or a leaf-spine with 1 or 2 optimizer shards, LOSS, the
embedded switch or BMv2; or a torchrun example, SCRIPT=; per-port pcaps),
with the agents' own seeded loss (send and receive), the node's duplicates and reordering, small
socket buffers on the agents (tools.stress_sockbuf), busy loops beside it, SIGSTOP/SIGCONT or a 10 %
CPU quota of the node, a worker or the switch for up to seconds, and SIGKILL and restart of the
node or a worker (each resumes from its state), the switch (the controller restores it) or the
controller (a new one learns the job from the switch). At the end every
worker's parameters and the node's master must equal the reference trainer's bit for bit, and no
worker's step digest may have differed (a divergence the digest caught and repaired is one too).

Each scenario runs in its own process (`--replay`); one that diverges or fails keeps its directory
(config.json, the agents' logs and stats, a pcap per switch port, verdict.json) and the command
replaying it (beside as many busy loops as the loop's --load) is printed; one that cannot run here
(BMv2 or, for a torch model, PyTorch absent; make run's lock busy) is skipped with its reason. Timed
faults replay at the same moments, not the same packet order. The last line reads `<n> scenarios, <m>
divergences`. Exit 0 when there is none.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import time

from host_agent.agent_args import integer
from mindp import protocol
from mindp.harness import testbed
from tools.stress_config import BUSY_LOOP, FAMILIES, SCENARIO_CAP, Config, random_config

#: Families of the loop by default (makerun waits for the machine's one Mininet run at a time).
DEFAULT_FAMILIES = FAMILIES
#: Exit codes of one scenario.
EXACT, DIVERGED, FAILED, SKIPPED = 0, 1, 2, 75
REPO = pathlib.Path(__file__).resolve().parent.parent


def run_scenario(cfg: Config, work: pathlib.Path, in_loop: bool = False) -> dict:
    """One scenario's verdict (a dict, as verdict.json holds it); in_loop: the stress loop's (a
    makerun waits briefly for make run's lock)."""
    reason = cfg.skip_reason()
    if reason:
        return {"result": "skipped", "reason": reason}
    if cfg.family == "makerun":
        from tools.stress_makerun import LOCK_WAIT, LOOP_LOCK_WAIT, make_run

        return make_run(cfg, work, LOOP_LOCK_WAIT if in_loop else LOCK_WAIT)
    from tools.stress_scenario import Scenario

    return Scenario(cfg, work).run()


@contextlib.contextmanager
def busy_loops(n: int):
    """n busy loops beside what runs inside (the loop's --load, or a replay's)."""
    busy = [subprocess.Popen(BUSY_LOOP) for _ in range(n)]
    try:
        yield
    finally:
        for p in busy:
            p.terminate()
            p.wait()


def replay(cfg: Config, config: pathlib.Path, in_place: bool, load: int = 0) -> int:
    """cfg's scenario (read from config) in config's directory (in_place: the stress loop's fresh
    one), else in a new replay-<time> directory beside it, beside `load` busy loops (a failure the
    loop found under its --load replays under the same); at the configuration's K (this process
    again with MINDP_K set, as every module takes K at import)."""
    if cfg.family != "makerun" and cfg.k and cfg.k != protocol.K:
        os.execve(sys.executable, [sys.executable, "-m", "tools.stress", *sys.argv[1:]],
                  {**os.environ, protocol.K_ENV: str(cfg.k)})
    work = config.parent if in_place else config.parent / f"replay-{time.strftime('%Y%m%d-%H%M%S')}"
    work.mkdir(parents=True, exist_ok=True)
    with busy_loops(load):
        verdict = run_scenario(cfg, work, in_place)
    (work / "verdict.json").write_text(json.dumps(verdict, indent=1) + "\n")
    print(f"{cfg.family} seed {cfg.seed}: {verdict['result']}"
          + (f" ({', '.join(verdict['differs'])} differ; digest mismatches {verdict['digest_mismatches']})"
             if verdict["result"] == "diverged" else "")
          + (f" ({verdict['reason']})" if verdict["result"] == "skipped" else ""), flush=True)
    return {"exact": EXACT, "diverged": DIVERGED, "skipped": SKIPPED}.get(verdict["result"], FAILED)


# --- the loop --------------------------------------------------------------------------------

def stress(minutes: float, seed: int, families: list[str], out: pathlib.Path, load: int) -> int:
    rng = random.Random(seed)
    end = time.monotonic() + minutes * 60
    counts: dict[str, collections.Counter] = {f: collections.Counter() for f in families}
    skips: dict[str, collections.Counter] = {f: collections.Counter() for f in families}
    n = diverged = 0
    interrupted = False
    with busy_loops(load):
        while time.monotonic() < end:
            family = families[n % len(families)]
            cfg = random_config(rng, family)
            d = out / f"{n:04d}-{family}-{cfg.seed}"
            d.mkdir(parents=True)
            cfg.dump(d / "config.json")
            cmd = [sys.executable, "-m", "tools.stress", "--replay", str(d / "config.json"), "--in-place"]
            with open(d / "scenario.log", "wb") as log:
                child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
                try:
                    code = child.wait(timeout=SCENARIO_CAP + 120)
                except subprocess.TimeoutExpired:
                    code = FAILED
                except KeyboardInterrupt:  # the scenario had the terminal's Ctrl-C too: it cleans up
                    interrupted = True
                    child.wait()
                    shutil.rmtree(d)
                    break
                finally:  # also when this loop is stopped: the scenario cleans up on SIGTERM
                    if child.poll() is None:
                        child.terminate()
                        child.wait()
            n += 1
            result = {EXACT: "exact", DIVERGED: "diverged", SKIPPED: "skipped"}.get(code, "failed")
            counts[family][result] += 1
            if code == SKIPPED:
                skips[family][skip_reason(d)] += 1
            if code in (EXACT, SKIPPED):
                shutil.rmtree(d)
                continue
            diverged += code == DIVERGED
            print(f"{result.upper()}: {family} seed {cfg.seed}: {d}\n  replay: sudo .venv/bin/python -m tools.stress "
                  f"--replay {d / 'config.json'}" + (f" --load {load}" if load else ""), flush=True)
    for f, c in counts.items():
        print(f"{f}: {sum(c.values()) - c['skipped']} scenarios, {c['exact']} exact, {c['diverged']} diverged, "
              f"{c['failed']} failed" + (f" ({c['skipped']} skipped: " + "; ".join(
                  f"{count} {r}" for r, count in skips[f].items()) + ")" if c["skipped"] else ""))
    print(f"{n - sum(c['skipped'] for c in counts.values())} scenarios, {diverged} divergences"
          + (" (interrupted: the scenario under way is not counted)" if interrupted else ""), flush=True)
    with contextlib.suppress(OSError):  # no scenario kept: no empty directory left behind either
        out.rmdir()
    return 1 if diverged else 130 if interrupted else 0


def skip_reason(work: pathlib.Path) -> str:
    try:
        return json.loads((work / "verdict.json").read_text())["reason"]
    except (OSError, ValueError, KeyError):
        return "no reason recorded"


#: The loop's options and their defaults: argparse leaves them None when not given, so that a
#: replay can refuse one given (it would be ignored: the config holds the scenario and its seeds).
LOOP_DEFAULTS = {"minutes": 10.0, "seed": None, "families": ",".join(DEFAULT_FAMILIES), "out": None}


def refuse(why: str) -> int:
    print(f"stress: {why}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools.stress", description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, help="how long to keep starting scenarios (default 10)")
    p.add_argument("--seed", type=int, help="seed of the scenarios' configurations (default: random, printed)")
    p.add_argument("--families", help=f"comma-separated, of {', '.join(FAMILIES)} (default: all)")
    p.add_argument("--load", type=integer(0), default=0, help="busy loops beside the whole run, or a replay")
    p.add_argument("--out", help="where failing scenarios are kept (default runs/stress-<time>)")
    p.add_argument("--replay", metavar="CONFIG", help="run the one scenario of this config.json again")
    p.add_argument("--in-place", action="store_true", help=argparse.SUPPRESS)  # the loop's: in config's directory
    args = p.parse_args(argv)
    if args.in_place and not args.replay:
        return refuse("--in-place is the loop's own, with --replay")
    if args.replay:
        given = [f"--{name}" for name in LOOP_DEFAULTS if getattr(args, name) is not None]
        if given:
            return refuse(f"--replay runs one scenario: {'/'.join(given)} do not apply (only --load does)")
        config = pathlib.Path(args.replay)
        try:
            cfg = Config.load(config)
        except OSError as exc:
            return refuse(f"cannot read scenario config {config}: {exc.strerror or exc}")
        except ValueError as exc:  # ConfigError, or the JSON's own
            return refuse(f"cannot read scenario config {config}: {exc}")
    else:
        for name, default in LOOP_DEFAULTS.items():
            if getattr(args, name) is None:
                setattr(args, name, default)
        families = [f for f in args.families.split(",") if f]
        if not families or any(f not in FAMILIES for f in families):
            return refuse(f"--families: want some of {', '.join(FAMILIES)}, got {args.families!r}")
        if not args.minutes > 0:
            return refuse("--minutes must be > 0")
        out = pathlib.Path(args.out or f"runs/stress-{time.strftime('%Y%m%d-%H%M%S')}")
        if out.exists() and not out.is_dir():
            return refuse(f"--out {out} is not a directory")
        if out.is_dir() and any(out.iterdir()):
            return refuse(f"--out {out} is not empty: give a new directory (its scenarios would be mixed with this run's)")
    if os.geteuid() != 0:
        print("stress: must run as root (network namespaces)", file=sys.stderr)
        return 1
    # Names of its own: another stress run, replay or test run never shares a namespace or a veth
    # (the loop's scenarios, one at a time, inherit the loop's).
    os.environ.setdefault(testbed.TAG_ENV, testbed.claim_tag())
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # cleans up as Ctrl-C does
    if args.replay:
        return replay(cfg, config, args.in_place, args.load)
    try:
        out.mkdir(parents=True, exist_ok=True)  # here, not at the first failing scenario minutes later
    except OSError as exc:
        return refuse(f"cannot create --out {out}: {exc.strerror or exc}")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"tools.stress: {args.minutes:g} minutes of {', '.join(families)} scenarios, seed {seed}, "
          f"{args.load} busy loop(s); failing scenarios kept in {out}", flush=True)
    return stress(args.minutes, seed, families, out, args.load)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # a replay's scenario has cleaned up on the way out
        print("tools.stress: interrupted", file=sys.stderr)
        sys.exit(130)
