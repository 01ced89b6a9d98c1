"""`make run SCRIPT=`'s describe run: the script as rank 0, alone and without a network, up to
mindp.torch.init, which writes the optimizer spec and the initial parameters and exits.

    MINDP_DESCRIBE=DIR RANK=0 WORLD_SIZE=N python -m mindp.torch.describe script.py ARGS...

A DDP script ported to mindp often keeps its torch.distributed process group (gloo) for its own
metrics or barriers. Alone, its init_process_group would wait for peers that never come, so here
the calls a script makes before init are inert: the group is "initialised", rank and world size are
RANK's and WORLD_SIZE's, and barrier/broadcast do nothing (rank 0's own values are the broadcast's).
Any other collective before init fails as without a group, in the describe run's one line. The ranks
themselves (mindp.torch.runscript under torchrun) have the real group, over the Mininet links."""
from __future__ import annotations

import os
import sys

from .runscript import run_script


def make_distributed_inert() -> None:
    import torch.distributed as dist

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    state = {"initialised": False}

    def init_process_group(*_args, **_kw) -> None:
        state["initialised"] = True

    def nothing(*_args, **_kw) -> None:
        return None

    dist.init_process_group = init_process_group
    dist.is_initialized = lambda: state["initialised"]
    dist.get_rank = lambda group=None: rank
    dist.get_world_size = lambda group=None: world
    dist.barrier = dist.broadcast = dist.destroy_process_group = nothing


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m mindp.torch.describe SCRIPT [ARGS...]")
    make_distributed_inert()
    run_script(sys.argv[1], sys.argv[2:])  # (no torchrun: no error file to write)


if __name__ == "__main__":
    main()
