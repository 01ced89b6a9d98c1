/* Headers and metadata of the mindp switch. The mindp header and the element
 * chunks are generated from mindp/protocol.py (generated/). */
#ifndef MINDP_HEADERS_P4
#define MINDP_HEADERS_P4

#include "constants.p4"
#include <generated/chunks.p4>

header ethernet_t {
    mac_t dstAddr;
    mac_t srcAddr;
    bit<16> etherType;
}

/* An 802.1Q / 802.1ad tag; only parsed so that tagged frames are recognised and dropped. */
header vlan_tag_t {
    bit<3> pcp;
    bit<1> dei;
    bit<12> vid;
    bit<16> etherType;
}

header arp_t {
    bit<16> htype;
    bit<16> ptype;
    bit<8> hlen;
    bit<8> plen;
    bit<16> oper;
    mac_t sha;
    ip4_t spa;
    mac_t tha;
    ip4_t tpa;
}

header ipv4_t {
    bit<4> version;
    bit<4> ihl;
    bit<8> diffserv;
    bit<16> totalLen;
    bit<16> identification;
    bit<3> flags;
    bit<13> fragOffset;
    bit<8> ttl;
    bit<8> protocol;
    bit<16> hdrChecksum;
    ip4_t srcAddr;
    ip4_t dstAddr;
}

header udp_t {
    bit<16> srcPort;
    bit<16> dstPort;
    bit<16> length;
    bit<16> checksum;
}

struct headers_t {
    ethernet_t ethernet;
    vlan_tag_t outer_tag;
    vlan_tag_t inner_tag;
    arp_t arp;
    ipv4_t ipv4;
    udp_t udp;
    mindp_t mindp;
    fp16_chunk_t fp16;
    sum_chunk_t sums;
}

/* Per-packet state of the mindp pipeline. */
struct metadata_t {
    bit<8> drop_reason;
    bit<1> dropped;            /* dropped for drop_reason, and counted */
    bit<1> absorbed;           /* consumed by aggregation: dropped, not counted */
    /* From the job table. */
    bit<32> slot_base;
    bit<16> slot_count;
    bit<16> workers;
    port_t optimizer_port;
    mac_t optimizer_mac;
    ip4_t optimizer_ip;
    bit<16> mcast_group;
    bit<16> epoch;
    bit<32> chunks;            /* the job's chunk count; 0: unknown */
    bit<1> uplink;             /* 1: a leaf; completed cells go up as PARTIAL to the optimizer endpoint */
    bit<16> child_id;          /* a leaf's index at its parent: the PARTIAL's worker field */
    /* From the workers table: the member's role. */
    bit<1> member_is_child;    /* 1: a child switch (sends PARTIAL); 0: a worker host (sends GRAD) */
    bit<16> max_nworkers;      /* a child switch's workers beneath it: bound on its PARTIALs' nworkers */
    /* Source guard of ordinary frames (forwarding.p4). */
    ip4_t src_ip;              /* the sender's IPv4 address: ARP's sender address, or IPv4's source */
    /* From the shards table (shards.p4). */
    bit<1> shard_hit;
    port_t shard_port;
    mac_t shard_mac;
    ip4_t shard_ip;
    bit<32> shard_hi;          /* the shard's last chunk */
    /* Aggregation. */
    bit<32> cell;              /* (slot_base + slot) * 2 + ver */
    bit<32> worker_bit;
    bit<16> contribution;      /* gradients this packet carries: 1, or a PARTIAL's nworkers */
    bit<1> pkt_nonfinite;
    bit<1> complete;
    bit<1> resend;
}

#endif
