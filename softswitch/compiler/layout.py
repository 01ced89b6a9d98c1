"""Where each header field lives in the flat packet state `f` (a list of ints): per header
instance its validity slot followed by its fields (metadata headers are always valid), then
hidden slots (ingress length, packet length register, one next-index per header stack)."""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from ..compiler_errors import ProgramError, UnsupportedConstruct


def hex_value(text: str) -> int:
    """A BMv2 hexstr ("0x0a", "-0x1") as an int."""
    negative = text.startswith("-")
    value = int(text[1:] if negative else text, 16)
    return -value if negative else value


@dataclass
class HeaderLayout:
    name: str
    valid: int  # slot of the validity bit; fields follow
    fields: list[tuple[str, int, bool]]  # (name, width, signed)
    metadata: bool
    _index: dict | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def first(self) -> int:
        return self.valid + 1

    @property
    def end(self) -> int:
        return self.valid + 1 + len(self.fields)

    @property
    def nbits(self) -> int:
        return sum(w for _, w, _ in self.fields)

    def index(self, field_name: str) -> int:
        if self._index is None:  # a dict, not a scan: a chunk header has K fields, each looked up
            self._index = {name: self.first + i for i, (name, _, _) in enumerate(self.fields)}
        try:
            return self._index[field_name]
        except KeyError:
            raise ProgramError(f"header {self.name!r} has no field {field_name!r}") from None


@dataclass
class FieldLayout:
    headers: dict[str, HeaderLayout]
    widths: list[int]  # per slot (validity: 1)
    signed: list[bool]
    nslots: int
    ilen: int  # hidden slot: ingress length (counter bytes)
    plen: int  # hidden slot: packet length register (add/remove_header)
    aliases: dict[str, tuple[str, str]] = field(default_factory=dict)
    # header stack -> (hidden slot of its next index, its element headers in order)
    stacks: dict[str, tuple[int, list[HeaderLayout]]] = field(default_factory=dict)

    def stack(self, name: str) -> tuple[int, list[HeaderLayout]]:
        if name not in self.stacks:
            raise ProgramError(f"unknown header stack {name!r}")
        return self.stacks[name]

    def field(self, ref) -> int:
        header_name, field_name = ref
        header = self.headers.get(header_name)
        if header is None:
            raise ProgramError(f"unknown header instance {header_name!r}")
        if field_name == "$valid$":
            return header.valid
        return header.index(field_name)

    def intrinsic(self, field_name: str) -> int | None:
        """A v1model intrinsic field, through field_aliases (e.g. intrinsic_metadata.mcast_grp)."""
        for alias, target in self.aliases.items():
            if alias.endswith("." + field_name):
                return self.field(target)
        header = self.headers.get("standard_metadata")
        if header and any(name == field_name for name, _, _ in header.fields):
            return header.index(field_name)
        return None


def build_layout(j: dict) -> FieldLayout:
    types = {}
    for header_type in j.get("header_types", []):
        fields = []
        for field_def in header_type["fields"]:
            name, width = field_def[0], field_def[1]
            signed = bool(field_def[2]) if len(field_def) > 2 else False
            if not isinstance(width, int):
                raise UnsupportedConstruct(f"varbit field {header_type['name']!r}.{name!r}")
            if name == "$valid$":
                continue
            fields.append((name, width, signed))
        types[header_type["name"]] = fields
    headers: dict[str, HeaderLayout] = {}
    widths: list[int] = []
    signed: list[bool] = []
    for h in j.get("headers", []):
        if h["header_type"] not in types:
            raise ProgramError(f"header {h['name']!r}: unknown type {h['header_type']!r}")
        header = HeaderLayout(h["name"], len(widths), types[h["header_type"]], bool(h.get("metadata")))
        headers[h["name"]] = header
        widths.append(1)
        signed.append(False)
        for _, width, is_signed in header.fields:
            widths.append(width)
            signed.append(is_signed)
    ilen = len(widths)
    plen = ilen + 1
    widths += [32, 32]
    signed += [False, False]
    by_id = {h["id"]: h["name"] for h in j.get("headers", [])}
    stacks = {}
    for stack in j.get("header_stacks", []):
        elements = [headers[by_id[i]] for i in stack["header_ids"]]
        if any([w for _, w, _ in e.fields] != [w for _, w, _ in elements[0].fields] for e in elements):
            raise ProgramError(f"header stack {stack['name']!r}: elements of different types")
        stacks[stack["name"]] = (len(widths), elements)
        widths.append(32)
        signed.append(False)
    aliases = {a[0]: tuple(a[1]) for a in j.get("field_aliases", [])}
    return FieldLayout(headers, widths, signed, len(widths), ilen, plen, aliases, stacks)


_UNSIGNED = {8: "B", 16: "H", 32: "I", 64: "Q"}
_SIGNED = {8: "b", 16: "h", 32: "i", 64: "q"}


def header_struct(header: HeaderLayout) -> struct.Struct | None:
    """A struct for headers made only of 8/16/32/64-bit fields: one C call packs or unpacks them."""
    if header.metadata or not header.fields or not all(w in _UNSIGNED for _, w, _ in header.fields):
        return None
    return struct.Struct("!" + "".join((_SIGNED if s else _UNSIGNED)[w] for _, w, s in header.fields))
