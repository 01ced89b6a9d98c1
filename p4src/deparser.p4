/* Deparser, and the IPv4 checksum of the frames the switch rewrites. */
#ifndef MINDP_DEPARSER_P4
#define MINDP_DEPARSER_P4

#include "headers.p4"

control MindpComputeChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply {
        /* Only mindp frames are rewritten (sums, parameter replicas). */
        update_checksum(hdr.mindp.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.totalLen,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.fragOffset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.srcAddr, hdr.ipv4.dstAddr },
            hdr.ipv4.hdrChecksum, HashAlgorithm.csum16);
    }
}

control MindpDeparser(packet_out pkt, in headers_t hdr) {
    apply {
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.outer_tag);
        pkt.emit(hdr.inner_tag);
        pkt.emit(hdr.arp);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.udp);
        pkt.emit(hdr.mindp);
        pkt.emit(hdr.fp16);
        pkt.emit(hdr.sums);
    }
}

#endif
