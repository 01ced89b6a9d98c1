/* Parser: Ethernet, up to two VLAN tags, ARP, IPv4 (no options), UDP, mindp,
 * elements (fp16 for gradients and parameters, int64 for partial sums). A frame cut short ends in error.PacketTooShort; ingress drops and
 * counts it. Tags are parsed only to drop tagged frames (with their job, if
 * they carry mindp) instead of forwarding them by MAC. */
#ifndef MINDP_PARSER_P4
#define MINDP_PARSER_P4

#include "headers.p4"

parser MindpParser(packet_in pkt, out headers_t hdr, inout metadata_t meta,
                   inout standard_metadata_t standard_metadata) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            ETHERTYPE_VLAN: parse_outer_tag;
            ETHERTYPE_QINQ: parse_outer_tag;
            ETHERTYPE_QINQ_OLD: parse_outer_tag;
            ETHERTYPE_ARP: parse_arp;
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    state parse_outer_tag {
        pkt.extract(hdr.outer_tag);
        transition select(hdr.outer_tag.etherType) {
            ETHERTYPE_VLAN: parse_inner_tag;
            ETHERTYPE_QINQ: parse_inner_tag;
            ETHERTYPE_QINQ_OLD: parse_inner_tag;
            ETHERTYPE_ARP: parse_arp;
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    state parse_inner_tag {
        pkt.extract(hdr.inner_tag);
        transition select(hdr.inner_tag.etherType) {
            ETHERTYPE_ARP: parse_arp;
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    state parse_arp {
        pkt.extract(hdr.arp);
        transition accept;
    }

    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        transition select(hdr.ipv4.ihl, hdr.ipv4.protocol) {
            (5, IPPROTO_UDP): parse_udp;
            default: accept;
        }
    }

    state parse_udp {
        pkt.extract(hdr.udp);
        transition select(hdr.udp.dstPort) {
            MINDP_UDP_PORT: parse_mindp;
            default: accept;
        }
    }

    state parse_mindp {
        pkt.extract(hdr.mindp);
        transition select(hdr.mindp.kind) {
            KIND_GRAD: parse_fp16;
            KIND_PARAM: parse_fp16;
            KIND_PARTIAL: parse_sums;
            default: accept;
        }
    }

    state parse_sums {
        pkt.extract(hdr.sums);
        transition accept;
    }

    state parse_fp16 {
        pkt.extract(hdr.fp16);
        transition accept;
    }
}

control MindpVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply { }
}

#endif
