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
    PARAM_CHUNKS_MAX,
    PROTOCOL_VERSION,
    UDP_LEN,
    UDP_PORT,
    K,
    Kind,
    frame_len,
    param_frame_len,
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


#: decode's checks of a frame of the right length, in the order they run: (reason, offset, bytes,
#: the big-endian value they must hold); row_checks adds the kind's. The node's compiled receive
#: checks run the same table (host_agent/node_socket.py).
HEADER_CHECKS: tuple[tuple[str, int, int, int], ...] = (
    ("ethertype", 12, 2, ETHERTYPE_IPV4),
    ("ipv4", 14, 1, 0x45),  # version 4, no options
    ("udp", 23, 1, IPPROTO_UDP),
    ("port", 36, 2, UDP_PORT),
    ("version", ETH_LEN + IPV4_LEN + UDP_LEN, 1, PROTOCOL_VERSION),
)


def row_checks(kind: Kind) -> tuple[tuple[str, int, int, int], ...]:
    """HEADER_CHECKS and the check that a frame is of `kind`."""
    return (*HEADER_CHECKS, ("kind", ETH_LEN + IPV4_LEN + UDP_LEN + 1, 1, int(kind)))


#: Why a frame is rejected, in the order the checks run.
REJECT_REASONS = ("length", *(reason for reason, *_ in row_checks(Kind.GRAD)))


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
    elif kind == Kind.PARAM and any(len(f) != length for f in frames):
        widest = param_frame_len(PARAM_CHUNKS_MAX)
        good = [f for f in frames if length <= len(f) <= widest]
        if len(good) != len(frames):
            rejects["length"] += len(frames) - len(good)
        rows = np.zeros((len(good), widest), dtype=np.uint8)
        for row, f in zip(rows, good):
            row[: len(f)] = np.frombuffer(f, dtype=np.uint8)
        arr = split_params(rows, np.array([len(f) for f in good], dtype=np.int64), rejects)
    else:
        good = [f for f in frames if len(f) == length]
        if len(good) != len(frames):
            rejects["length"] += len(frames) - len(good)
        arr = np.frombuffer(b"".join(good), dtype=np.uint8).reshape(len(good), length)
    checks = [(reason, _field(arr, at, size) == value) for reason, at, size, value in row_checks(kind)]
    if kind == Kind.PARAM:  # one chunk's length, yet it says it carries more
        checks.append(("length", _field(arr, _MORE, 2) == 0))
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


def _field(rows: np.ndarray, at: int, size: int) -> np.ndarray:
    """The big-endian unsigned field of `size` bytes at `at` of every row."""
    v = rows[:, at].astype(np.uint32)
    for i in range(1, size):
        v = v << 8 | rows[:, at + i]
    return v


_HEADER = PREFIX_LEN + HEADER_LEN
_MORE = PREFIX_LEN + HEADER_DTYPE.fields["more"][1]
_COUNT = PREFIX_LEN + HEADER_DTYPE.fields["count"][1]


def split_params(rows: np.ndarray, lens: np.ndarray, rejects: collections.Counter) -> np.ndarray:
    """PARAM frames of one chunk or several (the first lens[i] bytes of rows[i]) -> one row of
    frame_len(PARAM) a chunk, in order: a frame carrying 1 + more chunks gives 1 + more rows, each with
    the frame's header, chunk + i and more = 0, and the i-th K elements. A frame longer than one chunk
    whose length is not its `more`'s, or whose count is not K, is counted in rejects["length"]; frames
    of one chunk's length pass as they are (decode checks them)."""
    one, block = frame_len(Kind.PARAM), K * ELEMENT_DTYPE[Kind.PARAM].itemsize
    lens = np.asarray(lens, dtype=np.int64)
    width = rows.shape[1]
    if (lens == one).all():
        return np.ascontiguousarray(rows[:, :one])
    more = _field(rows, _MORE, 2).astype(np.int64)
    count = _field(rows, _COUNT, 2).astype(np.int64)
    extra = lens - one
    several = extra > 0
    ok = (extra == 0) | (several & (extra == more * block) & (more < PARAM_CHUNKS_MAX) & (count == K)
                         & (lens <= width))
    if not ok.all():
        rejects["length"] += int(np.count_nonzero(~ok))
    take = np.flatnonzero(ok)
    chunks = np.where(several[take], more[take] + 1, 1)
    src = np.repeat(take, chunks)
    nth = np.arange(len(src)) - np.repeat(np.cumsum(chunks) - chunks, chunks)
    out = np.empty((len(src), one), dtype=np.uint8)
    out[:, :_HEADER] = rows[src, :_HEADER]
    for i in range(int(chunks.max(initial=1))):
        at = np.flatnonzero(nth == i)
        out[at, _HEADER:] = rows[src[at], _HEADER + i * block : _HEADER + (i + 1) * block]
    hdr = out[:, PREFIX_LEN:_HEADER].view(HEADER_DTYPE).reshape(-1)
    hdr["chunk"] += nth.astype(np.uint32)
    hdr["more"][several[src]] = 0
    return out


@dataclass
class ParamFrames:
    """PARAM frames in the order of their first chunks: row i holds frame i in its first lens[i]
    bytes and carries chunks[i] chunks."""

    frames: np.ndarray
    lens: np.ndarray
    chunks: np.ndarray


def param_frames(headers: np.ndarray, elements: np.ndarray, addrs: Addresses) -> ParamFrames:
    """PARAM answers (headers (n,), elements (n, K)) -> frames, consecutive full chunks of one step,
    job and flags sharing a frame up to PARAM_CHUNKS_MAX, each with its first chunk's header and
    `more` set. In chunk order, as the answers came: a worker takes a later chunk answered before
    an earlier one for a sign of loss (fast retransmit)."""
    h = np.asarray(headers, dtype=HEADER_DTYPE)
    n = len(h)
    full = h["count"] == K
    joins = np.zeros(n, dtype=bool)
    joins[1:] = (full[1:] & full[:-1] & (h["chunk"][1:] == h["chunk"][:-1] + 1) & (h["step"][1:] == h["step"][:-1])
                 & (h["job"][1:] == h["job"][:-1]) & (h["flags"][1:] == h["flags"][:-1]))
    run_start = np.maximum.accumulate(np.where(joins, 0, np.arange(n))) if n else np.zeros(0, np.int64)
    starts = np.flatnonzero((np.arange(n) - run_start) % PARAM_CHUNKS_MAX == 0)
    sizes = np.diff(np.append(starts, n))
    out = ParamFrames(np.empty((len(starts), param_frame_len(int(sizes.max(initial=1)))), np.uint8),
                      np.array([param_frame_len(int(c)) for c in range(PARAM_CHUNKS_MAX + 1)])[sizes], sizes)
    for size in np.unique(sizes).tolist():
        at = np.flatnonzero(sizes == size)
        first = starts[at]
        hdr = h[first].copy()
        hdr["more"] = size - 1
        rows = first if size == 1 else (first[:, None] + np.arange(size)).ravel()
        vals = np.asarray(elements)[rows].reshape(len(first), size * K)
        out.frames[at, : param_frame_len(size)] = encode(Kind.PARAM, hdr, vals, addrs, k=size * K)
    return out


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
