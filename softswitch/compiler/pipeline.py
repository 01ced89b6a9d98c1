"""Pipelines (ingress, egress): the control-flow graph of tables, conditionals and action
calls, emitted as structured Python (branches rejoin at their immediate post-dominator), and
the match-action tables it looks up, as bm_sim's pipeline, conditionals and match tables."""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ..compiler_errors import ProgramError, UnsupportedConstruct
from ..tables import ActionSpec, KeySpec, Table
from .expressions import ExpressionEmitter, int_literal
from .layout import hex_value

if TYPE_CHECKING:
    from .program import ProgramBuilder

MATCH_KINDS = ("exact", "lpm", "ternary", "range", "optional", "valid")


class ControlFlow:
    """One pipeline's graph, emitted into pipe_ingress(f) / pipe_egress(f)."""

    def __init__(self, builder: ProgramBuilder, pipeline: dict):
        self.builder = builder
        self.pipeline = pipeline
        self.nodes: dict[str, tuple[str, dict]] = {}
        for t in pipeline.get("tables", []):
            self.nodes[t["name"]] = ("table", t)
        for c in pipeline.get("conditionals", []):
            self.nodes[c["name"]] = ("cond", c)
        for a in pipeline.get("action_calls", []):
            self.nodes[a["name"]] = ("call", a)
        self.postdominators: dict = {None: frozenset()}

    def generate(self) -> None:
        builder = self.builder
        old = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old, 10000))
        try:
            builder.emit("def pipe_ingress(f):" if self.pipeline["name"] == "ingress" else "def pipe_egress(f):")
            builder.emit("try:", 1)
            self.emit_branch(self.pipeline.get("init_table"), None, 2)
            builder.emit("except _Exit:", 1)
            builder.emit("pass", 2)
            builder.emit("")
        finally:
            sys.setrecursionlimit(old)

    def successors(self, name) -> list:
        kind, node = self.nodes[name]
        if kind == "cond":
            return [node["true_next"], node["false_next"]]
        if kind == "call":
            return [node["next_node"]]
        return list(next_nodes(node).values()) or [node.get("base_default_next")]

    def postdoms(self, name) -> frozenset:
        if name in self.postdominators:
            return self.postdominators[name]
        if name not in self.nodes:
            raise ProgramError(f"unknown control-flow node {name!r}")
        self.postdominators[name] = frozenset([name])  # guards against cycles; bmv2 pipelines are DAGs
        sets = [self.postdoms(s) for s in self.successors(name)]
        common = frozenset.intersection(*sets) if sets else frozenset()
        self.postdominators[name] = common | {name}
        return self.postdominators[name]

    def join_point(self, name):
        """The immediate post-dominator: where the branches leaving `name` meet again."""
        candidates = self.postdoms(name) - {name}
        if not candidates:
            return None
        return max(candidates, key=lambda c: len(self.postdominators[c]))

    def emit_nodes(self, name, stop, indent: int) -> None:
        builder = self.builder
        while name is not None and name != stop:
            kind, node = self.nodes[name]
            if kind == "cond":
                join = self.join_point(name)
                emitter = ExpressionEmitter(builder.exprs)
                cond = emitter.expr(builder.exprs.node(node["expression"]))
                for pre in emitter.take_pre():
                    builder.emit(pre, indent)
                builder.emit(f"if {cond}:", indent)
                self.emit_branch(node["true_next"], join, indent + 1)
                builder.emit("else:", indent)
                self.emit_branch(node["false_next"], join, indent + 1)
                name = join
            elif kind == "call":
                builder.emit(f"{builder.action(node['action_id'])}(f, ())", indent)
                name = node["next_node"]
            else:
                emit_table(builder, node, indent)
                following = next_nodes(node)
                targets = set(following.values()) or {node.get("base_default_next")}
                if len(targets) == 1:
                    name = targets.pop()
                    continue
                join = self.join_point(name)
                if "__HIT__" in following:
                    builder.emit("if _r[0]:", indent)
                    self.emit_branch(following["__HIT__"], join, indent + 1)
                    builder.emit("else:", indent)
                    self.emit_branch(following["__MISS__"], join, indent + 1)
                else:
                    groups: dict = {}
                    for action_id, target in following.items():
                        groups.setdefault(target, []).append(action_id)
                    builder.emit("_aid = _r[1]", indent)
                    for i, (target, action_ids) in enumerate(groups.items()):
                        test = f"_aid == {int_literal(action_ids[0])}" if len(action_ids) == 1 else \
                            f"_aid in ({', '.join(int_literal(x) for x in action_ids)},)"
                        builder.emit(f"{'elif' if i else 'if'} {test}:", indent)
                        self.emit_branch(target, join, indent + 1)
                name = join

    def emit_branch(self, name, stop, indent: int) -> None:
        start = len(self.builder.lines)
        self.emit_nodes(name, stop, indent)
        if len(self.builder.lines) == start:
            self.builder.emit("pass", indent)


def next_nodes(table: dict) -> dict:
    """action id (or '__HIT__'/'__MISS__') -> next node."""
    following = table.get("next_tables", {})
    default = table.get("base_default_next")
    if "__HIT__" in following or "__MISS__" in following:
        return {"__HIT__": following.get("__HIT__", default), "__MISS__": following.get("__MISS__", default)}
    return {action_id: following.get(action_name, default)
            for action_id, action_name in zip(table["action_ids"], table["actions"])}


def emit_table(builder: ProgramBuilder, table: dict, indent: int) -> None:
    """`_r` = the lookup result; its action runs; a direct counter counts it."""
    layout = builder.layout
    if table.get("type", "simple") != "simple":
        raise UnsupportedConstruct(f"table {table['name']!r} of type {table['type']!r} (action profiles)")
    if table.get("direct_meters"):
        raise UnsupportedConstruct(f"direct meters on table {table['name']!r}")
    keys = []
    for key in table.get("key", []):
        kind = key["match_type"]
        if kind not in MATCH_KINDS:
            raise UnsupportedConstruct(f"match kind {kind!r} in table {table['name']!r}")
        if kind == "valid":
            code = f"f[{layout.headers[key['target']].valid}]"
        else:
            slot = layout.field(key["target"])
            code = f"f[{slot}]"
            if layout.signed[slot]:
                code = f"({code} & {(1 << layout.widths[slot]) - 1})"
            if key.get("mask") is not None:
                code = f"({code} & {hex_value(key['mask'])})"
        keys.append(code)
    exact = all(k["match_type"] in ("exact", "valid") for k in table.get("key", []))
    var = builder.table_var[table["name"]]
    if not keys:
        builder.emit(f"_r = {var}.miss", indent)
    elif exact:
        key_code = keys[0] if len(keys) == 1 else "(" + ", ".join(keys) + ")"
        builder.emit(f"_r = {var}.d.get({key_code}) or {var}.miss", indent)
    else:
        builder.emit(f"_r = {var}.lookup(({', '.join(keys)},))", indent)
    if builder.traced:
        builder.emit(f"_trace.table({builder.table_number[table['name']]}, _r)", indent)
        builder.emit("_actions[_r[1]](f, _r[3])", indent)
    else:
        builder.emit("_r[2](f, _r[3])", indent)
    if table.get("with_counters"):
        builder.emit("if _r[4] is not None:", indent)
        builder.emit("_r[4][0] += 1", indent + 1)
        builder.emit(f"_r[4][1] += f[{layout.ilen}]", indent + 1)


def make_table(builder: ProgramBuilder, table: dict, ns: dict) -> Table:
    """The runtime Table of a JSON table, its actions bound to the compiled functions in `ns`."""
    layout = builder.layout
    keys = []
    for key in table.get("key", []):
        kind = key["match_type"]
        if kind == "valid":
            keys.append(KeySpec(key["target"], kind, 1))
        else:
            width = layout.widths[layout.field(key["target"])]
            keys.append(KeySpec(key.get("name") or ".".join(key["target"]), kind, width))
    actions = {}
    for action_id, action_name in zip(table["action_ids"], table["actions"]):
        action = builder.actions.get(action_id)
        if action is None:
            raise ProgramError(f"table {table['name']!r}: unknown action id {action_id}")
        actions[action_id] = ActionSpec(action_id, action_name, ns[builder.action(action_id)],
                                        [rd["bitwidth"] for rd in action.get("runtime_data", [])])
    result = Table(table["name"], table["id"], keys, table.get("max_size", 1024), actions,
                   bool(table.get("with_counters")))
    default = table.get("default_entry")
    if default:
        result.set_default(default["action_id"], tuple(hex_value(x) for x in default.get("action_data", [])))
        result.default_const = bool(default.get("action_const"))
    if table.get("entries"):
        raise UnsupportedConstruct(f"const entries in table {table['name']!r}")
    return result
