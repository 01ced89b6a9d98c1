"""Fast numpy codec: whole tensors to ready frames and back, no per-element loop.

Its bytes equal Scapy's build of the same packet (`mindp.layers.build_frame`),
field for field; the tests check this. All frames of a batch share one
Ethernet/IPv4/UDP prefix (fixed length, IP id and checksum 0 for UDP), so the
prefix is built once and broadcast.
"""
from __future__ import annotations

import collections
import functools
import ipaddress
import struct
from dataclasses import dataclass, field

import numpy as np

from .protocol import (
    ELEMENT_DTYPE,
    ETH_LEN,
    ETHERTYPE_IPV4,
    HEADER_DTYPE,
    HEADER_LEN,
    INT64_KINDS,
    IPPROTO_UDP,
    IPV4_LEN,
    PROTOCOL_VERSION,
    UDP_LEN,
    UDP_PORT,
    K,
    Kind,
    frame_len,
    payload_len,
)

PREFIX_LEN = ETH_LEN + IPV4_LEN + UDP_LEN


class WireError(ValueError):
    """A frame that is not a well-formed mindp frame of the expected kind.

    `reason` is one of REJECT_REASONS.
    """

    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason
        super().__init__(f"{reason}: {detail}" if detail else reason)


#: Why a frame is rejected, in the order the checks run.
REJECT_REASONS = ("length", "ethertype", "ipv4", "udp", "port", "version", "kind")


@dataclass(frozen=True)
class Addresses:
    """Link and network addresses of one direction of traffic."""

    src_mac: str
    dst_mac: str
    src_ip: str
    dst_ip: str
    ip_id: int = 0


def _mac(mac: str) -> bytes:
    raw = bytes.fromhex(mac.replace(":", ""))
    if len(raw) != 6:
        raise ValueError(f"bad MAC address {mac!r}")
    return raw


def ipv4_checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


@functools.lru_cache(maxsize=64)  # an agent encodes a batch at a time, always to the same few addresses
def frame_prefix(kind: Kind, addrs: Addresses, k: int = K) -> bytes:
    """The Ethernet, IPv4 and UDP headers shared by every frame of a batch."""
    udp_len = UDP_LEN + payload_len(kind, k)
    ip = bytearray(
        struct.pack(
            "!BBHHHBBH4s4s",
            0x45,
            0,
            IPV4_LEN + udp_len,
            addrs.ip_id,
            0x4000,  # don't fragment
            64,
            IPPROTO_UDP,
            0,
            ipaddress.IPv4Address(addrs.src_ip).packed,
            ipaddress.IPv4Address(addrs.dst_ip).packed,
        )
    )
    ip[10:12] = struct.pack("!H", ipv4_checksum(bytes(ip)))
    eth = _mac(addrs.dst_mac) + _mac(addrs.src_mac) + struct.pack("!H", ETHERTYPE_IPV4)
    udp = struct.pack("!HHHH", UDP_PORT, UDP_PORT, udp_len, 0)
    return eth + bytes(ip) + udp


def chunk_tensor(flat: np.ndarray, dtype=np.float16) -> tuple[np.ndarray, np.ndarray]:
    """A flat tensor of any length -> (n_chunks x K elements, zero padded; valid counts)."""
    flat = np.ravel(np.asarray(flat)).astype(dtype, copy=False)
    n = -(-flat.size // K)
    chunks = np.zeros((n, K), dtype=dtype)
    chunks.reshape(-1)[: flat.size] = flat
    counts = np.full(n, K, dtype=np.uint16)
    if n and flat.size % K:
        counts[-1] = flat.size % K
    return chunks, counts


def header_array(n: int, **fields) -> np.ndarray:
    """n headers; each field a scalar (broadcast) or a length-n array. version defaults to ours."""
    hdr = np.zeros(n, dtype=HEADER_DTYPE)
    hdr["version"] = PROTOCOL_VERSION
    hdr["count"] = K
    for name, value in fields.items():
        if name not in HEADER_DTYPE.names:
            raise TypeError(f"unknown header field {name!r}")
        hdr[name] = value
    return hdr


def encode(kind: Kind, headers: np.ndarray, elements: np.ndarray, addrs: Addresses, *, k: int = K) -> np.ndarray:
    """Headers (n,) and elements (n, k) -> frames as an (n, frame_len) uint8 array.

    k is the protocol's K; another k builds frames for a program compiled with it (benches).
    """
    kind = Kind(kind)
    n = len(headers)
    elements = np.asarray(elements)
    if elements.shape != (n, k):
        raise ValueError(f"elements must be ({n}, {k}), got {elements.shape}")
    frames = np.empty((n, frame_len(kind, k)), dtype=np.uint8)
    frames[:, :PREFIX_LEN] = np.frombuffer(frame_prefix(kind, addrs, k), dtype=np.uint8)
    hdr = np.asarray(headers, dtype=HEADER_DTYPE).copy()
    hdr["kind"] = kind
    frames[:, PREFIX_LEN : PREFIX_LEN + HEADER_LEN] = hdr.view(np.uint8).reshape(n, HEADER_LEN)
    # Cast straight into the rows, in one pass (a temporary as large as the batch costs its page
    # faults: 500 a node batch at K = 512, more than the copies).
    frames[:, PREFIX_LEN + HEADER_LEN :].view(ELEMENT_DTYPE[kind])[...] = elements
    return frames


def encode_tensor(
    kind: Kind,
    flat: np.ndarray,
    addrs: Addresses,
    *,
    first_chunk: int = 0,
    **fields,
) -> np.ndarray:
    """A whole flat tensor -> one frame per chunk of K (last one padded, its count recorded).

    `fields` set the other header fields (scalars or per-chunk arrays, e.g. slot and ver).
    """
    dtype = np.int64 if Kind(kind) in INT64_KINDS else np.float16
    chunks, counts = chunk_tensor(flat, dtype)
    n = len(chunks)
    hdr = header_array(n, chunk=np.arange(first_chunk, first_chunk + n, dtype=np.uint32), count=counts, **fields)
    return encode(kind, hdr, chunks, addrs)


@dataclass
class Decoded:
    """Frames of one kind that passed every check, and the count of the others by reason."""

    headers: np.ndarray
    elements: np.ndarray
    rejects: collections.Counter = field(default_factory=collections.Counter)


def decode(frames, kind: Kind) -> Decoded:
    """Received frames (bytes-likes or an (n, L) uint8 array) -> the valid ones of `kind`.

    Invalid frames are never raised on; they are counted in `rejects` by reason.
    """
    kind = Kind(kind)
    length = frame_len(kind)
    rejects: collections.Counter = collections.Counter()
    if isinstance(frames, np.ndarray):
        arr = frames if frames.ndim == 2 and frames.shape[1] == length else None
        if arr is None:
            if len(frames):
                rejects["length"] += len(frames)
            arr = np.empty((0, length), dtype=np.uint8)
    else:
        good = [f for f in frames if len(f) == length]
        if len(good) != len(frames):
            rejects["length"] += len(frames) - len(good)
        arr = np.frombuffer(b"".join(good), dtype=np.uint8).reshape(len(good), length)
    checks = (
        ("ethertype", (arr[:, 12].astype(np.uint16) << 8 | arr[:, 13]) == ETHERTYPE_IPV4),
        ("ipv4", arr[:, 14] == 0x45),
        ("udp", arr[:, 23] == IPPROTO_UDP),
        ("port", (arr[:, 36].astype(np.uint16) << 8 | arr[:, 37]) == UDP_PORT),
        ("version", arr[:, PREFIX_LEN] == PROTOCOL_VERSION),
        ("kind", arr[:, PREFIX_LEN + 1] == kind),
    )
    ok = np.ones(len(arr), dtype=bool)
    for reason, passed in checks:
        bad = ok & ~passed
        if bad.any():
            rejects[reason] += int(bad.sum())
        ok &= passed
    # One pass over the elements: read in place (rows, big-endian), written once in native order.
    # Every copy more allocates fresh memory for each batch, and at large K its page faults cost
    # more than the copies (360 a batch of 512 PARAM frames at K = 512: 11 us a frame).
    return decoded_rows(arr if ok.all() else arr[ok], kind, rejects)


def decoded_rows(arr: np.ndarray, kind: Kind, rejects: collections.Counter) -> Decoded:
    """Rows of `kind` that passed every check of decode -> their headers and native-order elements."""
    arr = np.ascontiguousarray(arr)
    headers = arr[:, PREFIX_LEN : PREFIX_LEN + HEADER_LEN].copy().view(HEADER_DTYPE).reshape(-1)
    body = arr[:, PREFIX_LEN + HEADER_LEN :].view(ELEMENT_DTYPE[kind]).reshape(len(arr), K)
    return Decoded(headers, body.astype(body.dtype.newbyteorder("=")), rejects)


def decode_one(frame: bytes, kind: Kind) -> tuple[np.void, np.ndarray]:
    """One frame -> (header, K elements); raises WireError naming the first failed check."""
    result = decode([frame], kind)
    if not len(result.headers):
        reason = next(iter(result.rejects))
        raise WireError(reason, f"not a mindp {Kind(kind).name} frame of {frame_len(kind)} bytes (got {len(frame)})")
    return result.headers[0], result.elements[0]
