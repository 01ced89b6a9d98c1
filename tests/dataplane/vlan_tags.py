"""VLAN tags on frames, and whether the embedded switch's port loses a frame's outer tag to the kernel."""
import struct

from scapy.layers.inet import IP
from scapy.layers.l2 import Ether


def tagged(frame: bytes, *tags: int) -> bytes:
    """The frame with VLAN tags (EtherType, VID) inserted after the MAC addresses, outermost first."""
    out = frame[:12]
    for i, tpid in enumerate(tags):
        out += struct.pack("!HH", tpid, 10 + i)
    return out + frame[12:]


def stripped_by_kernel(fabric, tags) -> bool:
    """True where the embedded switch's port would lose an outer 802.1Q/802.1ad tag (the kernel strips
    it; restoring it from PACKET_AUXDATA is the ports' job): the frame is not the one on the wire."""
    if tags[0] not in (0x8100, 0x88A8) or not fabric.target.startswith("embedded"):
        return False
    if not hasattr(fabric, "keeps_tags"):
        s, d = fabric.hosts["w1_0"], fabric.hosts["w2_0"]
        frame = bytes(Ether(src=s.mac, dst=d.mac) / IP(src=s.ip, dst=d.ip, proto=253) / (b"t" * 30))
        fabric.send("w1_0", tagged(frame, 0x8100))
        fabric.keeps_tags = not any(fabric.collect(0, grace=0.3).values())
    return not fabric.keeps_tags
