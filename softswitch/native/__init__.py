"""The compiled target of the embedded switch: a loaded program (softswitch.compiler) generated
into C, one module per stage as the Python generator, built with the system C compiler into a
shared object cached by the source's hash, and run a batch of frames per call.

  cexpr      expressions over __int128 with the Python path's values
  cactions   actions, one generator per primitive
  cparser    parser, calculations, checksums, deparser
  cpipeline  control flow, tables, and the packet path over a batch (Engine's)
  croll      runs of per-element statements rolled into loops (a large K's per-element code)
  cspread    interleaved per-element temporaries laid out side by side
  clocal     per-element temporaries whose old value is dead held in a loop's locals
  cprogram   the glue: the C translation unit and the context layout
  build      compile, cache on disk (by the source, and by the program's JSON), load
  state      the flat tables and groups the C code reads, shared registers/counters, the call
  serve      the packet loop in C (io.h): receive, process, send until the ports run dry

The Python path stays the reference (and runs the per-packet trace, packet-out and fault
injection); `attach` returns None, with one log line naming why, for any program it cannot
compile exactly.
"""
from __future__ import annotations

import logging

from ..compiler.program import _one_line as one_line
from ..compiler_errors import ProgramError

log = logging.getLogger("softswitch")


def attach(program, engine):
    """A NativeRunner running `program` for `engine`, or None (logged once) to use the Python path."""
    from . import build, cprogram, state
    try:
        path = build.built_for(program.digest, program.drop_port)
        if path is None:  # generated and built (or found by its source) once per program and code
            source, _ = cprogram.generate(program)
            path = build.build(source)
            build.remember(program.digest, program.drop_port, path)
        lib, fn = build.load(path)
        return state.NativeRunner(program, engine, cprogram.context_layout(program.analysis), lib, fn)
    except (ProgramError, build.BuildError, OSError, TypeError) as exc:
        log.warning("compiled pipeline unavailable (%s), running the Python pipeline", one_line(str(exc)))
    except Exception as exc:  # a generator bug must not stop the switch: the Python path is exact
        log.warning("compiled pipeline unavailable (internal: %s: %s), running the Python pipeline",
                    type(exc).__name__, one_line(str(exc)))
    return None
