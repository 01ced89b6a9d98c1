/* v1model features: LPM/ternary/range tables with a direct counter, action_run
 * and hit/miss branches, registers, an indexed counter, hash (crc16, crc32),
 * IPv4 checksum verify and update, setValid/setInvalid, mark_to_drop, exit,
 * multicast with egress_rid, instance_type and egress_port seen in egress. */
#include <core.p4>
#include <v1model.p4>

header eth_t { bit<48> dst; bit<48> src; bit<16> type; }
header ipv4_t {
    bit<4> version; bit<4> ihl; bit<8> tos; bit<16> len; bit<16> id; bit<3> flags; bit<13> frag;
    bit<8> ttl; bit<8> proto; bit<16> csum; bit<32> src; bit<32> dst;
}
header res_t {
    bit<32> reg_old; bit<16> h16; bit<32> h32; bit<8> path; bit<16> rid; bit<8> eport; bit<32> inst;
    bit<32> plen;
}
header trailer_t { bit<16> t; }
struct headers_t { eth_t eth; ipv4_t ipv4; res_t res; trailer_t trailer; }
struct meta_t { bit<8> path; bit<32> idx; }

parser P(packet_in pkt, out headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.eth);
        transition select(hdr.eth.type) { 0x0800: parse_ipv4; default: accept; }
    }
    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        transition select(hdr.ipv4.proto) { 0xfd: parse_trailer; default: accept; }
    }
    state parse_trailer { pkt.extract(hdr.trailer); transition accept; }
}

control VC(inout headers_t hdr, inout meta_t m) {
    apply {
        verify_checksum(hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.tos, hdr.ipv4.len, hdr.ipv4.id, hdr.ipv4.flags,
              hdr.ipv4.frag, hdr.ipv4.ttl, hdr.ipv4.proto, hdr.ipv4.src, hdr.ipv4.dst },
            hdr.ipv4.csum, HashAlgorithm.csum16);
    }
}

control I(inout headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    register<bit<32>>(8) hits;
    counter(8, CounterType.packets_and_bytes) per_tos;
    direct_counter(CounterType.packets_and_bytes) route_hits;

    action route(bit<9> port) { sm.egress_spec = port; route_hits.count(); }
    action drop() { mark_to_drop(sm); route_hits.count(); }
    table routes {
        key = { hdr.ipv4.dst: lpm; }
        actions = { route; drop; }
        default_action = drop();
        counters = route_hits;
        size = 64;
    }

    action set_tos(bit<8> tos) { hdr.ipv4.tos = tos; }
    action flood(bit<16> grp) { sm.mcast_grp = grp; }
    table classify {
        key = { hdr.ipv4.src: ternary; hdr.ipv4.ttl: range; }
        actions = { set_tos; flood; NoAction; }
        default_action = NoAction();
        size = 64;
    }

    apply {
        if (!hdr.ipv4.isValid()) {
            mark_to_drop(sm);
            exit;
        }
        if (sm.checksum_error == 1) {
            mark_to_drop(sm);
            exit;
        }
        hdr.res.setValid();
        if (routes.apply().hit) {
            hdr.res.path = 1;
        } else {
            hdr.res.path = 2;
        }
        switch (classify.apply().action_run) {
            set_tos: { hdr.res.path = hdr.res.path | 4; }
            flood: { hdr.res.path = hdr.res.path | 8; }
        }
        m.idx = (bit<32>) hdr.ipv4.tos & 7;
        bit<32> old;
        hits.read(old, m.idx);
        hits.write(m.idx, old + 1);
        hdr.res.reg_old = old;
        per_tos.count(m.idx);
        hash(hdr.res.h16, HashAlgorithm.crc16, 16w0, { hdr.ipv4.src, hdr.ipv4.dst }, 17w65536);
        hash(hdr.res.h32, HashAlgorithm.crc32, 32w0, { hdr.ipv4.src, hdr.ipv4.dst }, 33w4294967296);
        hdr.ipv4.ttl = hdr.ipv4.ttl - 1;
        if (hdr.trailer.isValid()) {
            hdr.trailer.setInvalid();
        }
    }
}

control E(inout headers_t hdr, inout meta_t m, inout standard_metadata_t sm) {
    apply {
        hdr.res.rid = sm.egress_rid;
        hdr.res.eport = (bit<8>) sm.egress_port;
        hdr.res.inst = sm.instance_type;
        hdr.res.plen = sm.packet_length;
        if (sm.egress_rid == 99) {
            mark_to_drop(sm);
        }
    }
}

control CC(inout headers_t hdr, inout meta_t m) {
    apply {
        update_checksum(hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.tos, hdr.ipv4.len, hdr.ipv4.id, hdr.ipv4.flags,
              hdr.ipv4.frag, hdr.ipv4.ttl, hdr.ipv4.proto, hdr.ipv4.src, hdr.ipv4.dst },
            hdr.ipv4.csum, HashAlgorithm.csum16);
    }
}

control D(packet_out pkt, in headers_t hdr) {
    apply { pkt.emit(hdr.eth); pkt.emit(hdr.ipv4); pkt.emit(hdr.res); pkt.emit(hdr.trailer); }
}

V1Switch(P(), VC(), I(), E(), CC(), D()) main;
