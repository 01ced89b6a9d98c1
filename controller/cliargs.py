"""mindp-ctl's argument types: each parses one option's text or says, in one line, what it expects."""

from __future__ import annotations

import argparse

from .p4runtime import MAX_SECONDS

U64_MAX = (1 << 64) - 1  # P4Runtime's device id and each half of an election id are uint64


def election_id(text: str) -> tuple[int, int]:
    try:
        parts = [int(x, 0) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad election id {text!r}: expected HIGH,LOW or LOW") from None
    if len(parts) == 1:
        parts = [0, parts[0]]
    if len(parts) != 2 or min(parts) < 0 or parts == [0, 0]:
        raise argparse.ArgumentTypeError(f"bad election id {text!r}: expected HIGH,LOW (not 0,0)")
    if max(parts) > U64_MAX:
        raise argparse.ArgumentTypeError(f"bad election id {text!r}: HIGH and LOW must be 0..{U64_MAX}")
    return parts[0], parts[1]


def device_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, not {text!r}") from None
    if not 0 <= value <= U64_MAX:
        raise argparse.ArgumentTypeError(f"must be 0..{U64_MAX}, not {text}")
    return value


def host_port(text: str) -> tuple[str, int]:
    """'HOST:PORT' (HOST default 127.0.0.1) -> (host, port)."""
    host, _, port = text.rpartition(":")
    try:
        value = int(port)
    except ValueError:
        value = 0
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"bad address {text!r}: expected HOST:PORT, PORT 1..65535")
    return host or "127.0.0.1", value


def worker_map(text: str) -> dict[int, str]:
    """'0=w1_0,1=w1_1' or 'w1_0,w1_1' (ids 0, 1, ...); every id and host once."""
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise argparse.ArgumentTypeError("no workers given")
    if "" in items:
        raise argparse.ArgumentTypeError(f"empty worker in {text!r}: expected ID=HOST,...")
    explicit = ["=" in item for item in items]
    if any(explicit) and not all(explicit):
        raise argparse.ArgumentTypeError(f"give every worker as ID=HOST or none ({text!r} mixes both)")
    out: dict[int, str] = {}
    for i, item in enumerate(items):
        wid, _, host = item.partition("=") if explicit[i] else (str(i), "=", item)
        try:
            w = int(wid)
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad worker {item!r}: expected ID=HOST with an integer ID") from None
        if w < 0 or not host:
            raise argparse.ArgumentTypeError(f"bad worker {item!r}: expected ID=HOST, ID >= 0")
        if w in out:
            raise argparse.ArgumentTypeError(f"worker id {w} given twice ({out[w]} and {host})")
        if host in out.values():
            raise argparse.ArgumentTypeError(f"host {host} given for two worker ids")
        out[w] = host
    return out


def _positive(text: str, kind: type, expected: str, must: str, most: float = float("inf")) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, not {text!r}") from None
    if not 0 < value <= most:  # NaN too
        raise argparse.ArgumentTypeError(f"must be {must}, not {text}")
    return value


def positive_float(text: str) -> float:
    return _positive(text, float, "a number of seconds", f"a positive number of seconds, at most {MAX_SECONDS:g}",
                     MAX_SECONDS)


def positive_int(text: str) -> int:
    return _positive(text, int, "a positive integer", "a positive integer")
