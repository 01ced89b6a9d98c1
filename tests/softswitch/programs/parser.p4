/* Parser constructs: select on two fields with a mask, default, lookahead,
 * advance, verify with a custom error, set in the parser, a header cut short
 * (PacketTooShort). Ingress reports parser_error and validity in `res`; a
 * parser error does not drop the packet (v1model on bmv2). */
#include <core.p4>
#include <v1model.p4>

error { BadLen }

header eth_t { bit<48> dst; bit<48> src; bit<16> type; }
header tag_t { bit<4> kind; bit<4> len; bit<8> val; }
header opt_t { bit<16> x; }
header big_t { bit<64> v; }
header res_t { bit<8> err; bit<8> valid; bit<8> mval; bit<16> la; }
struct headers_t { eth_t eth; res_t res; tag_t tag; opt_t opt; big_t big; }
struct meta_t { bit<8> mval; bit<16> la; }

parser P(packet_in pkt, out headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.eth);
        transition select(hdr.eth.type, hdr.eth.src[7:0]) {
            (0x88b5, 0x01 &&& 0x0f): parse_tag;
            (0x88b6, _): parse_la;
            default: accept;
        }
    }
    state parse_tag {
        pkt.extract(hdr.tag);
        m.mval = hdr.tag.val + 1;
        verify(hdr.tag.len != 15, error.BadLen);
        transition select(hdr.tag.kind) {
            1: parse_opt;
            2 &&& 2: parse_big;
            default: accept;
        }
    }
    state parse_opt { pkt.extract(hdr.opt); transition accept; }
    state parse_big { pkt.extract(hdr.big); transition accept; }
    state parse_la {
        m.la = pkt.lookahead<bit<16>>();
        pkt.advance(16);
        pkt.extract(hdr.opt);
        transition accept;
    }
}

control VC(inout headers_t hdr, inout meta_t m) { apply { } }

control I(inout headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    apply {
        hdr.res.setValid();
        if (sm.parser_error == error.NoError) {
            hdr.res.err = 0;
        } else if (sm.parser_error == error.PacketTooShort) {
            hdr.res.err = 1;
        } else if (sm.parser_error == error.BadLen) {
            hdr.res.err = 2;
        } else {
            hdr.res.err = 3;
        }
        hdr.res.valid = (hdr.tag.isValid() ? 8w1 : 8w0) | (hdr.opt.isValid() ? 8w2 : 8w0)
                      | (hdr.big.isValid() ? 8w4 : 8w0);
        hdr.res.mval = m.mval;
        hdr.res.la = m.la;
        sm.egress_spec = sm.ingress_port;
    }
}

control E(inout headers_t hdr, inout meta_t m, inout standard_metadata_t sm) { apply { } }
control CC(inout headers_t hdr, inout meta_t m) { apply { } }

control D(packet_out pkt, in headers_t hdr) {
    apply { pkt.emit(hdr.eth); pkt.emit(hdr.res); pkt.emit(hdr.tag); pkt.emit(hdr.opt); pkt.emit(hdr.big); }
}

V1Switch(P(), VC(), I(), E(), CC(), D()) main;
