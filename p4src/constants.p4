/* mindp switch constants. Protocol constants (K, UDP port, kinds, lengths)
 * come from mindp/protocol.py through generated/protocol.p4, the switch's sizes
 * and drop reasons from mindp/switch_constants.py through generated/switch.p4;
 * the ones here are the other protocols' numbers and the address types. */
#ifndef MINDP_CONSTANTS_P4
#define MINDP_CONSTANTS_P4

#include <generated/protocol.p4>
#include <generated/switch.p4>

typedef bit<9> port_t;
typedef bit<48> mac_t;
typedef bit<32> ip4_t;

const bit<16> ETHERTYPE_ARP = 0x0806;
const bit<16> ETHERTYPE_IPV4 = 0x0800;
/* VLAN tags: 802.1Q, 802.1ad (QinQ outer) and the pre-standard QinQ outer tag. */
const bit<16> ETHERTYPE_VLAN = 0x8100;
const bit<16> ETHERTYPE_QINQ = 0x88a8;
const bit<16> ETHERTYPE_QINQ_OLD = 0x9100;
const bit<8> IPPROTO_UDP = 17;

#endif
