"""`make stop`: end what the last `make run` started and remove what it made.

Reads build/run-state.json (see mininet_topos.runstate): asks a live run to
stop and clean up by itself, then ends any listed process still alive and
deletes any listed interface still present. Only what is listed is touched
(by PID with its start time, and by interface name): no `mn -c`, no kill by
name. Safe to run twice and after a crash.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import signal
import sys

from mindp import progress

from .runstate import DEFAULT_PATH, RunState

ORCHESTRATOR = "orchestrator"


def stop(path: pathlib.Path, wait: float = 20.0) -> str:
    """Stop the run recorded at `path`; returns one line saying what was done. A live run is given
    the time it takes to tear down by itself, as long as it uses CPU (a slow machine is no reason
    to cut it short), or until `wait` s pass with nothing done."""
    state = RunState.load(path)
    if state is None:
        return "nothing to stop"
    asked = False
    for p in state.procs:
        if p.name == ORCHESTRATOR and p.alive():
            p.signal(signal.SIGTERM)  # it tears its run down and removes the state file
            asked = True
            # Progress: any CPU of its tree (not only above an idle share: its teardown waits on
            # gRPC and the kernel with little CPU), or what it has left to end.
            left = lambda: (len(state.live_procs()), len(state.existing_interfaces()))  # noqa: E731
            try:
                progress.wait(lambda: not p.alive(), progress.both(progress.activity(p.pid, share=0.0), left),
                              stall=wait, poll=0.1, what="the run tearing down")
            except progress.Stalled:
                pass  # ended below, with whatever it left
    left = RunState.load(path)
    procs, ifaces = left.teardown() if left is not None else ([], [])
    parts = []
    if asked:
        parts.append("asked the running make run to stop")
    parts.append(f"ended {len(procs)} process(es), removed {len(ifaces)} interface(s)")
    where = f" ({state.run_dir})" if state.run_dir else ""
    return "; ".join(parts) + where


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mininet_topos.stop", description=__doc__.split("\n\n")[0])
    p.add_argument("--state-file", default=str(DEFAULT_PATH))
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("make stop: must run as root (the run's processes and interfaces are root's)", file=sys.stderr)
        return 1
    print(f"make stop: {stop(pathlib.Path(args.state_file))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
