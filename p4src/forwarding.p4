/* Ordinary frames (untagged ARP and IPv4 that is not mindp): a source guard, then
 * L2 forwarding by destination MAC, so ARP, ping and TCP work between all hosts.
 * Broadcast goes to a flood group; egress prunes the ingress port. */
#ifndef MINDP_FORWARDING_P4
#define MINDP_FORWARDING_P4

#include "headers.p4"

control Forwarding(inout headers_t hdr, inout metadata_t meta,
                   inout standard_metadata_t standard_metadata) {
    action spoofed() {
        meta.dropped = 1;
        meta.drop_reason = DROP_SPOOFED;
    }

    action allow() { }

    /* Port security and IP source guard: one entry per host that may send from
     * this port, (port, MAC, IPv4) -> allow: a host's own port, and at a link to
     * another switch every host behind that link. A frame from any other source
     * is dropped: a host cannot pose as another (e.g. a shard node's NOTICE sent
     * with the node's address, or poisoned ARP). mindp frames never come here;
     * admission checks them. */
    table sources {
        key = {
            standard_metadata.ingress_port: exact;
            hdr.ethernet.srcAddr: exact;
            meta.src_ip: exact;
        }
        actions = { allow; @defaultonly spoofed; }
        default_action = spoofed();
        size = 1024;
    }

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

    /* One entry per host: its MAC -> the port towards it; broadcast -> the flood group. */
    table l2_forward {
        key = { hdr.ethernet.dstAddr: exact; }
        actions = { forward; flood; @defaultonly unknown_destination; }
        default_action = unknown_destination();
        size = 1024;
    }

    apply {
        if (hdr.arp.isValid()) {
            meta.src_ip = hdr.arp.spa;
        } else {
            meta.src_ip = hdr.ipv4.srcAddr;
        }
        if (hdr.arp.isValid() && hdr.arp.sha != hdr.ethernet.srcAddr) {
            /* ARP's own sender MAC is what neighbours learn: it must be the frame's. */
            spoofed();
        } else {
            sources.apply();
        }
        if (meta.dropped == 0) {
            l2_forward.apply();
        }
    }
}

#endif
