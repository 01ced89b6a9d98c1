"""The switch program's sizes and drop reasons: the one source of truth.

`p4src/gen_p4.py` writes them into `p4src/generated/switch.p4` (as it writes
the protocol's constants from `mindp.protocol`); the controller
(`controller.p4info_names`), the topology checks and the tests import them
from here. docs/P4.md explains each reason.
"""
from __future__ import annotations

import enum

from .protocol import MAX_WORKERS

#: Aggregation slots in the register pool, shared by all jobs in disjoint ranges.
POOL_SLOTS = 1024
#: Every slot has two versions (invariant 3), so per-slot registers have two cells a slot.
POOL_CELLS = 2 * POOL_SLOTS

#: Job ids are 0 .. MAX_JOBS - 1; per-job counters have one cell per job.
MAX_JOBS = 64
MAX_JOB_ID = MAX_JOBS - 1

#: Most shards (optimizer nodes with contiguous chunk ranges) one job may have on a switch.
MAX_SHARDS = 8

#: Highest switch port a host may use: ports are 9 bits and 511 is BMv2's drop port.
MAX_PORT = 510

#: A gradient's step may be at most this far beyond the newest step the job completed on
#: the switch (synchronous training needs 1: a worker starts step s + 1 only after every
#: chunk of step s came back).
STEP_WINDOW = 4

#: The drop counter has one row of DROP_REASONS cells per job, and row NO_JOB_ROW for
#: packets that name no valid job id (and ordinary frames).
DROP_REASONS = 32
NO_JOB_ROW = MAX_JOBS
DROP_CELLS = (MAX_JOBS + 1) * DROP_REASONS


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
    TAGGED = 9
    NO_ROUTE = 10
    UNKNOWN_ETHERTYPE = 11
    FUTURE_STEP = 12
    BAD_CHUNK = 13
    NOT_OWNER = 14
    WRONG_ROLE = 15
    BAD_NWORKERS = 16
    SPOOFED = 17


#: What each drop reason means (also the comments of the generated P4 constants).
DROP_MEANING: dict[DropReason, str] = {
    DropReason.MALFORMED: "parser error: truncated or inconsistent",
    DropReason.BAD_VERSION: "unknown protocol version",
    DropReason.BAD_KIND: "a kind the switch does not accept",
    DropReason.BAD_LENGTH: "frame, IPv4 or UDP length or element count not as the kind says",
    DropReason.UNKNOWN_JOB: "no entry in the job table",
    DropReason.NOT_MEMBER: "(port, job, worker) or (port, job) not registered",
    DropReason.BAD_SLOT: "slot outside the job's range, version > 1, worker id too big",
    DropReason.STALE: "gradient for an older use of the slot version",
    DropReason.DUPLICATE: "contribution already counted, slot not complete",
    DropReason.TAGGED: "an 802.1Q or 802.1ad tagged frame: the switch serves one untagged segment",
    DropReason.NO_ROUTE: "ordinary frame to an unknown destination MAC",
    DropReason.UNKNOWN_ETHERTYPE: "neither ARP nor IPv4",
    DropReason.FUTURE_STEP: "gradient step beyond the job's newest completed step + STEP_WINDOW",
    DropReason.BAD_CHUNK: "chunk beyond the job's chunk count",
    DropReason.NOT_OWNER: "parameter chunk from a port other than its shard's node (or the job's optimizer)",
    DropReason.WRONG_ROLE: "gradient from a child switch's member entry, or partial sum from a worker's",
    DropReason.BAD_NWORKERS: "partial sum's nworkers 0 or above the workers beneath its child switch",
    DropReason.SPOOFED: "ordinary frame whose source MAC and IPv4 are no host's behind its ingress port",
}


assert max(DropReason) < DROP_REASONS and set(DROP_MEANING) == set(DropReason)
assert MAX_WORKERS <= 32  # the per-cell worker bitmap register is 32 bits


def drop_cell(row: int, reason: int) -> int:
    """The drop counter cell of a job row (or NO_JOB_ROW) and a reason."""
    return row * DROP_REASONS + reason
