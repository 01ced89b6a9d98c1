"""The switch program's control-plane names, sizes and codes, in one place.

The sizes and drop reasons come from mindp.switch_constants (which also generates
the P4's); tests/controller/test_p4info_names.py checks the names against the compiled
P4Info, so a renamed table or a resized pool fails a test, not a run.
The multicast group and replication id numbering is the controller's own choice
(docs/CONTROLLER.md).
"""
from __future__ import annotations

# Re-exported for the controller's modules: the sizes and codes live in mindp.switch_constants.
from mindp.protocol import MAX_WORKERS  # noqa: F401
from mindp.switch_constants import (DROP_CELLS, DROP_REASONS, MAX_JOBS, MAX_PORT, MAX_SHARDS, NO_JOB_ROW,  # noqa: F401
                                    POOL_CELLS, POOL_SLOTS, DropReason, drop_cell)


# Tables.
L2_FORWARD = "MindpIngress.forwarding.l2_forward"
SOURCES = "MindpIngress.forwarding.sources"  # (ingress port, src MAC, sender IPv4) -> allow
JOBS = "MindpIngress.admission.jobs"
WORKERS = "MindpIngress.admission.workers"
OPTIMIZERS = "MindpIngress.admission.optimizers"
PARAM_REWRITE = "MindpEgress.rewrite.param_rewrite"
SHARDS = "MindpIngress.shards.shards"  # (job exact, chunk range) -> to_shard; entries need a priority
TABLES = (L2_FORWARD, SOURCES, JOBS, WORKERS, OPTIMIZERS, SHARDS, PARAM_REWRITE)
#: The tables the topology fills (controller.tree.forwarding_entries), not the jobs.
FORWARDING_TABLES = (L2_FORWARD, SOURCES)

# Match fields.
MF_DST_MAC = "hdr.ethernet.dstAddr"
MF_SRC_MAC = "hdr.ethernet.srcAddr"
MF_SRC_IP = "meta.src_ip"  # ARP's sender IPv4 address, or IPv4's source
MF_JOB = "hdr.mindp.job"
MF_WORKER = "hdr.mindp.worker"
MF_CHUNK = "hdr.mindp.chunk"  # range match: (lo, hi) inclusive
MF_INGRESS_PORT = "standard_metadata.ingress_port"
MF_EGRESS_RID = "standard_metadata.egress_rid"

# Actions and their parameters.
FORWARD = "MindpIngress.forwarding.forward"  # (port)
FLOOD = "MindpIngress.forwarding.flood"  # (group)
SET_JOB = "MindpIngress.admission.set_job"
SET_JOB_PARAMS = ("slot_base", "slot_count", "workers", "optimizer_port", "optimizer_mac",
                  "optimizer_ip", "mcast_group", "epoch", "chunks", "uplink", "child_id")
ADMIT = "MindpIngress.admission.admit"  # optimizers: a node's port
ADMIT_WORKER = "MindpIngress.admission.admit_worker"  # workers: a worker host, sends GRAD
ADMIT_CHILD = "MindpIngress.admission.admit_child"  # workers: a child switch, sends PARTIAL (max_nworkers)
ALLOW = "MindpIngress.forwarding.allow"  # sources
SET_WORKER_ADDRESS = "MindpEgress.rewrite.set_worker_address"  # (mac, ip)
TO_SHARD = "MindpIngress.shards.to_shard"  # (port, mac, ip, hi: the range's last chunk, as the match's)
#: Priority of every shards entry: a job's chunk ranges are disjoint, so one level suffices.
SHARD_PRIORITY = 1

# Action parameters and match fields that are addresses: shown and compared as strings, not integers.
MAC_PARAMS = frozenset({"optimizer_mac", "mac", MF_DST_MAC, MF_SRC_MAC})
IP_PARAMS = frozenset({"optimizer_ip", "ip", MF_SRC_IP})

# Counters, all indexed by job id except DROPS (row * DROP_REASONS + reason).
GRAD_PACKETS = "MindpIngress.aggregation.grad_packets"
COMPLETIONS = "MindpIngress.aggregation.completions"
DUPLICATES = "MindpIngress.aggregation.duplicates"
RESENT_SUMS = "MindpIngress.aggregation.resent_sums"  # sums or partials resent
PARAM_PACKETS = "MindpIngress.multicast.param_packets"
DROPS = "MindpIngress.drops"
REWRITE_MISSES = "MindpEgress.rewrite.rewrite_misses"
JOB_COUNTERS = (GRAD_PACKETS, COMPLETIONS, DUPLICATES, RESENT_SUMS, PARAM_PACKETS, REWRITE_MISSES)
# Cell 0: the last job epoch handed out; written and read by the controller only.
EPOCH_GENERATION = "MindpIngress.epoch_generation"

# Registers of the aggregation cells (index: cell = (slot_base + slot) * 2 + ver; acc_i: one per
# element) and of each job's progress (index: job id).
CELL_TAG_EPOCH = "MindpIngress.aggregation.tag_epoch"
CELL_TAG_STEP_CHUNK = "MindpIngress.aggregation.tag_step_chunk"
CELL_BITMAP = "MindpIngress.aggregation.bitmap"
CELL_COUNT = "MindpIngress.aggregation.count"
CELL_NONFINITE = "MindpIngress.aggregation.nonfinite"
CELL_CONTRIBUTIONS = "MindpIngress.aggregation.contributions"
CELL_ACC = "MindpIngress.aggregation.acc_{}"
JOB_PROGRESS_EPOCH = "MindpIngress.aggregation.progress_epoch"
JOB_NEWEST_STEP = "MindpIngress.aggregation.newest_step"

# Multicast numbering (the controller's choice).
FLOOD_GROUP = 1
JOB_GROUP_BASE = 256


def job_group(job_id: int) -> int:
    """The PRE multicast group of a job's parameter chunks."""
    return JOB_GROUP_BASE + job_id


def group_job(group: int) -> int | None:
    """The job whose group this is, or None for any other group."""
    job = group - JOB_GROUP_BASE
    return job if 0 <= job < MAX_JOBS else None


def worker_rid(job_id: int, worker: int) -> int:
    """Replication id of (job, worker): unique and nonzero (0 is the flood group's)."""
    return 1 + job_id * MAX_WORKERS + worker


def rid_worker(rid: int) -> tuple[int, int] | None:
    """(job, worker) of a replication id, or None when it is not one of ours."""
    if not 1 <= rid <= MAX_JOBS * MAX_WORKERS:
        return None
    return divmod(rid - 1, MAX_WORKERS)

