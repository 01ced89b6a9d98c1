"""Hash and checksum algorithms of bmv2 calculations (checksums, hash())."""
from __future__ import annotations

import zlib

from . import compiler_errors


def _csum16(b: bytes) -> int:
    if len(b) % 2:
        b += b"\0"
    s = sum(int.from_bytes(b[i:i + 2], "big") for i in range(0, len(b), 2))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def _crc32(b: bytes) -> int:
    return zlib.crc32(b) & 0xFFFFFFFF


def _make_crc16_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xA001 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC16 = _make_crc16_table()


def _crc16(b: bytes) -> int:
    """CRC-16/ARC (poly 0x8005 reflected, init 0), bmv2's crc16."""
    c = 0
    for byte in b:
        c = (c >> 8) ^ _CRC16[(c ^ byte) & 0xFF]
    return c


def _identity(b: bytes) -> int:
    return int.from_bytes(b, "big")


def _xor16(b: bytes) -> int:
    if len(b) % 2:
        b += b"\0"
    x = 0
    for i in range(0, len(b), 2):
        x ^= int.from_bytes(b[i:i + 2], "big")
    return x


ALGOS = {"csum16": _csum16, "crc32": _crc32, "crc16": _crc16, "identity": _identity, "xor16": _xor16}


def hmod(h: int, size: int) -> int:
    """hash()'s result reduced to [0, size) as bmv2 does (size 0: unreduced)."""
    return h % size if size > 0 else h


def check(algo: str, calc_name: str) -> None:
    if algo not in ALGOS:
        raise compiler_errors.UnsupportedConstruct(f"hash algorithm {algo!r} (calculation {calc_name!r})")
