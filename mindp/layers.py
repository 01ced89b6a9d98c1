"""Scapy layers for mindp: the readable reference of the wire format.

Importing this module binds the layers to mindp's UDP port, so
`Ether(raw_bytes)` dissects a captured frame. Field list, widths and element
types come from `mindp.protocol`.
"""
from __future__ import annotations

import struct

import numpy as np
from scapy.fields import (
    ByteField,
    FieldListField,
    IntField,
    LongField,
    ShortField,
    SignedLongField,
)
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, bind_layers

from .protocol import HEADER_FIELDS, INT64_KINDS, PARAM_CHUNKS_MAX, K, MAX_K, UDP_PORT, Header, Kind

_FIELD_BY_WIDTH = {8: ByteField, 16: ShortField, 32: IntField, 64: LongField}


class Fp16Field(ShortField):
    """An fp16 element kept as its raw 16 bits (so NaN payloads survive), shown as a float."""

    def i2repr(self, pkt, x):
        return repr(struct.unpack("!e", struct.pack("!H", x))[0])


class Mindp(Packet):
    name = "mindp"
    fields_desc = [_FIELD_BY_WIDTH[w](name, 0) for name, w in HEADER_FIELDS]

    def guess_payload_class(self, payload):
        if self.kind in (Kind.GRAD, Kind.PARAM):
            return Fp16Chunk
        if self.kind in INT64_KINDS:
            return Int64Chunk
        return Packet.guess_payload_class(self, payload)


def _fp16_count(pkt) -> int:
    """K, or K for each chunk of a PARAM carrying several (the header's `more`)."""
    under = pkt.underlayer
    return K * (1 + under.more) if isinstance(under, Mindp) and under.kind == Kind.PARAM else K


class Fp16Chunk(Packet):
    """K fp16 elements: a gradient or a parameter chunk (a PARAM's several chunks, K each)."""

    name = "mindp fp16 chunk"
    fields_desc = [FieldListField("elements", [0] * K, Fp16Field("e", 0), count_from=_fp16_count,
                                  max_count=MAX_K * PARAM_CHUNKS_MAX)]


class Int64Chunk(Packet):
    """K int64 elements: exact sums (or a leaf's partial sums) at scale 2**24."""

    name = "mindp int64 chunk"
    fields_desc = [FieldListField("elements", [0] * K, SignedLongField("e", 0), count_from=lambda pkt: K, max_count=MAX_K)]


bind_layers(UDP, Mindp, dport=UDP_PORT)
bind_layers(UDP, Mindp, sport=UDP_PORT)


def elements_layer(kind: int, elements: np.ndarray, chunks: int = 1) -> Packet:
    """The element layer for `kind` holding `elements` padded with zeros to K (a PARAM: to K for each
    of its `chunks`)."""
    if Kind(kind) in INT64_KINDS:
        vals = np.zeros(K, dtype=np.int64)
        vals[: len(elements)] = elements
        return Int64Chunk(elements=[int(v) for v in vals])
    bits = np.zeros(K * chunks, dtype=np.uint16)
    bits[: len(elements)] = np.asarray(elements, dtype=np.float16).view(np.uint16)
    return Fp16Chunk(elements=[int(v) for v in bits])


def build_frame(
    header: Header,
    elements: np.ndarray,
    *,
    src_mac: str,
    dst_mac: str,
    src_ip: str,
    dst_ip: str,
    ip_id: int = 0,
) -> Packet:
    """A whole mindp frame, built field by field with Scapy (slow; the reference)."""
    return (
        Ether(src=src_mac, dst=dst_mac)
        / IP(src=src_ip, dst=dst_ip, id=ip_id, flags="DF", ttl=64)
        / UDP(sport=UDP_PORT, dport=UDP_PORT, chksum=0)
        / Mindp(**{name: getattr(header, name) for name, _ in HEADER_FIELDS})
        / elements_layer(header.kind, elements, 1 + header.more)
    )
