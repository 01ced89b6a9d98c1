"""Run a user's script as `python script.py ARGS` does, and leave why it failed where torchrun looks.

    python -m mindp.torch.runscript script.py ARGS...     (mindp.torch.launch --script does this)

torchrun gives every rank TORCHELASTIC_ERROR_FILE; a script that is not decorated with torch's
@record never writes it, so torchrun (and make run) knew only "exitcode 1". Here the exception that
ends the script (or the message of a SystemExit, such as mindp.torch's one-line refusals) is
written there in torchelastic's own format, plus `mindp` = {rank, type, message, time}, which `make
run` reads to name the first failing rank in one line. The exception then propagates unchanged
(same traceback, same exit code).
"""
from __future__ import annotations

import json
import os
import runpy
import sys
import time
import traceback

from mindp import netutil

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
#: The address whose interface carries a script's own gloo traffic (mindp.torch.launch sets it for a
#: rank in a worker host: gloo would bind the address of the machine's hostname, not in the host).
GLOO_ADDR_ENV = "MINDP_GLOO_ADDR"


def error_record(exc: BaseException, rank: str, now: float) -> dict:
    """torchelastic's error-file content for `exc`, with mindp's summary of it."""
    if isinstance(exc, SystemExit):  # sys.exit("message") says why; sys.exit(3) only its code
        kind, full = "SystemExit", f"exit {exc.code}" if isinstance(exc.code, int) else str(exc.code)
    else:
        kind, full = type(exc).__name__, str(exc)
    message = next((line.strip() for line in full.splitlines() if line.strip()), "")  # its first line
    return {"message": {"message": full if kind == "SystemExit" else f"{kind}: {full}",
                        "extraInfo": {"py_callstack": "".join(traceback.format_exception(exc)),
                                      "timestamp": str(int(now))}},
            "mindp": {"rank": int(rank) if rank.isdigit() else rank, "type": kind, "message": message, "time": now}}


def record(exc: BaseException) -> None:
    path = os.environ.get(ERROR_FILE_ENV)
    if not path:
        return
    try:
        with open(path, "w") as f:
            json.dump(error_record(exc, os.environ.get("RANK", ""), time.time()), f)
    except OSError:
        pass  # the rank's output still holds the traceback


def run_script(script: str, args: list[str]) -> None:
    """`python script ARGS` in this process, its failure recorded where torchrun looks (if it does)."""
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python script.py` puts it first
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            record(exc)
        raise
    except BaseException as exc:
        record(exc)
        raise


def gloo_interface() -> None:
    """In a worker host (mindp.torch.launch set GLOO_ADDR_ENV): the script's own gloo process group
    goes over the interface holding the host's address, unless GLOO_SOCKET_IFNAME says otherwise."""
    addr = os.environ.get(GLOO_ADDR_ENV)
    if addr and not os.environ.get("GLOO_SOCKET_IFNAME") and (name := netutil.interface_holding(addr)):
        os.environ["GLOO_SOCKET_IFNAME"] = name


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m mindp.torch.runscript SCRIPT [ARGS...]")
    gloo_interface()
    run_script(sys.argv[1], sys.argv[2:])


if __name__ == "__main__":
    main()
