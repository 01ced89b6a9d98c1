"""The controller of a make stress scenario's switch, as a process of its own so that a fault can
SIGKILL it (its P4Runtime stream dies with it) and start another:

    python -m tools.stress_ctl --grpc-addr 127.0.0.1:PORT --topology topo.json [--reconcile]

Without --reconcile it gives the switch the pipeline, the forwarding and the topology's first job;
with it, it learns them from the switch, as a controller started after a killed one does. It then
prints `ready` and serves its standard input, a command a line: `restore` (the switch was
restarted: a new session, and back what it lost) answers `restored: <what was done>`. It ends at
the end of its input; an error is one line `error: ...` and exit 1.
"""
from __future__ import annotations

import argparse
import sys

READY = "ready"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools.stress_ctl", description=__doc__.splitlines()[0])
    p.add_argument("--grpc-addr", required=True)
    p.add_argument("--topology", required=True)
    p.add_argument("--reconcile", action="store_true", help="learn the job from the switch; write nothing")
    args = p.parse_args(argv)
    from controller.controller import Controller
    from mindp import interrupts
    from mindp.topology import Topology

    topo = Topology.load(args.topology)
    try:
        with interrupts.deferred(interrupts.CTRL_C):  # the scenario's Ctrl-C reaches it too
            return _serve(Controller(args.grpc_addr, topology=topo), topo, args.reconcile)
    except Exception as exc:  # the scenario fails on this line (its log keeps it)
        print(f"error: {type(exc).__name__}: {exc}", flush=True)
        return 1


def _serve(ctl, topo, reconcile: bool) -> int:
    """Configure the switch (or learn its configuration), say `ready`, then serve stdin's commands."""
    if reconcile:
        got = ctl.reconcile()
        if sorted(got.jobs) != [j.job_id for j in topo.jobs]:
            raise RuntimeError(f"learned jobs {sorted(got.jobs)} from the switch, not the topology's")
    else:
        ctl.push()
        ctl.install_forwarding()
        ctl.create_job(topo.jobs[0])
    print(READY, flush=True)
    for line in sys.stdin:
        if line.strip() == "restore":
            ctl.reconnect()
            print("restored: " + ("; ".join(ctl.restore()) or "nothing"), flush=True)
    ctl.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
