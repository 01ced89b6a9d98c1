"""A mindp worker started by torchrun: the rank is the worker id, mindp replaces allreduce
and the optimizer (no process group is created; torchrun's c10d rendezvous only starts the
processes and hands out ranks, over TCP on the hosts' own network).

    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 2 --rdzv-backend c10d \\
        --rdzv-endpoint host0:29400 -m mindp.torch.launch -- \\
        --iface eth0 --topology topo.json --job 1 --workload workload.json --init init.npz \\
        --steps 60 --out 'final-{rank}.npz'

Every other argument is mininet_topos.trainer's; `{rank}` in --out is replaced. On one machine
whose worker hosts are network namespaces, `--netns-prefix P` runs rank r inside namespace
P + (the topology's host of worker r).
"""
from __future__ import annotations

import argparse
import os
import sys

from mindp.topology import Topology, TopologyError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mindp.torch.launch", description="mindp worker under torchrun")
    p.add_argument("--netns-prefix", help="run rank r in namespace PREFIX + the host of worker r")
    args, rest = p.parse_known_args(argv)
    rest = [a for a in rest if a != "--"]
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        print("mindp.torch.launch: RANK/WORLD_SIZE not set: start it with torchrun", file=sys.stderr)
        return 2
    if "--worker" in rest:
        print("mindp.torch.launch: the worker id is the torchrun rank; do not give --worker", file=sys.stderr)
        return 2
    rest = [a.replace("{rank}", str(rank)) for a in rest] + ["--worker", str(rank)]
    if rank == 0 and "--eval" not in rest:
        rest.append("--eval")
    cmd = [sys.executable, "-m", "mininet_topos.trainer", *rest]
    if args.netns_prefix:
        try:
            topo = Topology.load(rest[rest.index("--topology") + 1])
            job = int(rest[rest.index("--job") + 1])
            host = next(j for j in topo.jobs if j.job_id == job).workers[rank]
        except (ValueError, IndexError, StopIteration, KeyError, TopologyError) as exc:
            print(f"mindp.torch.launch: cannot find worker {rank} of the job ({world} ranks): {exc}", file=sys.stderr)
            return 2
        cmd = ["ip", "netns", "exec", args.netns_prefix + host, *cmd]
    sys.stdout.flush()
    os.execvp(cmd[0], cmd)  # the same PID, so torchrun watches the worker itself
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
