"""What generated code runs with: the helpers it calls, the builtins it may use, and the
audit that the compiled code names nothing and holds no constant the compiler did not make."""
from __future__ import annotations

import hashlib
import importlib.util
import marshal
import re
import types

from .. import diskcache
from ..compiler_errors import ProgramError

SHIFT_CAP = 1 << 13  # runtime shift amounts beyond any field width all give 0 after masking


def div(a, b):
    return a // b if b > 0 and a >= 0 else 0


def mod(a, b):
    return a % b if b > 0 and a >= 0 else 0


def shl(a, b):
    return a << b if b < SHIFT_CAP else 0


def shr(a, b):
    return a >> b if b < SHIFT_CAP else (-1 if a < 0 else 0)


class ParserError(Exception):
    """A parser error; `off` is where the packet's payload starts (bytes extracted so far)."""

    def __init__(self, code: int, off: int):
        self.code = code
        self.off = off


class PipelineExit(Exception):
    """The exit statement: leaves the current pipeline."""


def lookahead(data, off, bit_off, width, too_short):
    start = off + bit_off // 8
    end = off + (bit_off + width + 7) // 8
    if end > len(data):
        raise ParserError(too_short, off)
    v = int.from_bytes(data[start:end], "big")
    return (v >> ((end - start) * 8 - bit_off % 8 - width)) & ((1 << width) - 1)


def base_namespace() -> dict:
    return {
        "__builtins__": {"min": min, "max": max, "len": len, "int": int},
        "_div": div, "_mod": mod, "_shl": shl, "_shr": shr, "_lookahead": lookahead,
        "PErr": ParserError, "_Exit": PipelineExit,
    }


# What compiled code may name besides the compiler's own `[A-Z]+_<n>` objects, `_t<n>`
# temporaries and its namespace, and the only constants it may hold besides integers:
# nothing of the JSON's text.
_GENERATED_NAME = re.compile(r"(?:[A-Z]{1,2}_\d+|_t\d+)\Z")
CODE_NAMES = frozenset({
    "<module>", "f", "a", "data", "off", "v", "n", "k", "pad", "out", "st", "e", "_r", "_aid", "_nv", "_n",
    "pipe_ingress", "pipe_egress", "parse", "deparse", "min", "max", "len", "int",
    "d", "get", "miss", "lookup", "unpack_from", "pack", "to_bytes", "from_bytes", "append", "randint",
    "code", "join", "state", "extract", "table", "reg", "count", "parser_error",
})
_CODE_STRINGS = ("big", b"")


def audit(code: types.CodeType, allowed: frozenset) -> None:
    """Refuse compiled code naming anything or holding a constant the compiler did not make."""
    for name in (code.co_name,) + code.co_names + code.co_varnames + code.co_cellvars + code.co_freevars:
        if name not in allowed and not _GENERATED_NAME.match(name):
            raise ProgramError(f"internal: generated code uses the name {name[:40]!r}")
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            audit(const, allowed)
        elif isinstance(const, tuple):
            if not all(type(x) is int for x in const):
                raise ProgramError("internal: generated code holds a constant that is not an integer")
        elif not (const is None or type(const) in (int, bool) or const in _CODE_STRINGS):
            raise ProgramError("internal: generated code holds a constant that is not an integer")


def run(source: str, ns: dict) -> None:
    """Compile, audit and execute generated source into `ns` (it only defines functions)."""
    code = _compiled(source)
    audit(code, CODE_NAMES | set(ns))
    exec(code, ns)


def _compiled(source: str) -> types.CodeType:
    """The bytecode of `source`, from the disk cache when this interpreter compiled the same text
    before (a large K's program: 0.8 s to compile, milliseconds to load), as a .pyc is."""
    name = hashlib.sha256(importlib.util.MAGIC_NUMBER + source.encode()).hexdigest() + ".pycode"
    cached = diskcache.read(name)
    if cached is not None:
        try:
            code = marshal.loads(cached)
            if isinstance(code, types.CodeType):
                return code
        except (EOFError, ValueError, TypeError):
            pass  # written by another interpreter of the same magic number: compiled again, replaced
    try:
        code = compile(source, "<softswitch program>", "exec")
    except (SyntaxError, RecursionError) as exc:
        raise ProgramError(f"internal: generated code does not compile: {exc}") from None
    diskcache.write(name, marshal.dumps(code))
    return code
