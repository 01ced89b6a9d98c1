/* Parameter multicast: a parameter chunk from the job's optimizer node goes to
 * the job's multicast group (one replica per worker, replication id = the
 * worker's rid), and each replica leaves addressed to its worker. */
#ifndef MINDP_MULTICAST_P4
#define MINDP_MULTICAST_P4

#include "headers.p4"

control ParamMulticast(inout headers_t hdr, inout metadata_t meta,
                       inout standard_metadata_t standard_metadata) {
    counter(MAX_JOBS, CounterType.packets_and_bytes) param_packets;

    apply {
        param_packets.count((bit<32>) hdr.mindp.job);
        standard_metadata.mcast_grp = meta.mcast_group;
    }
}

control ParamRewrite(inout headers_t hdr, inout metadata_t meta,
                     inout standard_metadata_t standard_metadata) {
    /* Replicas that had no rewrite entry, per job. */
    counter(MAX_JOBS, CounterType.packets) rewrite_misses;

    action set_worker_address(mac_t mac, ip4_t ip) {
        hdr.ethernet.dstAddr = mac;
        hdr.ipv4.dstAddr = ip;
    }

    action no_rewrite() {
        rewrite_misses.count((bit<32>) hdr.mindp.job);
        mark_to_drop(standard_metadata);
    }

    table param_rewrite {
        key = { standard_metadata.egress_rid: exact; }
        actions = { set_worker_address; @defaultonly no_rewrite; }
        default_action = no_rewrite();
        size = 2048;
    }

    apply {
        param_rewrite.apply();
    }
}

#endif
