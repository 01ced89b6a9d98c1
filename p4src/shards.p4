/* Sharded optimizer nodes (issue 14; docs/P4.md "Trees and shards"): a job's chunk
 * space may be split in contiguous ranges, each owned by one node. A completed sum
 * goes to the node owning its chunk, and a parameter chunk is admitted only from
 * that node's port, so a node can never overwrite another node's parameters at
 * the workers (docs/DESIGN.md invariant 5, per chunk). Without a shard entry the
 * job's optimizer endpoint owns the chunk (a single node, or a leaf's uplink). */
#ifndef MINDP_SHARDS_P4
#define MINDP_SHARDS_P4

#include "headers.p4"

control ShardRouting(inout headers_t hdr, inout metadata_t meta,
                     inout standard_metadata_t standard_metadata) {
    /* hi: the range's last chunk, which a PARAM of several chunks must not pass. */
    action to_shard(port_t port, mac_t mac, ip4_t ip, bit<32> hi) {
        meta.shard_hit = 1;
        meta.shard_hi = hi;
        meta.shard_port = port;
        meta.shard_mac = mac;
        meta.shard_ip = ip;
    }

    /* Per job at most MAX_SHARDS disjoint ranges [lo, hi] of chunks (the controller
     * checks they are contiguous and cover the job). */
    table shards {
        key = {
            hdr.mindp.job: exact;
            hdr.mindp.chunk: range;
        }
        actions = { to_shard; @defaultonly NoAction; }
        default_action = NoAction();
        size = SHARD_ENTRIES;
    }

    apply {
        shards.apply();
        if (hdr.mindp.kind == KIND_PARAM) {
            /* Every chunk it carries (chunk .. chunk + more) must be the sender's: without a
             * shard entry the job's optimizer endpoint owns them all. */
            port_t owner = (meta.shard_hit == 1) ? meta.shard_port : meta.optimizer_port;
            if (standard_metadata.ingress_port != owner
                || (meta.shard_hit == 1
                    && (bit<33>) hdr.mindp.chunk + (bit<33>) hdr.mindp.more > (bit<33>) meta.shard_hi)) {
                meta.dropped = 1;
                meta.drop_reason = DROP_NOT_OWNER;
            }
        } else if (meta.shard_hit == 1 && meta.uplink == 0) {
            meta.optimizer_port = meta.shard_port;
            meta.optimizer_mac = meta.shard_mac;
            meta.optimizer_ip = meta.shard_ip;
        }
    }
}

#endif
