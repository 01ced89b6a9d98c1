/* Executor test: header stacks. A label stack (MPLS-like, bos ends it) of at
 * most 4 entries is parsed with extract(next) and last; ingress pops or pushes
 * by the first label's value; the parser error (StackOutOfBounds 0xee,
 * PacketTooShort 0x55), the index of the last label parsed, the validity of
 * every element and the packet length are reported in the source MAC. */
#include <core.p4>
#include <v1model.p4>

header eth_t { bit<48> dst; bit<48> src; bit<16> type; }
header label_t { bit<7> v; bit<1> bos; }
struct headers_t { eth_t eth; label_t[4] labels; }
struct meta_t { bit<32> last; }

parser P(packet_in pkt, out headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.eth);
        transition select(hdr.eth.type) { 0x88b6: labels; default: accept; }
    }
    state labels {
        pkt.extract(hdr.labels.next);
        meta.last = hdr.labels.lastIndex;
        transition select(hdr.labels.last.bos) { 1: accept; default: labels; }
    }
}

control VC(inout headers_t hdr, inout meta_t meta) { apply {} }

control I(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    apply {
        sm.egress_spec = 1;
        if (hdr.labels[0].isValid() && hdr.labels[0].v == 1) {
            hdr.labels.pop_front(1);
        } else if (hdr.labels[0].isValid() && hdr.labels[0].v == 2) {
            hdr.labels.pop_front(2);
        } else if (hdr.labels[0].isValid() && hdr.labels[0].v == 3) {
            hdr.labels.push_front(1);
            hdr.labels[0].setValid();
            hdr.labels[0].v = 9;
            hdr.labels[0].bos = 0;
        }
        hdr.eth.src[7:0] = meta.last[7:0];
        if (sm.parser_error == error.StackOutOfBounds) { hdr.eth.src[15:8] = 0xee; }
        else if (sm.parser_error == error.PacketTooShort) { hdr.eth.src[15:8] = 0x55; }
        hdr.eth.src[16:16] = hdr.labels[0].isValid() ? 1w1 : 1w0;
        hdr.eth.src[17:17] = hdr.labels[1].isValid() ? 1w1 : 1w0;
        hdr.eth.src[18:18] = hdr.labels[2].isValid() ? 1w1 : 1w0;
        hdr.eth.src[19:19] = hdr.labels[3].isValid() ? 1w1 : 1w0;
        hdr.eth.src[47:32] = (bit<16>) sm.packet_length;
    }
}

control E(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) { apply {} }
control CC(inout headers_t hdr, inout meta_t meta) { apply {} }
control D(packet_out pkt, in headers_t hdr) { apply { pkt.emit(hdr.eth); pkt.emit(hdr.labels); } }

V1Switch(P(), VC(), I(), E(), CC(), D()) main;
