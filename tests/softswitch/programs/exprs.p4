/* Expressions on bit<W> and int<W>: wrap-around, signedness, runtime shifts,
 * concatenation, slices, casts, saturating arithmetic. Each result lands in a
 * field of `out`; the frame goes back out of its ingress port. */
#include <core.p4>
#include <v1model.p4>

header eth_t { bit<48> dst; bit<48> src; bit<16> type; }
header in_t { bit<16> a; bit<16> b; int<16> s; int<16> t; bit<8> n; bit<8> pad; }
header out_t {
    bit<16> add; bit<16> sub; bit<16> mul; bit<16> shl_c; bit<16> shl_r; bit<16> shr_r;
    int<16> sshr_r; bit<8> cmp; bit<16> tern; bit<32> cat; bit<8> slice; bit<8> trunc;
    int<32> sext; bit<16> neg; bit<16> sat_add; int<16> ssat_sub; bit<16> xor_or; int<16> sadd;
    bit<16> wide_shl; bit<4> nib; bit<4> nib2;
}
struct headers_t { eth_t eth; in_t inp; out_t res; }
struct meta_t { bit<8> unused; }

parser P(packet_in pkt, out headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.eth);
        transition select(hdr.eth.type) { 0x88b5: parse_in; default: accept; }
    }
    state parse_in { pkt.extract(hdr.inp); transition accept; }
}

control VC(inout headers_t hdr, inout meta_t m) { apply { } }

control I(inout headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    apply {
        if (hdr.inp.isValid()) {
            hdr.res.setValid();
            hdr.res.add = hdr.inp.a + hdr.inp.b;
            hdr.res.sub = hdr.inp.a - hdr.inp.b;
            hdr.res.mul = hdr.inp.a * hdr.inp.b;
            hdr.res.shl_c = hdr.inp.a << 3;
            hdr.res.shl_r = hdr.inp.a << hdr.inp.n;
            hdr.res.shr_r = hdr.inp.a >> hdr.inp.n;
            hdr.res.sshr_r = hdr.inp.s >> hdr.inp.n;
            hdr.res.cmp = ((hdr.inp.s < hdr.inp.t) ? 8w1 : 8w0)
                        | ((hdr.inp.a < hdr.inp.b) ? 8w2 : 8w0)
                        | ((hdr.inp.s >= 0) ? 8w4 : 8w0)
                        | ((hdr.inp.a == hdr.inp.b) ? 8w8 : 8w0);
            hdr.res.tern = hdr.inp.a > hdr.inp.b ? hdr.inp.a : hdr.inp.b;
            hdr.res.cat = hdr.inp.a ++ hdr.inp.b;
            hdr.res.slice = hdr.inp.a[11:4];
            hdr.res.trunc = (bit<8>) hdr.inp.b;
            hdr.res.sext = (int<32>) hdr.inp.s;
            hdr.res.neg = ~hdr.inp.a;
            hdr.res.sat_add = hdr.inp.a |+| hdr.inp.b;
            hdr.res.ssat_sub = hdr.inp.s |-| hdr.inp.t;
            hdr.res.xor_or = (hdr.inp.a ^ hdr.inp.b) | 16w0x0101;
            hdr.res.sadd = hdr.inp.s + hdr.inp.t;
            bit<64> w = (bit<64>) hdr.inp.a;
            hdr.res.wide_shl = (bit<16>) ((w << hdr.inp.n) >> 8);
            hdr.res.nib = hdr.inp.a[3:0] + hdr.inp.b[3:0];
            hdr.res.nib2 = (bit<4>) (hdr.inp.n - 8w1);
        }
        sm.egress_spec = sm.ingress_port;
    }
}

control E(inout headers_t hdr, inout meta_t m, inout standard_metadata_t sm) { apply { } }
control CC(inout headers_t hdr, inout meta_t m) { apply { } }

control D(packet_out pkt, in headers_t hdr) {
    apply { pkt.emit(hdr.eth); pkt.emit(hdr.inp); pkt.emit(hdr.res); }
}

V1Switch(P(), VC(), I(), E(), CC(), D()) main;
