"""`make run SCRIPT=... TOPO=leafspine`: a user's script on a tree of switches.

The ranks run on the leaves' worker hosts, the job's optimizer node(s) on the spine: with
`OPTIMIZERS` > 1 a node per shard, each owning a contiguous chunk range of the script's model,
and every rank's MINDP_STATE names every shard's state directory. The tree is built once the
script's describe run gave its model (a sharded job's ranges follow its chunks); everything else
is the star's SCRIPT= run (mininet_topos.script_run) on the leaf-spine's network
(mininet_topos.leafspine).
"""
from __future__ import annotations

from .leafspine import TreeRun, tree_topology
from .own_torchrun import UpRun
from .star import Run
from .script_run import ScriptRun


class _OnTree:
    def __init__(self, *args, **kw):
        Run.__init__(self, *args, **kw)  # (not TreeRun's: its tree is the built-in model's)
        self.switches = []

    def script_topology(self, chunks: int):
        return tree_topology(self.cfg, chunks)


class TreeScriptRun(_OnTree, ScriptRun, TreeRun):
    """ScriptRun's files, ranks, training and report; TreeRun's network, controller and CLI."""


class TreeUpRun(_OnTree, UpRun, TreeRun):
    """UP=1 on a leaf-spine: the network, switches, controller and node(s) for the user's torchrun."""
