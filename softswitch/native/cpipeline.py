"""Pipelines (ingress, egress) as C: each control-flow node a label, tables looked up in the flat
arrays of state.py, then the v1model packet path (parser, ingress, the packet replication engine,
egress, deparser) over a batch, the counterpart of softswitch.compiler.pipeline and Engine."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..compiler.layout import HeaderLayout, hex_value
from ..compiler.pipeline import ControlFlow, next_nodes
from ..compiler.program import INSTANCE_NORMAL, INSTANCE_REPLICATION
from ..compiler_errors import UnsupportedConstruct
from .cexpr import FIELD_BITS, CExpr

if TYPE_CHECKING:
    from .cprogram import CBuilder

#: stats words mindp_run_batch adds to
STAT_DROPPED, STAT_MCAST_EMPTY, STAT_ERRORS = 0, 1, 2


class CControlFlow:
    def __init__(self, cb: CBuilder, pipeline: dict):
        self.cb = cb
        self.pipeline = pipeline
        self.flow = ControlFlow(cb.py, pipeline)
        self.label = {name: f"L_{i}" for i, name in enumerate(self.flow.nodes)}
        self._check_acyclic()

    def _check_acyclic(self) -> None:
        state: dict = {}
        for root in self.flow.nodes:
            stack = [(root, iter(self.flow.successors(root)))]
            if state.get(root):
                continue
            state[root] = 1
            while stack:
                name, it = stack[-1]
                nxt = next(it, False)
                if nxt is False:
                    state[name] = 2
                    stack.pop()
                elif nxt is not None:
                    if state.get(nxt) == 1:
                        raise UnsupportedConstruct(f"a cycle in pipeline {self.pipeline['name']!r}")
                    if not state.get(nxt):
                        state[nxt] = 1
                        stack.append((nxt, iter(self.flow.successors(nxt))))

    def goto(self, name) -> str:
        return f"goto {self.label[name]};" if name is not None else "goto END;"

    def generate(self) -> None:
        cb = self.cb
        cb.emit(f"static void pipe_{self.pipeline['name']}(uint64_t *f) {{")
        cb.emit("GROUPS", 1)
        cb.emit(self.goto(self.pipeline.get("init_table")), 1)
        for name, (kind, node) in self.flow.nodes.items():
            cb.emit(f"{self.label[name]}: {{", 0)
            if kind == "cond":
                cond = CExpr(cb.exprs).exact(cb.exprs.node(node["expression"]))
                cb.emit(f"if ({cond}) {self.goto(node['true_next'])}", 1)
                cb.emit(self.goto(node["false_next"]), 1)
            elif kind == "call":
                if cb.py.actions[node["action_id"]].get("runtime_data"):
                    raise UnsupportedConstruct(f"a direct call of an action with parameters in {name!r}")
                cb.emit(f"if ({cb.py.action(node['action_id'])}(f, 0)) goto END;", 1)
                cb.emit(self.goto(node["next_node"]), 1)
            else:
                self.table(name, node)
            cb.emit("}", 0)
        cb.emit("END: return;", 0)
        cb.emit("}")

    def table(self, name: str, table: dict) -> None:
        cb = self.cb
        layout = cb.layout
        number = cb.py.table_number[table["name"]]
        t = f"(&C->t[{number}])"
        keys = []
        for key in table.get("key", []):
            if key["match_type"] == "valid":
                keys.append(f"f[{layout.headers[key['target']].valid}]")
                continue
            slot = layout.field(key["target"])
            width = layout.widths[slot]
            if width > FIELD_BITS:
                raise UnsupportedConstruct(f"a table key of {width} bits in {table['name']!r}")
            code = f"f[{slot}]"
            if layout.signed[slot] and width < 64:
                code = f"({code} & {(1 << width) - 1}ULL)"
            if key.get("mask") is not None:
                code = f"({code} & {hex_value(key['mask']) & ((1 << 64) - 1)}ULL)"
            keys.append(code)
        if keys:
            cb.emit(f"uint64_t _k[{len(keys)}] = {{{', '.join(keys)}}};", 1)
            cb.emit(f"int64_t _r = table_lookup({t}, _k);", 1)
        else:
            cb.emit("int64_t _r = -1;", 1)
        cb.emit(f"int64_t _aid = _r >= 0 ? {t}->aid[_r] : {t}->miss_aid;", 1)
        cb.emit(f"const uint64_t *_a = _r >= 0 ? {t}->args + _r * {t}->nargs : {t}->miss_args;", 1)
        cases = " ".join(f"case {aid}: _x = {cb.py.action(aid)}(f, _a); break;" for aid in table["action_ids"])
        cb.emit(f"int _x = 0; (void)_a; switch (_aid) {{ {cases} default: break; }}", 1)
        cb.emit("if (_x) goto END;", 1)
        if table.get("with_counters"):
            cb.emit(f"if (_r >= 0 && {t}->ctr[_r]) {{ uint64_t *_c = (uint64_t *)(uintptr_t){t}->ctr[_r]; "
                    f"_c[0] += 1; _c[1] += f[{layout.ilen}]; }}", 1)
        following = next_nodes(table)
        targets = set(following.values()) or {table.get("base_default_next")}
        if len(targets) == 1:
            cb.emit(self.goto(targets.pop()), 1)
        elif "__HIT__" in following:
            cb.emit(f"if (_r >= 0) {self.goto(following['__HIT__'])}", 1)
            cb.emit(self.goto(following["__MISS__"]), 1)
        else:
            cases = " ".join(f"case {aid}: {self.goto(target)}" for aid, target in following.items())
            cb.emit(f"switch (_aid) {{ {cases} default: break; }}", 1)
            cb.emit(self.goto(self.flow.join_point(name)), 1)


FIXED_REF = re.compile(r"\bf\[(\d+)\]")
STEPPED_REF = re.compile(r"\bf\[\((\d+) ([+-]) (\d+) \* _e\)\]")
LOOP_BOUND = re.compile(r"\b_e < (\d+);")
ZEROED = re.compile(r"memset\(f \+ \d+, 0, \d+\);")  # a header made valid: written, not read
MOVED = re.compile(r"memmove\(f \+ \d+, f \+ (\d+), (\d+)\);")  # a header copied: its source read
#: the fewest slots a zeroing or copy leaves out (1 KB): a call more costs about as much as a shorter run
MIN_GAP = 128
INDIRECT_REF = re.compile(r"\bf \+|\bf\[[^\d(]")  # anything else: a stack's computed index


def may_read(program_text: str, slot: int) -> bool:
    """Whether the program's code may see `slot`: named, in a per-element loop's run, copied, or
    through any other indirect reference (then yes)."""
    if any(int(src) <= slot < int(src) + int(n) // 8 for src, n in MOVED.findall(program_text)):
        return True
    program_text = MOVED.sub("", ZEROED.sub("", program_text))
    if INDIRECT_REF.search(program_text) or slot in {int(c) for c in FIXED_REF.findall(program_text)}:
        return True
    rounds = max(map(int, LOOP_BOUND.findall(program_text)), default=0)  # no loop runs longer
    for base, sign, step in STEPPED_REF.findall(program_text):
        d = (slot - int(base)) * (1 if sign == "+" else -1)
        if d >= 0 and d % int(step) == 0 and d // int(step) < rounds:
            return True
    return False


EXTRACT_LINE = re.compile(r"^\s*f\[(\d+|\(\d+ \+ 1 \* _e\))\] = ([^;]*);$")
LOOP_HEAD = re.compile(r"^\s*for \(int64_t _e = 0; _e < (\d+); _e\+\+\) \{$")


def extracted_whole(cb: CBuilder) -> list[HeaderLayout]:
    """Headers the parser writes only by extracting them whole (no set or primitive names a field,
    nothing but an extract sets the validity bit) and whose fields it never reads: after parse()
    each is valid with every field written, or untouched, so process() zeroes its fields after
    parse() only where it is not valid (a large K's chunk header: 4 KB a frame not written twice)."""
    lines = cb.lines[cb.program_start:]
    start = next((i for i, line in enumerate(lines) if line.startswith("static int64_t parse(")), None)
    if start is None:
        return []
    end = next(i for i in range(start, len(lines)) if lines[i] == "}")
    body = lines[start + 1:end]
    if INDIRECT_REF.search("\n".join(body)) or "memset" in "\n".join(body) or "memmove" in "\n".join(body):
        return []
    reached: list[tuple[set[int], str]] = []  # (slots a line names, the line)
    rounds = 1
    for line in body:
        m = LOOP_HEAD.match(line)
        rounds = int(m.group(1)) if m else rounds
        slots = {int(c) for c in FIXED_REF.findall(line)}
        for base, sign, step in STEPPED_REF.findall(line):
            slots |= {int(base) + (1 if sign == "+" else -1) * int(step) * e for e in range(rounds)}
        reached.append((slots, line))
    in_stacks = {h.name for _, elements in cb.layout.stacks.values() for h in elements}
    whole = []
    for h in cb.layout.headers.values():
        fields = set(range(h.first, h.end))
        if h.metadata or h.name in in_stacks or not fields or fields & cb.parser_writes or \
                any(cb.init[i] for i in fields):
            continue
        ok = True
        for slots, line in reached:
            if slots & fields:
                m = EXTRACT_LINE.match(line)
                ok = ok and m is not None and slots <= fields and not re.search(r"\bf\b", m.group(2))
            if h.valid in slots:
                writes = re.findall(rf"\bf\[{h.valid}\] (\S*)= ([^;]*);", line)
                ok = ok and all(op == "" and value == "1" for op, value in writes)
        if ok:
            whole.append(h)
    return whole


def _live(cb: CBuilder, template: str, skip: set[int] = frozenset()) -> str:
    """`template` (a zeroing or a copy) over the packet state but runs of at least MIN_GAP slots no
    code uses or in `skip`."""
    gaps = _runs(sorted((cb.dead | skip) & set(range(len(cb.init)))))
    out, a = [], 0
    for start, end in [g for g in gaps if g[1] - g[0] >= MIN_GAP] + [(len(cb.init), len(cb.init))]:
        if start > a:
            out.append(template.format(a=a, n=8 * (start - a)))
        a = end
    return " ".join(out)


def _runs(slots: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of consecutive slots."""
    runs: list[tuple[int, int]] = []
    for i in slots:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def generate_packet_path(cb: CBuilder) -> None:
    """process() of one frame and mindp_run_batch(), Engine.run_batch's contract. A timestamp no
    code of the program reads is left unset: its clock read was a tenth of a large K's packet path."""
    s = cb.slots
    drop = cb.py.drop_port
    program_text = "\n".join(cb.lines[cb.program_start:])
    timestamps = {name: s[name] for name in ("ingress_global_timestamp", "egress_global_timestamp")
                  if name in s and may_read(program_text, s[name])}
    cb.emit("typedef struct { uint8_t *buf; int32_t *lens, *ports; int64_t slot, cap, *n; uint64_t *stats; } tx_t;")
    cb.emit("static void egress_one(uint64_t *f, int64_t port, const uint8_t *data, int64_t len, int64_t off, "
            "tx_t *tx) {")
    cb.emit(f"f[{s['egress_port']}] = (uint64_t)port; f[{s['egress_spec']}] = {drop + 1}; "
            f"f[{s['packet_length']}] = f[{cb.layout.plen}];", 1)
    if "egress_global_timestamp" in timestamps:
        cb.emit(f"f[{s['egress_global_timestamp']}] = (uint64_t)now_us(C->t0_ns);", 1)
    cb.emit("pipe_egress(f);", 1)
    cb.emit(f"if (f[{s['egress_spec']}] == {drop}) {{ tx->stats[{STAT_DROPPED}]++; return; }}", 1)
    cb.emit(f"if (*tx->n >= tx->cap) {{ tx->stats[{STAT_ERRORS}]++; return; }}", 1)
    cb.emit("int64_t k = deparse(f, data, len, off, tx->buf + *tx->n * tx->slot, tx->slot);", 1)
    cb.emit(f"if (k < 0) {{ tx->stats[{STAT_ERRORS}]++; return; }}", 1)
    cb.emit("tx->lens[*tx->n] = (int32_t)k; tx->ports[*tx->n] = (int32_t)port; *tx->n += 1;", 1)
    cb.emit("}")

    cb.emit("static void process(const uint8_t *data, int64_t len, int64_t port, tx_t *tx) {")
    # zeroed, then the few nonzero initial values (metadata valid bits): half the memory traffic of
    # copying a constant image of thousands of slots (a large K's fields and temporaries)
    ones = " ".join(f"f[{i}] = {v}ULL;" for i, v in enumerate(cb.init) if v)
    whole = [h for h in extracted_whole(cb) if len(h.fields) >= MIN_GAP]
    later = {i for h in whole for i in range(h.first, h.end)}
    cb.emit(f"uint64_t f[{len(cb.init)}]; {_live(cb, 'memset(f + {a}, 0, {n});', later)} {ones}", 1)
    cb.emit(f"f[{s['ingress_port']}] = (uint64_t)port; f[{s['packet_length']}] = (uint64_t)len; "
            f"f[{cb.layout.ilen}] = (uint64_t)len; f[{cb.layout.plen}] = (uint64_t)len;", 1)
    if "ingress_global_timestamp" in timestamps:
        cb.emit(f"f[{s['ingress_global_timestamp']}] = (uint64_t)now_us(C->t0_ns);", 1)
    cb.emit("int64_t off = parse(f, data, len);", 1)
    for h in whole:
        cb.emit(f"if (!f[{h.valid}]) memset(f + {h.first}, 0, {8 * len(h.fields)});", 1)
    cb.emit("pipe_ingress(f);", 1)
    if "mcast_grp" in s:
        cb.emit(f"if (f[{s['mcast_grp']}]) {{", 1)
        cb.emit(f"f[{s['instance_type']}] = {INSTANCE_REPLICATION};", 2)
        cb.emit(f"int64_t g = pre_find(&C->pre, f[{s['mcast_grp']}]);", 2)
        cb.emit(f"if (g < 0 || C->pre.first[g] == C->pre.first[g + 1]) {{ tx->stats[{STAT_MCAST_EMPTY}]++; "
                "return; }", 2)
        # every replica but the last on a copy of the packet state; the last on f itself, which
        # nothing reads after it: one copy (9 KB at K = 512) fewer a multicast packet
        cb.emit("int64_t last = C->pre.first[g + 1] - 1;", 2)
        cb.emit("for (int64_t r = C->pre.first[g]; r < last; r++) {", 2)
        rid = f" h[{s['egress_rid']}] = (uint64_t)C->pre.rid[r];" if "egress_rid" in s else ""
        cb.emit(f"uint64_t h[{len(cb.init)}]; {_live(cb, 'memcpy(h + {a}, f + {a}, {n});')}{rid}", 3)
        cb.emit("egress_one(h, C->pre.port[r], data, len, off, tx);", 3)
        cb.emit("}", 2)
        rid = f"f[{s['egress_rid']}] = (uint64_t)C->pre.rid[last]; " if "egress_rid" in s else ""
        cb.emit(f"{rid}egress_one(f, C->pre.port[last], data, len, off, tx);", 2)
        cb.emit("return;", 2)
        cb.emit("}", 1)
    cb.emit(f"if (f[{s['egress_spec']}] == {drop}) {{ tx->stats[{STAT_DROPPED}]++; return; }}", 1)
    cb.emit(f"f[{s['instance_type']}] = {INSTANCE_NORMAL};", 1)
    cb.emit(f"egress_one(f, (int64_t)f[{s['egress_spec']}], data, len, off, tx);", 1)
    cb.emit("}")

    cb.emit("static int hashes_ready;")
    cb.emit("int64_t mindp_run_batch(const ctx_t *ctx, const uint8_t *rx, const int32_t *rx_lens, "
            "const int32_t *rx_ports, int64_t slot, int64_t start, int64_t n, uint8_t *txbuf, int32_t *tx_lens, "
            "int32_t *tx_ports, int64_t tx_cap, int64_t *tx_n, uint64_t *stats) {")
    cb.emit("C = ctx;", 1)
    cb.emit("if (!hashes_ready) { hash_tables_init(); hashes_ready = 1; }", 1)
    cb.emit("tx_t tx = {txbuf, tx_lens, tx_ports, slot, tx_cap, tx_n, stats};", 1)
    cb.emit("for (int64_t i = start; i < n; i++) {", 1)
    cb.emit("if (*tx_n && *tx_n + C->pre.most > tx_cap) return i;", 2)
    cb.emit("if (i + 1 < n) __builtin_prefetch(rx + (i + 1) * slot); /* the next frame's headers */", 2)
    cb.emit("process(rx + i * slot, rx_lens[i], rx_ports[i], &tx);", 2)
    cb.emit("}", 1)
    cb.emit("return n;", 1)
    cb.emit("}")
