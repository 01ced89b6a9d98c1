"""The shape of a BMv2 JSON program, checked before anything is compiled.

Every field the compiler reads has its type checked here (ids, widths and sizes
are ints within bounds, names are strings, hexstrs are hex), so the compiler can
rely on them and a hostile or broken program is refused with a one-line
`ProgramError` naming the JSON path. Fields the compiler does not read are not
looked at. Whether a construct is supported is the compiler's business.
"""
from __future__ import annotations

import re

from ..compiler_errors import ProgramError

MAX_ID = (1 << 31) - 1
MAX_WIDTH = 4096  # bits of one field, parameter, register cell or constant
MAX_CELLS = 1 << 22  # cells of one register or counter array (allocated at load)
MAX_TOTAL_CELLS = 1 << 24
MAX_TABLE_SIZE = 1 << 24
MAX_NAME = 1024
MAX_DEPTH = 64  # nesting of expressions
_HEX = re.compile(r"-?0x[0-9a-fA-F]{1,%d}\Z" % (MAX_WIDTH // 4))


def _show(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _fail(path: str, what: str, v) -> None:
    raise ProgramError(f"{path or 'program'}: expected {what}, got {_show(v)}")


class Shape:
    def check(self, v, path: str, depth: int = 0) -> None:
        raise NotImplementedError


class Int(Shape):
    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = lo, hi

    def check(self, v, path, depth=0):
        if type(v) is not int or not self.lo <= v <= self.hi:
            _fail(path, f"an integer in [{self.lo}, {self.hi}]", v)


class Str(Shape):
    def check(self, v, path, depth=0):
        if not isinstance(v, str) or len(v) > MAX_NAME:
            _fail(path, f"a string of at most {MAX_NAME} characters", v)


class Hex(Shape):
    def check(self, v, path, depth=0):
        if not isinstance(v, str) or not _HEX.match(v):
            _fail(path, f"a hex string of at most {MAX_WIDTH} bits", v)


class Bool(Shape):
    def check(self, v, path, depth=0):
        if not isinstance(v, bool):
            _fail(path, "true or false", v)


class Const(Shape):
    def __init__(self, value):
        self.value = value

    def check(self, v, path, depth=0):
        if v != self.value or type(v) is not type(self.value):
            _fail(path, repr(self.value), v)


class All(Shape):
    def __init__(self, *shapes: Shape):
        self.shapes = shapes

    def check(self, v, path, depth=0):
        for s in self.shapes:
            s.check(v, path, depth)


class Anything(Shape):
    def check(self, v, path, depth=0):
        pass


class Opt(Shape):
    """The shape, or null."""

    def __init__(self, shape: Shape):
        self.shape = shape

    def check(self, v, path, depth=0):
        if v is not None:
            self.shape.check(v, path, depth)


class Either(Shape):
    def __init__(self, *shapes: Shape):
        self.shapes = shapes

    def check(self, v, path, depth=0):
        errors = []
        for s in self.shapes:
            try:
                s.check(v, path, depth)
                return
            except ProgramError as exc:
                errors.append(str(exc))
        raise ProgramError(errors[0])


class List(Shape):
    def __init__(self, item: Shape):
        self.item = item

    def check(self, v, path, depth=0):
        if not isinstance(v, list):
            _fail(path, "a list", v)
        for i, x in enumerate(v):
            self.item.check(x, f"{path}[{i}]", depth)


class Tuple(Shape):
    """A JSON list of fixed shapes; the last `optional` ones may be missing."""

    def __init__(self, *items: Shape, optional: int = 0):
        self.items = items
        self.optional = optional

    def check(self, v, path, depth=0):
        n = len(self.items)
        if not isinstance(v, list) or not n - self.optional <= len(v) <= n:
            _fail(path, f"a list of {n - self.optional}..{n} items" if self.optional else f"a list of {n} items", v)
        for i, (x, s) in enumerate(zip(v, self.items)):
            s.check(x, f"{path}[{i}]", depth)


class Map(Shape):
    """A JSON object with names as keys."""

    def __init__(self, value: Shape):
        self.value = value

    def check(self, v, path, depth=0):
        if not isinstance(v, dict):
            _fail(path, "an object", v)
        for k, x in v.items():
            Str().check(k, f"{path} key")
            self.value.check(x, f"{path}[{k!r}]", depth)


class Obj(Shape):
    """A JSON object; `required` keys must be present, `optional` ones may be missing or null."""

    def __init__(self, required: dict | None = None, optional: dict | None = None):
        self.required = required or {}
        self.optional = optional or {}

    def check(self, v, path, depth=0):
        if not isinstance(v, dict):
            _fail(path, "an object", v)
        for k, s in self.required.items():
            if k not in v:
                raise ProgramError(f"{path}: missing {k!r}")
            s.check(v[k], f"{path}.{k}", depth)
        for k, s in self.optional.items():
            if v.get(k) is not None:
                s.check(v[k], f"{path}.{k}", depth)


ID = Int(0, MAX_ID)
NAME = Str()
WIDTH = Int(1, MAX_WIDTH)
FIELD_REF = Tuple(NAME, NAME)


class Operand(Shape):
    """A typed value {"type": ..., "value": ...}: expressions, fields, constants, parameters."""

    def check(self, v, path, depth=0):
        if depth > MAX_DEPTH:
            raise ProgramError(f"{path}: expression nested deeper than {MAX_DEPTH}")
        Obj({"type": NAME}).check(v, path)
        if "value" not in v:
            raise ProgramError(f"{path}: missing 'value'")
        shape = OPERAND_VALUES.get(v["type"], Anything())
        shape.check(v["value"], f"{path}.value", depth + 1)


class Expression(Shape):
    """The value of an "expression" operand: an operator node, or another operand."""

    def check(self, v, path, depth=0):
        if depth > MAX_DEPTH:
            raise ProgramError(f"{path}: expression nested deeper than {MAX_DEPTH}")
        if isinstance(v, dict) and "op" in v:
            Obj({"op": NAME}, {"left": OPERAND, "right": OPERAND, "cond": OPERAND}).check(v, path, depth + 1)
        else:
            OPERAND.check(v, path, depth + 1)


OPERAND = Operand()
OPERAND_VALUES = {
    "expression": Expression(),
    "field": FIELD_REF,
    "stack_field": FIELD_REF,
    "hexstr": Hex(),
    "bool": Bool(),
    "runtime_data": Int(0, 1024),
    "local": Int(0, 1024),
    "header": NAME, "header_stack": NAME, "regular": NAME, "stack": NAME,
    "calculation": NAME, "counter_array": NAME, "register_array": NAME, "meter_array": NAME,
    "lookahead": Tuple(Int(0, 8 * 65536), WIDTH),
    "register": Tuple(NAME, OPERAND),
}
PRIMITIVE = Obj({"op": NAME}, {"parameters": List(OPERAND)})

FIELD_DEF = Tuple(NAME, Either(WIDTH, Const("*")), Bool(), optional=1)  # "*": varbit
TABLE = Obj({"name": NAME, "id": ID, "action_ids": List(ID), "actions": List(NAME)}, {
    "type": NAME,
    "max_size": Int(0, MAX_TABLE_SIZE),
    "with_counters": Bool(),
    "key": List(Obj({"match_type": NAME, "target": Either(FIELD_REF, NAME)}, {"name": NAME, "mask": Hex()})),
    "next_tables": Map(Opt(NAME)),
    "base_default_next": NAME,
    "default_entry": Obj({"action_id": ID}, {"action_data": List(Hex()), "action_const": Bool()}),
})
PIPELINE = Obj({"name": NAME}, {
    "id": ID,
    "init_table": NAME,
    "tables": List(TABLE),
    "conditionals": List(Obj({"name": NAME, "expression": OPERAND},
                             {"id": ID, "true_next": NAME, "false_next": NAME})),
    "action_calls": List(Obj({"name": NAME, "action_id": ID}, {"id": ID, "next_node": NAME})),
})
PARSE_STATE = Obj({"name": NAME}, {
    "id": ID,
    "parser_ops": List(Obj({"op": NAME}, {"parameters": List(Either(OPERAND, PRIMITIVE))})),
    "transition_key": List(OPERAND),
    "transitions": List(Obj({"type": NAME}, {"value": Hex(), "mask": Hex(), "next_state": NAME})),
})
PROGRAM = Obj({
    "headers": List(Obj({"name": NAME, "id": ID, "header_type": NAME}, {"metadata": Bool()})),
    "pipelines": List(PIPELINE),
}, {
    "header_types": List(Obj({"name": NAME, "fields": List(FIELD_DEF)}, {"id": ID})),
    "header_stacks": List(Obj({"name": NAME, "header_ids": List(ID)}, {"id": ID, "size": Int(0, MAX_ID)})),
    "field_aliases": List(Tuple(NAME, FIELD_REF)),
    "errors": List(Tuple(NAME, Int(0, MAX_ID))),
    "register_arrays": List(Obj({"name": NAME, "size": Int(0, MAX_CELLS), "bitwidth": WIDTH}, {"id": ID})),
    "counter_arrays": List(Obj({"name": NAME},
                               {"id": ID, "size": Int(0, MAX_CELLS), "is_direct": Bool(), "binding": NAME})),
    "calculations": List(Obj({"name": NAME, "algo": NAME, "input": List(All(OPERAND, Obj({}, {"bitwidth": WIDTH})))},
                             {"id": ID})),
    "actions": List(Obj({"name": NAME, "id": ID}, {"runtime_data": List(Obj({"bitwidth": WIDTH}, {"name": NAME})),
                                                   "primitives": List(PRIMITIVE)})),
    "parsers": List(Obj({"name": NAME, "init_state": NAME, "parse_states": List(PARSE_STATE)}, {"id": ID})),
    "deparsers": List(Obj({"name": NAME}, {"id": ID, "order": List(NAME)})),
    "checksums": List(Obj({"name": NAME, "target": FIELD_REF, "calculation": NAME},
                          {"id": ID, "type": NAME, "verify": Bool(), "update": Bool(), "if_cond": OPERAND})),
})


def check(j) -> None:
    """Raise ProgramError unless `j` has the shape of a BMv2 JSON program in every field the compiler reads."""
    if not isinstance(j, dict) or "headers" not in j or "pipelines" not in j:
        raise ProgramError("not a BMv2 JSON program (no headers/pipelines)")
    PROGRAM.check(j, "")
    cells = sum(r["size"] for r in j.get("register_arrays") or [])
    cells += sum(c.get("size") or 0 for c in j.get("counter_arrays") or []) * 2
    if cells > MAX_TOTAL_CELLS:
        raise ProgramError(f"register and counter arrays hold {cells} cells, more than {MAX_TOTAL_CELLS}")
