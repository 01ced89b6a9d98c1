/* mindp switch constants. Protocol constants (K, UDP port, kinds, lengths)
 * come from mindp/protocol.py through generated/protocol.p4; the ones here are
 * the switch's own sizes and codes, mirrored in controller/p4info_names.py. */
#ifndef MINDP_CONSTANTS_P4
#define MINDP_CONSTANTS_P4

#include "generated/protocol.p4"

typedef bit<9> port_t;
typedef bit<48> mac_t;
typedef bit<32> ip4_t;

const bit<16> ETHERTYPE_ARP = 0x0806;
const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<8> IPPROTO_UDP = 17;

/* Aggregation slots in the register pool, shared by all jobs in disjoint ranges.
 * Each slot has two versions, so every per-slot register holds 2 * POOL_SLOTS cells. */
#define POOL_SLOTS 1024
#define POOL_CELLS 2048

/* Job ids are 0 .. MAX_JOBS-1; per-job counters have one cell per job. */
#define MAX_JOBS 64
const bit<16> MAX_JOBS_16 = 64;

/* Drop counter: cell (row * DROP_REASONS + reason); row = job, or MAX_JOBS when
 * the packet names no valid job id. */
#define DROP_REASONS 16
#define DROP_CELLS 1040
const bit<8> DROP_MALFORMED   = 0;  /* parser error: truncated or inconsistent */
const bit<8> DROP_BAD_VERSION = 1;  /* unknown protocol version */
const bit<8> DROP_BAD_KIND    = 2;  /* a kind the switch does not accept */
const bit<8> DROP_BAD_LENGTH  = 3;  /* UDP length or element count not as the kind says */
const bit<8> DROP_UNKNOWN_JOB = 4;  /* no entry in the job table */
const bit<8> DROP_NOT_MEMBER  = 5;  /* (port, job, worker) or (port, job) not registered */
const bit<8> DROP_BAD_SLOT    = 6;  /* slot outside the job's range, version > 1, worker id too big */
const bit<8> DROP_STALE       = 7;  /* gradient for an older use of the slot version */
const bit<8> DROP_DUPLICATE   = 8;  /* contribution already counted, slot not complete */
const bit<8> DROP_NO_REWRITE  = 9;  /* multicast replica without an egress rewrite entry */
const bit<8> DROP_NO_ROUTE    = 10; /* ordinary frame to an unknown destination MAC */

#endif
