"""A mindp worker started by torchrun: the rank is the worker id, mindp replaces allreduce
and the optimizer (no process group is created; torchrun's c10d rendezvous only starts the
processes and hands out ranks, over TCP on the hosts' own network).

    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 2 --rdzv-backend c10d \\
        --rdzv-endpoint host0:29400 -m mindp.torch.launch -- \\
        --iface eth0 --topology topo.json --job 1 --workload workload.json --init init.npz \\
        --steps 60 --out 'final-{rank}.npz'

Every other argument is mininet_topos.trainer's; `{rank}` in --out is replaced. On one machine
whose worker hosts are network namespaces, `--netns-prefix P` runs rank r inside namespace
P + (the topology's host of worker r); `--host-pids FILE` (JSON host -> PID, as `make run` writes
for its Mininet hosts) runs it in the namespaces of that host's process (mnexec -a). `--script FILE` runs a user's script (mindp.torch.init)
instead of the built-in trainer, with the remaining arguments; its topology and job then come
from MINDP_TOPOLOGY and MINDP_JOB (docs/TORCH.md).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from mindp.topology import Topology, TopologyError

from .runscript import GLOO_ADDR_ENV


#: Where rank 0 serves the store of a script's own torch.distributed process group (its host's port).
GROUP_PORT = 29500
#: make run's PIN: the cores of ranks 0, 1, ... ('0,1,0,1'); each rank runs on its own, threads and children too.
PIN_CPUS_ENV = "MINDP_PIN_CPUS"
#: make run's LOSS and SEED for the ranks (mindp.torch.init): each drops that share of its frames on
#: send and on receive, seeded per host as every agent of the run is, so retransmission is at work.
LOSS_ENV, SEED_ENV = "MINDP_LOSS", "MINDP_SEED"


def group_env(master_ip: str, own_ip: str) -> dict[str, str]:
    """The environment a script's torch.distributed.init_process_group needs in a worker host: the
    store on rank 0's host (torchrun's agent store is on the root namespace's loopback, which a host
    does not reach), served by rank 0 itself, over the hosts' own links."""
    return {"MASTER_ADDR": master_ip, "MASTER_PORT": str(GROUP_PORT), "TORCHELASTIC_USE_AGENT_STORE": "False",
            GLOO_ADDR_ENV: own_ip}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mindp.torch.launch", description="mindp worker under torchrun")
    p.add_argument("--netns-prefix", help="run rank r in namespace PREFIX + the host of worker r")
    p.add_argument("--host-pids", help="JSON {host: pid}: run rank r in the namespaces of its host's process")
    p.add_argument("--script", help="a torchrun script using mindp.torch.init, run with the other arguments")
    args, rest = p.parse_known_args(argv)
    rest = [a for a in rest if a != "--"]
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        print("mindp.torch.launch: RANK/WORLD_SIZE not set: start it with torchrun", file=sys.stderr)
        return 2
    rest = [a.replace("{rank}", str(rank)) for a in rest]
    if os.environ.get(PIN_CPUS_ENV):
        try:
            os.sched_setaffinity(0, {int(os.environ[PIN_CPUS_ENV].split(",")[rank])})
        except (ValueError, IndexError, OSError) as exc:
            print(f"mindp.torch.launch: {PIN_CPUS_ENV}={os.environ[PIN_CPUS_ENV]!r} gives rank {rank} no core: {exc}",
                  file=sys.stderr)
            return 2
    if args.script:
        cmd = [sys.executable, "-m", "mindp.torch.runscript", args.script, *rest]  # records why it failed
        where = (os.environ.get("MINDP_TOPOLOGY", ""), os.environ.get("MINDP_JOB", ""))
    else:
        if "--worker" in rest:
            print("mindp.torch.launch: the worker id is the torchrun rank; do not give --worker", file=sys.stderr)
            return 2
        rest += ["--worker", str(rank)] + (["--eval-every", "1"] if rank == 0 and "--eval-every" not in rest else [])
        cmd = [sys.executable, "-m", "mininet_topos.trainer", *rest]
        where = tuple(rest[rest.index(flag) + 1] if flag in rest and rest.index(flag) + 1 < len(rest) else ""
                      for flag in ("--topology", "--job"))
    if args.netns_prefix or args.host_pids:
        try:
            topo = Topology.load(where[0])
            job = int(where[1])
            workers = next(j for j in topo.jobs if j.job_id == job).workers
            host = workers[rank]
        except (ValueError, IndexError, StopIteration, KeyError, OSError, TopologyError) as exc:
            print(f"mindp.torch.launch: cannot find worker {rank} of the job ({world} ranks): {exc}", file=sys.stderr)
            return 2
        if args.host_pids:
            try:
                pid = int(json.loads(open(args.host_pids).read())[host])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                print(f"mindp.torch.launch: no PID of host {host} in {args.host_pids}: {exc}", file=sys.stderr)
                return 2
            cmd = ["mnexec", "-a", str(pid), *cmd]
        else:
            cmd = ["ip", "netns", "exec", args.netns_prefix + host, *cmd]
        if args.script:
            os.environ.update(group_env(topo.hosts[workers[0]].ip, topo.hosts[host].ip))
    sys.stdout.flush()
    os.execvp(cmd[0], cmd)  # the same PID, so torchrun watches the worker itself
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
