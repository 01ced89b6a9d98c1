"""P4Runtime bytestrings of the embedded switch's P4Runtime server: the error a request's update
fails with (a canonical gRPC code and a message), integers to and from bytestrings, and the
canonical form reads return."""
from __future__ import annotations


class P4RTError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def decode_int(b: bytes, width: int, what: str) -> int:
    if not b:
        raise P4RTError("INVALID_ARGUMENT", f"{what}: empty bytestring")
    v = int.from_bytes(b, "big")
    if v >> width:
        raise P4RTError("INVALID_ARGUMENT", f"{what}: value does not fit in {width} bits")
    return v


def encode_int(v: int, width: int) -> bytes:
    """P4Runtime canonical bytestring: no leading zero bytes, at least one byte."""
    return v.to_bytes(max(1, (v.bit_length() + 7) // 8), "big")


def canonical_bytes(b: bytes) -> bytes:
    return b.lstrip(b"\0") or b"\0"


def canonical_entry(te) -> None:
    """Rewrite a TableEntry's bytestrings in canonical form, as reads return them."""
    for fm in te.match:
        kind = fm.WhichOneof("field_match_type")
        if kind == "exact":
            fm.exact.value = canonical_bytes(fm.exact.value)
        elif kind == "lpm":
            fm.lpm.value = canonical_bytes(fm.lpm.value)
        elif kind == "ternary":
            fm.ternary.value = canonical_bytes(fm.ternary.value)
            fm.ternary.mask = canonical_bytes(fm.ternary.mask)
        elif kind == "range":
            fm.range.low = canonical_bytes(fm.range.low)
            fm.range.high = canonical_bytes(fm.range.high)
        elif kind == "optional":
            fm.optional.value = canonical_bytes(fm.optional.value)
    for p in te.action.action.params:
        p.value = canonical_bytes(p.value)
