"""The switch program's control-plane names, sizes and codes, in one place.

Mirrors p4src/constants.p4 and the compiled P4Info; tests/controller/test_p4info_names.py
checks both, so a renamed table or a resized pool fails a test, not a run.
The multicast group and replication id numbering is the controller's own choice
(docs/CONTROLLER.md).
"""
from __future__ import annotations

import enum

# Sizes (p4src/constants.p4).
POOL_SLOTS = 1024
MAX_JOBS = 64
MAX_WORKERS = 32
DROP_REASONS = 16
NO_JOB_ROW = MAX_JOBS  # drops row for packets without a valid job id
DROP_CELLS = (MAX_JOBS + 1) * DROP_REASONS
MAX_PORT = 510  # 9-bit port; 511 is BMv2's drop port


class DropReason(enum.IntEnum):
    MALFORMED = 0
    BAD_VERSION = 1
    BAD_KIND = 2
    BAD_LENGTH = 3
    UNKNOWN_JOB = 4
    NOT_MEMBER = 5
    BAD_SLOT = 6
    STALE = 7
    DUPLICATE = 8
    NO_REWRITE = 9
    NO_ROUTE = 10


# Tables.
L2_FORWARD = "MindpIngress.forwarding.l2_forward"
JOBS = "MindpIngress.admission.jobs"
WORKERS = "MindpIngress.admission.workers"
OPTIMIZERS = "MindpIngress.admission.optimizers"
PARAM_REWRITE = "MindpEgress.rewrite.param_rewrite"
TABLES = (L2_FORWARD, JOBS, WORKERS, OPTIMIZERS, PARAM_REWRITE)

# Match fields.
MF_DST_MAC = "hdr.ethernet.dstAddr"
MF_JOB = "hdr.mindp.job"
MF_WORKER = "hdr.mindp.worker"
MF_INGRESS_PORT = "standard_metadata.ingress_port"
MF_EGRESS_RID = "standard_metadata.egress_rid"

# Actions and their parameters.
FORWARD = "MindpIngress.forwarding.forward"  # (port)
FLOOD = "MindpIngress.forwarding.flood"  # (group)
SET_JOB = "MindpIngress.admission.set_job"
SET_JOB_PARAMS = ("slot_base", "slot_count", "workers", "optimizer_port", "optimizer_mac",
                  "optimizer_ip", "mcast_group", "epoch")
ADMIT = "MindpIngress.admission.admit"
SET_WORKER_ADDRESS = "MindpEgress.rewrite.set_worker_address"  # (mac, ip)

# Action parameters that are addresses: shown and compared as strings, not integers.
MAC_PARAMS = frozenset({"optimizer_mac", "mac"})
IP_PARAMS = frozenset({"optimizer_ip", "ip"})

# Counters, all indexed by job id except DROPS (row * DROP_REASONS + reason).
GRAD_PACKETS = "MindpIngress.aggregation.grad_packets"
COMPLETIONS = "MindpIngress.aggregation.completions"
DUPLICATES = "MindpIngress.aggregation.duplicates"
RESENT_SUMS = "MindpIngress.aggregation.resent_sums"
PARAM_PACKETS = "MindpIngress.multicast.param_packets"
DROPS = "MindpIngress.drops"
REWRITE_MISSES = "MindpEgress.rewrite.rewrite_misses"
JOB_COUNTERS = (GRAD_PACKETS, COMPLETIONS, DUPLICATES, RESENT_SUMS, PARAM_PACKETS, REWRITE_MISSES)

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


def drop_cell(row: int, reason: int) -> int:
    return row * DROP_REASONS + reason
