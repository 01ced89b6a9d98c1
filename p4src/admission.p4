/* Jobs and membership (docs/DESIGN.md invariant 5): a gradient is admitted only from
 * the port registered for its (job, worker) as a worker host, a partial sum only
 * from the port registered for its (job, child id) as a child switch, carrying at
 * most the workers beneath that child, a parameter chunk only from a port of the
 * job's optimizer nodes (shards.p4 then checks the node owns the chunk). Everything
 * else of our protocol is dropped, and the reason counted by the ingress. */
#ifndef MINDP_ADMISSION_P4
#define MINDP_ADMISSION_P4

#include "headers.p4"

control Admission(inout headers_t hdr, inout metadata_t meta,
                  inout standard_metadata_t standard_metadata) {
    action reject(bit<8> reason) {
        meta.dropped = 1;
        meta.drop_reason = reason;
    }

    /* A job's configuration. Slot ranges [slot_base, slot_base + slot_count) of
     * different jobs are disjoint (the controller allocates them); epoch is new
     * on every creation of a job, so slots left by an earlier job start afresh.
     * chunks bounds the chunk index of gradients (0: not known). workers counts
     * the members: workers, or child switches at a parent. uplink = 1 makes this
     * switch a leaf of a tree: its completed cells go up as PARTIAL (worker =
     * child_id) to the optimizer endpoint, which is then the uplink port (with
     * the node's addresses). */
    action set_job(bit<32> slot_base, bit<16> slot_count, bit<16> workers,
                   port_t optimizer_port, mac_t optimizer_mac, ip4_t optimizer_ip,
                   bit<16> mcast_group, bit<16> epoch, bit<32> chunks,
                   bit<1> uplink, bit<16> child_id) {
        meta.slot_base = slot_base;
        meta.slot_count = slot_count;
        meta.workers = workers;
        meta.optimizer_port = optimizer_port;
        meta.optimizer_mac = optimizer_mac;
        meta.optimizer_ip = optimizer_ip;
        meta.mcast_group = mcast_group;
        meta.epoch = epoch;
        meta.chunks = chunks;
        meta.uplink = uplink;
        meta.child_id = child_id;
    }

    table jobs {
        key = { hdr.mindp.job: exact; }
        actions = { set_job; @defaultonly reject; }
        default_action = reject(DROP_UNKNOWN_JOB);
        size = MAX_JOBS;
    }

    action admit() { }

    /* A worker host: it sends gradients, never partial sums. */
    action admit_worker() {
        meta.member_is_child = 0;
    }

    /* A child switch: it sends partial sums of at most max_nworkers gradients (the
     * workers beneath it), never gradients. */
    action admit_child(bit<16> max_nworkers) {
        meta.member_is_child = 1;
        meta.max_nworkers = max_nworkers;
    }

    /* One entry per member of a job at this switch, keyed by the port it is
     * attached to and its id (worker id, or child id at a parent), giving its role:
     * a member's id is admitted only from its own port, and only in its role. */
    table workers {
        key = {
            standard_metadata.ingress_port: exact;
            hdr.mindp.job: exact;
            hdr.mindp.worker: exact;
        }
        actions = { admit_worker; admit_child; @defaultonly reject; }
        default_action = reject(DROP_NOT_MEMBER);
        size = 2048;
    }

    /* One entry per (port, job) a parameter chunk of the job may come from: the
     * optimizer endpoint's port and each shard node's. */
    table optimizers {
        key = {
            standard_metadata.ingress_port: exact;
            hdr.mindp.job: exact;
        }
        actions = { admit; @defaultonly reject; }
        default_action = reject(DROP_NOT_MEMBER);
        size = MAX_JOBS;
    }

    apply {
        /* A PARAM's further chunks (more <= PARAM_MORE_MAX, checked first) lengthen it; only the
         * first chunk is parsed, the rest rides along as payload. */
        bit<16> more_len = hdr.mindp.more * FP16_CHUNK_LEN;
        if (hdr.mindp.version != MINDP_VERSION) {
            reject(DROP_BAD_VERSION);
        } else if (hdr.mindp.kind != KIND_GRAD && hdr.mindp.kind != KIND_PARAM
                   && hdr.mindp.kind != KIND_PARTIAL) {
            reject(DROP_BAD_KIND);
        } else if (hdr.mindp.more > PARAM_MORE_MAX
                   || (hdr.mindp.more != 0 && (hdr.mindp.kind != KIND_PARAM || hdr.mindp.count != MINDP_K))) {
            /* Only a PARAM carries further chunks, and then every chunk is full. */
            reject(DROP_BAD_LENGTH);
        } else if ((hdr.mindp.kind != KIND_PARTIAL
                       && (standard_metadata.packet_length != FRAME_LEN_FP16 + (bit<32>) more_len
                           || hdr.ipv4.totalLen != IPV4_LEN_FP16 + more_len
                           || hdr.udp.length != UDP_LEN_FP16 + more_len))
                   || (hdr.mindp.kind == KIND_PARTIAL && (standard_metadata.packet_length != FRAME_LEN_SUM
                       || hdr.ipv4.totalLen != IPV4_LEN_SUM || hdr.udp.length != UDP_LEN_SUM))
                   || hdr.mindp.count == 0 || hdr.mindp.count > MINDP_K) {
            /* The frame length too: trailing bytes would otherwise ride along into the sum. */
            reject(DROP_BAD_LENGTH);
        } else if (hdr.mindp.job >= MAX_JOBS) {
            reject(DROP_UNKNOWN_JOB);
        } else {
            jobs.apply();
            if (meta.dropped == 0) {
                if (hdr.mindp.kind != KIND_PARAM) {
                    workers.apply();
                    if (meta.dropped == 0) {
                        if ((hdr.mindp.kind == KIND_PARTIAL) != (meta.member_is_child == 1)) {
                            /* A forged partial sum from a worker's port would count as many
                             * gradients as it claims; a gradient from a child's port as one. */
                            reject(DROP_WRONG_ROLE);
                        } else if (hdr.mindp.kind == KIND_PARTIAL && (hdr.mindp.nworkers == 0
                                   || hdr.mindp.nworkers > meta.max_nworkers)) {
                            /* nworkers divides the sum at the node: a child claiming more
                             * gradients than it has workers beneath it would skew the mean. */
                            reject(DROP_BAD_NWORKERS);
                        } else if (hdr.mindp.worker >= MAX_WORKERS
                                   || (bit<32>) hdr.mindp.slot >= (bit<32>) meta.slot_count
                                   || meta.slot_base + (bit<32>) hdr.mindp.slot >= POOL_SLOTS
                                   || hdr.mindp.ver > 1) {
                            reject(DROP_BAD_SLOT);
                        } else if (meta.chunks != 0 && hdr.mindp.chunk >= meta.chunks) {
                            reject(DROP_BAD_CHUNK);
                        }
                    }
                } else {
                    optimizers.apply();
                }
            }
        }
    }
}

#endif
