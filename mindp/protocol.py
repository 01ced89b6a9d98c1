"""The mindp wire format: the one source of truth.

Every other part derives its view of the packet from this module: the Scapy
layers (`mindp.layers`), the numpy codec (`mindp.codec`), the P4 program's
constants (checked against `p4src/` by the tests) and the embedded switch tests.
docs/PROTOCOL.md explains the format in prose.
"""
from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

PROTOCOL_VERSION = 1

#: UDP port of mindp, source and destination (0xC0DE, in the dynamic range).
UDP_PORT = 49374

#: K, the elements a frame carries, is a parameter of a switch build (docs/PROTOCOL.md, "Choosing K"):
#: the P4 program is compiled for one K (p4src/compiled/k<K>/) and every host of a run uses the same.
#: A process takes it from MINDP_K (`make run K=...` sets it for all of a run's processes), else
#: DEFAULT_K. HARDWARE_K is the size a Tofino-class pipeline's stateful ALUs bound (SwitchML, ATP),
#: and BMv2's default, since BMv2 interprets every element. DEFAULT_K, the embedded switch's, is the
#: largest power of two whose SUM frames (8,258 bytes) fit a data-centre link's 9,000-byte MTU.
HARDWARE_K = 32
DEFAULT_K = 1024
#: The largest K: a SUM frame (K int64) must fit an IPv4 datagram and a 64 KiB veth MTU.
MAX_K = 8000
K_ENV = "MINDP_K"


def k_error(text: str) -> str | None:
    """Why `text` is no K (None if it is one): K is a multiple of 8 (the hosts' vector code takes 8
    elements at a time) in 8..MAX_K."""
    if not text.isdigit() or not 8 <= int(text) <= MAX_K or int(text) % 8:
        return f"elements per frame must be a multiple of 8 in 8..{MAX_K}"
    return None


def k_from_env(environ: Mapping[str, str] = os.environ) -> int:
    """MINDP_K as an int (k_error's rule), else DEFAULT_K; anything else exits with one line."""
    text = environ.get(K_ENV, "").strip()
    if not text:
        return DEFAULT_K
    if (error := k_error(text)) is not None:
        raise SystemExit(f"{K_ENV}={text!r}: {error}")
    return int(text)


#: Elements per chunk in this process (the switch it talks to must be compiled for the same K).
K = k_from_env()

#: Fixed-point scale: an fp16 value x is carried through the switch as x * 2**24.
SCALE_BITS = 24

#: Width of the per-slot worker bitmap in the switch: worker ids are 0..31.
MAX_WORKERS = 32


class Kind(enum.IntEnum):
    GRAD = 1  # worker -> switch: K fp16 gradient elements
    SUM = 2  # switch -> optimizer node: K int64 exact sums
    PARAM = 3  # optimizer node -> switch -> workers: K fp16 parameters
    PARTIAL = 4  # leaf switch -> parent switch: K int64 exact partial sums (docs/PROTOCOL.md, tree)


#: Shards of a sharded job agree that a step is non-finite node to node (host_agent/shards.py):
#: a NOTICE (job, step), resent until the peer answers an ACK, as plain UDP/IPv4 on this port.
SHARD_NOTICE_PORT = UDP_PORT + 1
SHARD_NOTICE, SHARD_ACK = b"MINDPNF1", b"MINDPNA1"
SHARD_NOTICE_FORMAT = "!8sHI"  # magic, job, step


class Flag(enum.IntFlag):
    NONE = 0
    NONFINITE = 0x01  # an element was Inf/NaN (in any contribution, for SUM)
    RETRANSMIT = 0x02  # sent again after a timeout, or a sum/params resent


#: Header fields in wire order: (name, width in bits). Big-endian on the wire.
HEADER_FIELDS: tuple[tuple[str, int], ...] = (
    ("version", 8),
    ("kind", 8),
    ("flags", 8),
    ("ver", 8),  # slot version (0 or 1) of this use of the slot
    ("job", 16),
    ("worker", 16),  # sender's worker id (GRAD); child index at the parent (PARTIAL); last contributor (SUM)
    ("slot", 16),  # slot index relative to the job's slot range
    ("count", 16),  # valid elements in this chunk (<= K); the rest is padding
    ("step", 32),
    ("chunk", 32),
    ("nworkers", 16),  # SUM, PARTIAL: contributions (workers' gradients) in the sum; else 0
    ("more", 16),  # PARAM: chunks it carries after `chunk` (0..PARAM_MORE_MAX); else 0
)

HEADER_LEN = sum(w for _, w in HEADER_FIELDS) // 8

#: numpy view of the header, for batch encode/decode without Python loops.
HEADER_DTYPE = np.dtype([(name, f">u{w // 8}") for name, w in HEADER_FIELDS])
assert HEADER_DTYPE.itemsize == HEADER_LEN

#: Element encoding per kind: big-endian fp16 bits or big-endian int64.
ELEMENT_DTYPE = {Kind.GRAD: np.dtype(">f2"), Kind.PARAM: np.dtype(">f2"), Kind.SUM: np.dtype(">i8"),
                 Kind.PARTIAL: np.dtype(">i8")}

#: Kinds whose elements are exact int64 sums (the rest carry fp16).
INT64_KINDS = frozenset(k for k, dt in ELEMENT_DTYPE.items() if dt.kind == "i")

#: Chunks one PARAM frame may carry (consecutive, each K elements): as many as make it no longer
#: than a SUM frame, so the links' MTU stays what the sums need. Fewer frames for the node to send,
#: the switch to replicate and the workers to take (docs/PROTOCOL.md, "Parameters, several chunks a
#: frame"). Every chunk of a PARAM carrying more than one is full (count K).
PARAM_CHUNKS_MAX = ELEMENT_DTYPE[Kind.SUM].itemsize // ELEMENT_DTYPE[Kind.PARAM].itemsize
PARAM_MORE_MAX = PARAM_CHUNKS_MAX - 1

ETH_LEN, IPV4_LEN, UDP_LEN = 14, 20, 8
ETHERTYPE_IPV4 = 0x0800
IPPROTO_UDP = 17


def payload_len(kind: Kind, k: int = K) -> int:
    """Bytes after the UDP header: mindp header plus k elements (k other than K: benches only)."""
    return HEADER_LEN + k * ELEMENT_DTYPE[Kind(kind)].itemsize


def frame_len(kind: Kind, k: int = K) -> int:
    """Length of a whole Ethernet frame of this kind (no FCS)."""
    return ETH_LEN + IPV4_LEN + UDP_LEN + payload_len(kind, k)


def param_frame_len(chunks: int, k: int = K) -> int:
    """Length of a PARAM frame carrying `chunks` chunks of k elements (1..PARAM_CHUNKS_MAX)."""
    return frame_len(Kind.PARAM, chunks * k)


def required_mtu(k: int = K) -> int:
    """The IPv4 MTU a link must have to carry k's largest frame (SUM and PARTIAL: k int64)."""
    return frame_len(Kind.SUM, k) - ETH_LEN


#: BMv2's simple_switch gives a received packet this many bytes to grow by (simple_switch.cpp:
#: PacketBuffer(len + 512)) and aborts beyond them; a GRAD frame grows into a SUM or PARTIAL.
BMV2_HEADROOM = 512


def bmv2_fits(k: int) -> bool:
    """A GRAD frame of k elements may become a SUM in BMv2 (6 more bytes an element)."""
    return frame_len(Kind.SUM, k) - frame_len(Kind.GRAD, k) <= BMV2_HEADROOM


#: The largest K BMv2 runs (a multiple of 8, as every K).
BMV2_MAX_K = max(k for k in range(8, MAX_K + 1, 8) if bmv2_fits(k))


def link_mtu(k: int = K) -> int:
    """The MTU mindp gives the links it creates: Ethernet's 1500 while k's frames fit it with room
    for VLAN tags to spare, else a data-centre jumbo 9000 (or what k's frames need, and the spare)."""
    need = required_mtu(k) + 64
    return 1500 if need <= 1500 else max(9000, need)


@dataclass(frozen=True)
class Header:
    """One mindp header, field for field as on the wire."""

    kind: int
    job: int = 0
    worker: int = 0
    step: int = 0
    chunk: int = 0
    slot: int = 0
    ver: int = 0
    count: int = K
    flags: int = 0
    nworkers: int = 0
    version: int = PROTOCOL_VERSION
    more: int = 0

    def as_tuple(self) -> tuple[int, ...]:
        return tuple(getattr(self, name) for name, _ in HEADER_FIELDS)


@dataclass(frozen=True)
class Endpoint:
    """A host's addresses as the packets carry them."""

    mac: str
    ip: str
