/* Ordinary L2 forwarding by destination MAC, so ARP and ping work between all
 * hosts. Broadcast goes to a flood group; egress prunes the ingress port. */
#ifndef MINDP_FORWARDING_P4
#define MINDP_FORWARDING_P4

#include "headers.p4"

control Forwarding(inout headers_t hdr, inout metadata_t meta,
                   inout standard_metadata_t standard_metadata) {
    action forward(port_t port) {
        standard_metadata.egress_spec = port;
    }

    action flood(bit<16> group) {
        standard_metadata.mcast_grp = group;
    }

    action unknown_destination() {
        meta.dropped = 1;
        meta.drop_reason = DROP_NO_ROUTE;
    }

    table l2_forward {
        key = { hdr.ethernet.dstAddr: exact; }
        actions = { forward; flood; @defaultonly unknown_destination; }
        default_action = unknown_destination();
        size = 1024;
    }

    apply {
        l2_forward.apply();
    }
}

#endif
