"""Compile a BMv2 JSON (p4c-bm2-ss, v1model) into Python source, once.

The packet state is one flat list `f` of ints (layout). Parser states, actions,
pipelines and the deparser become Python functions over `f` whose text is generated
here and exec'd; nothing looks at the JSON per packet. The stages follow bm_sim:

  shape         the JSON's shape checked before anything is compiled
  layout        header instances and fields -> slots of `f`
  expressions   JSON expressions -> nodes -> Python text
  primitives    actions: one generator per primitive (PRIMITIVES)
  calculations  hash calculations and checksums
  parser        parse states and parse()
  pipeline      control flow and match-action tables
  deparser      deparse()
  runtime       helpers the generated code calls, and the audit of what it may name
  trace         the per-packet trace of the traced compile
  program       the glue: load(), ProgramBuilder, CompiledProgram

Anything the compiler does not implement is rejected at load time with its name
(`UnsupportedConstruct`), never ignored; no text of the JSON reaches the source.
"""
from .program import (DEFAULT_DROP_PORT, INSTANCE_NORMAL, INSTANCE_REPLICATION, CompiledProgram, ProgramBuilder,
                      load)

__all__ = ["DEFAULT_DROP_PORT", "INSTANCE_NORMAL", "INSTANCE_REPLICATION", "CompiledProgram", "ProgramBuilder",
           "load"]
