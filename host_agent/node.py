"""The optimizer node's command line, `mindp-optimizer` (`python -m host_agent.node`): its
options, the job, shard and state they give, then `OptimizerNode` (node_socket) running a
`NodeCore` (node_core) until the steps are done.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import signal
import sys
import time

from mindp.protocol import MAX_WORKERS
from mindp.switch_constants import MAX_JOB_ID
from mindp.topology import Topology, TopologyError

from . import agent_args, digest, fused, optim, probe, rawsock, shards, state
from .agent_args import RAM_BUDGET, finite, parse_size
from .node_core import NodeCore
from .node_socket import COALESCE_MIN, RX_USECS, NodeAddress, OptimizerNode
from .optim import ConfigError, OptimizerConfig
from .pager import PagerError, StorageError
from .window import RtoConfig

#: How the node's first line begins: its state is open and its sockets are bound, so a worker
#: started after it finds the digest port (make run and the harnesses wait for it).
UP_LINE = "mindp-optimizer: job"

#: Default linger: twice the workers' largest RTO plus a second, so that a worker whose last
#: parameters were lost retransmits (and is answered) before the node exits.
LINGER = 2 * RtoConfig.max + 1.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mindp-optimizer", description="mindp optimizer node (out-of-core AdamW/SGD)")
    p.add_argument("--iface", default="eth0", help="interface facing the switch")
    p.add_argument("--topology", help="topology JSON (mindp.topology); gives the job's workers, slots and our addresses")
    p.add_argument("--job", type=int, default=1, help=f"job id (0..{MAX_JOB_ID})")
    p.add_argument("--workers", type=int,
                   help=f"the job's worker count, 1..{MAX_WORKERS} (without --topology): only reported, as the "
                        "count of every sum is its mean's divisor (--max-workers bounds it)")
    p.add_argument("--slots", type=int, help="the job's slot count (without --topology)")
    p.add_argument("--max-workers", type=int, default=MAX_WORKERS,
                   help="largest worker count a sum may carry (the job's membership may change between steps)")
    p.add_argument("--mac", help="our MAC (without --topology)")
    p.add_argument("--ip", help="our IPv4 address (without --topology)")
    p.add_argument("--shard", type=int, help="with --topology: which of the job's optimizer shards this node is (0..M-1)")
    p.add_argument("--chunks", help="without --topology: the chunk range LO:HI (inclusive) this shard owns")
    p.add_argument("--peers", help="without --topology: the other shards' IPv4 addresses, comma-separated")
    p.add_argument("--state-dir", required=True, help="directory of the out-of-core state (resumed if present)")
    p.add_argument("--ram-budget", type=parse_size, default=parse_size(RAM_BUDGET), help="resident state budget")
    p.add_argument("--sync", choices=state.SYNC_MODES, default="step",
                   help="when a committed step is made durable: step, at each commit (msync and fsync; survives "
                        "a machine crash); exit, when the node stops (a killed node loses nothing, a machine crash "
                        "the whole state, which is then refused)")
    p.add_argument("--page-chunks", type=int, default=state.DEFAULT_PAGE_CHUNKS, help="chunks per page")
    agent_args.add_model_args(p)
    p.add_argument("--optimizer", choices=optim.KINDS, default="adamw")
    p.add_argument("--lr", type=finite, default=1e-3)
    p.add_argument("--weight-decay", type=finite, default=0.01)
    p.add_argument("--momentum", type=finite, default=0.9)
    p.add_argument("--eps", type=finite, default=OptimizerConfig.eps, help="AdamW epsilon")
    p.add_argument("--optimizer-spec", metavar="FILE",
                   help="the optimizer as JSON (OptimizerConfig.to_dict: kind, lr, schedule...; written by a "
                        "mindp.torch script's describe run) instead of --optimizer/--lr/...; a state that exists "
                        "must have been created with the same")
    p.add_argument("--steps", type=int,
                   help="exit once the job's steps 0..STEPS-1 are committed (and late resends settle); >= 0")
    p.add_argument("--linger", type=finite, default=LINGER,
                   help="seconds of quiet after the last step before exiting (more than the workers' largest RTO, "
                        "so a worker whose last parameters were lost is still answered)")
    p.add_argument("--idle-timeout", type=finite, help="exit after this many seconds without a sum")
    p.add_argument("--rx-usecs", type=int, default=RX_USECS, metavar="US",
                   help="receive coalescing: while %d or more chunks of a step are to come, wait US "
                        "microseconds after a wake-up before reading (0: off)" % COALESCE_MIN)
    p.add_argument("--stall-resend", type=finite, default=1.0,
                   help="seconds without a sum before the recent parameters are sent again (0: never)")
    p.add_argument("--export", help="write the final master parameters to this .npz (its directory checked at start)")
    p.add_argument("--stats", help="write counters as JSON here at exit")
    p.add_argument("--step-lines", action="store_true",
                   help="print a JSON line per committed step: its elements updated, the seconds spent updating "
                        "them, frames rejected so far (make run's metrics.csv)")
    p.add_argument("--plan", action="store_true",
                   help="print the residency plan for this state and --ram-budget and the step time it predicts "
                        "(measures the disk, memory and update rate: a few seconds), then exit")
    agent_args.add_fault_args(p, send_reorder=True)
    return p


def _job_from_args(args) -> tuple[int, int, NodeAddress]:
    if args.topology:
        topo = Topology.load(args.topology)
        jobs = {j.job_id: j for j in topo.jobs}
        if args.job not in jobs:
            raise TopologyError(f"job {args.job} is not in {args.topology}")
        job = jobs[args.job]
        host = topo.host(job.optimizers[args.shard or 0])
        return job.n_workers, job.slots, NodeAddress(host.mac, host.ip)
    missing = [f"--{n}" for n in ("workers", "slots", "mac", "ip") if getattr(args, n) is None]
    if missing:
        raise ConfigError(f"without --topology, give {' '.join(missing)}")
    return args.workers, args.slots, NodeAddress(args.mac, args.ip)


def _workers_ips(args) -> frozenset[str] | None:
    """The addresses a step's lrs are taken from: the job's workers' (None without --topology)."""
    if not args.topology:
        return None
    topo = Topology.load(args.topology)
    return frozenset(topo.host(h).ip for h in topo.job(args.job).workers.values())


def shard_from_args(args) -> tuple[tuple[int, int] | None, list[str]]:
    """This node's chunk range (None: the whole model) and the IPv4 addresses of the job's other
    shards: from the topology's optimizer list with --shard I, or --chunks LO:HI and --peers."""
    if args.topology:
        topo = Topology.load(args.topology)
        job = topo.job(args.job)
        if args.chunks or args.peers:
            raise ConfigError("with --topology the shards come from the job's optimizer list: give --shard I")
        if not job.sharded:
            if args.shard not in (None, 0):
                raise ConfigError(f"job {args.job} has one optimizer node: no --shard {args.shard}")
            return None, []
        ranges = topo.shard_ranges(job)
        if args.shard is None or not 0 <= args.shard < len(ranges):
            raise ConfigError(f"job {args.job} has {len(ranges)} optimizer shards: give --shard 0..{len(ranges) - 1}")
        lo, hi, _ = ranges[args.shard]
        return (lo, hi), [topo.host(h).ip for i, (_, _, h) in enumerate(ranges) if i != args.shard]
    if args.shard is not None:
        raise ConfigError("--shard needs --topology (or give --chunks LO:HI)")
    peers = [p for p in (args.peers or "").split(",") if p]
    if peers and not args.chunks:
        raise ConfigError("--peers needs --chunks")
    return (shards.parse_chunks(args.chunks) if args.chunks else None), peers


def sum_sources(args) -> list[tuple[str, str]] | None:
    """(MAC, IP) a sum may come from: the last contributor's, so any topology host but the
    optimizers (a worker may be added to the job later); None (unchecked) without a topology."""
    if not args.topology:
        return None
    topo = Topology.load(args.topology)
    optimizers = {o for j in topo.jobs for o in j.optimizers}
    return [(h.mac, h.ip) for h in topo.hosts.values() if h.name not in optimizers]


def config_from_args(args) -> OptimizerConfig:
    """The optimizer the command line asks for (a state created from now on takes it)."""
    if args.optimizer_spec:
        try:
            return OptimizerConfig.from_dict(json.loads(pathlib.Path(args.optimizer_spec).read_text()))
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            raise ConfigError(f"--optimizer-spec {args.optimizer_spec}: {exc}") from None
    return OptimizerConfig(kind=args.optimizer, lr=args.lr, weight_decay=args.weight_decay, momentum=args.momentum,
                           eps=args.eps)


def open_state(args, chunks: tuple[int, int] | None = None) -> state.Store:
    """The state directory (created if absent); `chunks`: a shard's range, checked against the
    directory's."""
    cfg = config_from_args(args)
    if not state.exists(args.state_dir):
        layout, init, seed = agent_args.model_init(args.layout, args.init)  # the workers' reading of them
        state.create(args.state_dir, layout, state.init_pieces(layout, init, seed), cfg, args.page_chunks, chunks)
    store = state.Store(args.state_dir, args.ram_budget, sync=args.sync)
    if (store.chunks if store.sharded else None) != chunks:
        held = "all chunks" if not store.sharded else "chunks {}:{}".format(*store.chunks)
        want = "all chunks" if chunks is None else "chunks {}:{}".format(*chunks)
        store.close()
        raise ConfigError(f"{args.state_dir} holds {held}, not {want}")
    if store.cfg != cfg:  # a state keeps its optimizer: a different one asked for is refused, never dropped
        store.close()
        raise ConfigError(f"{args.state_dir} was created with another optimizer: {store.cfg.differences(cfg)} "
                          "(train on with the same one, or give a fresh --state-dir)")
    wanted = agent_args.requested_layout(args.layout, args.init)
    if wanted is not None and optim.layout_to_json(wanted) != optim.layout_to_json(store.layout):
        store.close()
        raise ConfigError(f"{args.state_dir} holds another model than --init/--layout describe")
    return store


def finish(store: state.Store, export: str | None) -> None:
    """--export's parameters written, then the store closed whatever the export did: the close is its
    final write-back and, with --sync exit, its only fsync."""
    try:
        if export:
            store.export(export)
    finally:
        store.close()


def proc_status_kb(field: str) -> int:
    """A memory figure of this process from /proc/self/status, in KiB."""
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def print_plan(args) -> int:
    """--plan: the state's residency within --ram-budget and the predicted step time (docs/STATE.md)."""
    try:
        if state.exists(args.state_dir):
            meta = state.read_meta(args.state_dir)
            layout, page_chunks = optim.layout_from_json(meta["layout"]), int(meta["page_chunks"])
            lo, hi = meta.get("chunks", (0, layout.n_chunks - 1))
            cfg, lanes = OptimizerConfig.from_dict(meta["optimizer"]), state.record_lanes(meta)
        else:
            layout = agent_args.requested_layout(args.layout, args.init)
            if layout is None:
                raise ConfigError("--plan for a state not yet created needs --layout or --init FILE.npz")
            page_chunks, lo, hi = args.page_chunks, 0, layout.n_chunks - 1
            cfg = config_from_args(args)
            lanes = cfg.lanes
        slots = args.slots or (Topology.load(args.topology).job(args.job).slots if args.topology else 64)
        print(probe.report(args.state_dir, args.ram_budget, hi - lo + 1, page_chunks, slots, cfg, lanes, args.sync),
              flush=True)
    except (ConfigError, TopologyError, OSError, ValueError, KeyError, TypeError) as exc:
        print(f"mindp-optimizer: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.plan:
        return print_plan(args)
    try:
        fused.selected()  # a MINDP_KERNEL this CPU cannot run is refused before any state is touched
        chunks, peers = shard_from_args(args)
        n_workers, slots, addr = _job_from_args(args)
        lr_from = _workers_ips(args)
        for name in ("linger", "idle_timeout", "stall_resend"):
            if getattr(args, name) is not None and getattr(args, name) < 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 0 seconds")
        if not 1 <= args.max_workers <= MAX_WORKERS:
            raise ConfigError(f"--max-workers must be in 1..{MAX_WORKERS}")
        if not 0 <= args.job <= MAX_JOB_ID:
            raise ConfigError(f"--job must be in 0..{MAX_JOB_ID}")
        if args.workers is not None and not 1 <= args.workers <= MAX_WORKERS:
            raise ConfigError(f"--workers must be in 1..{MAX_WORKERS}")
        if args.steps is not None and args.steps < 0:
            raise ConfigError("--steps must be >= 0")
        agent_args.check_output(args.export, "--export")
        agent_args.check_output(args.stats, "--stats")
        if args.rx_usecs < 0:
            raise ConfigError("--rx-usecs must be >= 0 (0: off)")
        store = open_state(args, chunks)
        if chunks and args.topology and Topology.load(args.topology).job(args.job).chunks != store.layout.n_chunks:
            store.close()
            raise ConfigError(f"job {args.job}'s topology says {Topology.load(args.topology).job(args.job).chunks} "
                              f"chunks, the model has {store.layout.n_chunks}: the shards' ranges would not match")
        sock = rawsock.open_raw(args.iface)
        guard = rawsock.udp_guard()
        agreement = shards.NonfiniteAgreement(args.job, peers, None) if peers else None
    except (ConfigError, TopologyError, rawsock.SocketError, PagerError, ValueError, OSError) as exc:
        print(f"mindp-optimizer: {exc}", file=sys.stderr)
        return 2
    skipped = []
    core = NodeCore(store, args.job, n_workers, slots, on_nonfinite=lambda s, c: skipped.append((s, c)),
                    max_workers=args.max_workers)
    if args.step_lines:
        core.on_commit = lambda step, elements, seconds, durable: print(json.dumps({
            "ev": "commit", "job": args.job, "shard": args.shard or 0, "step": step, "t": time.time(),
            "elements": elements, "seconds": round(seconds, 6), "commit_seconds": round(durable, 6),
            "rejected": sum(v for k, v in core.stats.items() if k.startswith("rejected_")),
            "cpu": round(time.process_time(), 4)}), flush=True)
    faults = None
    if args.drop_send or args.drop_recv or args.dup_send or args.reorder_send:
        faults = agent_args.faults_from_args(args)
    if agreement:
        agreement.skip = core.skip_step
    try:
        digests = digest.Server(args.job, core.digests, core.committed_params, on_lr=core.learn_lr,
                                lr_from=lr_from)
    except OSError as exc:  # the workers' checks then fail with one line each
        print(f"mindp-optimizer: step digests not served (UDP port {digest.DIGEST_PORT}: {exc.strerror})",
              file=sys.stderr, flush=True)
        digests = None
    node = OptimizerNode(core, sock, addr, faults, args.stall_resend, sum_sources(args), agreement, digests,
                         args.rx_usecs)
    signal.signal(signal.SIGTERM, lambda *_: node.stop())
    rss_start = proc_status_kb("VmRSS")
    owned = f"chunks {store.chunks[0]}..{store.chunks[1]} of {store.layout.n_chunks}" if store.sharded else \
        f"{store.n_chunks} chunks"
    print(f"{UP_LINE} {args.job}, {n_workers} workers, {owned}, "
          f"resuming after step {store.committed} ({store.resumed_chunks} chunks of the next step applied), "
          f"kernel {core.kernel}",
          flush=True)
    try:
        node.serve(args.steps, args.linger, args.idle_timeout)
    except KeyboardInterrupt:
        pass
    except StorageError as exc:  # disk full / EIO: nothing after the last commit is trusted; restart resumes
        print(f"mindp-optimizer: {exc}", file=sys.stderr, flush=True)
        return 3
    finally:
        # Served: the rest runs to its end. A SIGTERM from now on (a run ending a node that ends by
        # itself) would otherwise land in the interpreter's shutdown, which restores the default
        # action, and turn exit 0 into death by the signal.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stats = dict(core.stats, committed=store.committed, nonfinite=skipped, peak_pages=store.pages.peak_pages,
                 page_bytes=store.pages.page_bytes, rss_start_kb=rss_start, vm_hwm_kb=proc_status_kb("VmHWM"),
                 **store.pages.paging)
    code = 0
    try:  # the directories were checked at start: a failure here is one removed or full since
        finish(store, args.export)
    except OSError as exc:
        print(f"mindp-optimizer: {exc}", file=sys.stderr, flush=True)
        code = 1
    except StorageError as exc:  # the close's write-back or fsync
        print(f"mindp-optimizer: {exc}", file=sys.stderr, flush=True)
        code = 3
    if guard:
        guard.close()
    if agreement:
        stats.update(agreement.stats)
        agreement.close()
    if digests:
        digests.close()
    try:
        if args.stats:
            pathlib.Path(args.stats).write_text(json.dumps(stats, indent=1) + "\n")
    except OSError as exc:
        print(f"mindp-optimizer: {exc}", file=sys.stderr, flush=True)
        code = code or 1
    print(f"mindp-optimizer: stopped after step {stats['committed']}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
