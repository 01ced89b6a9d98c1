"""What traced code calls: one DEBUG line per parser state, extracted header, table lookup,
register write and counter update on the "softswitch.trace" logger (the engine adds the
packet's arrival, egress ports and drop reason). Names come from the JSON as data and are
shown with repr(), so a line stays one line."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..tables import Table

if TYPE_CHECKING:
    from .program import ProgramBuilder

trace_log = logging.getLogger("softswitch.trace")


class Tracer:
    def __init__(self, builder: ProgramBuilder, tables: dict[str, Table]):
        self.states = builder.state_names
        self.headers = list(builder.layout.headers)
        self.tables = [tables[name] for name in builder.table_specs]
        self.registers = list(builder.registers)
        self.counters = list(builder.counters)
        self.param_names = {aid: [rd.get("name", f"p{i}") for i, rd in enumerate(a.get("runtime_data", []))]
                            for aid, a in builder.actions.items()}
        self.errors = {code: name for name, code in builder.errors.items()}
        self.packet = 0  # numbers the lines of one packet, as BMv2's packet id

    def state(self, i: int) -> None:
        trace_log.debug("pkt %d: parser state %r", self.packet, self.states[i])

    def extract(self, i: int) -> None:
        trace_log.debug("pkt %d: extracted header %r", self.packet, self.headers[i])

    def parser_error(self, code: int) -> None:
        trace_log.debug("pkt %d: parser error %s", self.packet, self.errors.get(code, code))

    def table(self, i: int, result) -> None:
        table = self.tables[i]
        hit, action_id, _, args, _ = result
        spec = table.actions.get(action_id)
        params = ", ".join(f"{n}={v:#x}" for n, v in zip(self.param_names.get(action_id, []), args))
        trace_log.debug("pkt %d: table %r: %s, action %r(%s)", self.packet, table.name,
                        "hit" if hit else "miss", spec.name if spec else "NoAction", params)

    def reg(self, i: int, index: int, value: int) -> None:
        trace_log.debug("pkt %d: register %r[%d] <- %d", self.packet, self.registers[i], index, value)

    def count(self, i: int, index: int) -> None:
        trace_log.debug("pkt %d: counter %r[%d] += 1", self.packet, self.counters[i], index)
