"""Why a torchrun of the user's script failed, in one line: the first failing rank, its exception's
type and message (pure: reads files, starts nothing).

Each rank runs under mindp.torch.runscript, which writes torchrun's per-rank error file
(`<log-dir>/<run id>/attempt_<n>/<local rank>/error.json`, torchelastic's format plus `mindp`:
rank, type, message, time). A script decorated with torch's own @record writes the same file
without `mindp`; a rank killed by a signal writes none: then torchrun's log names the rank and its
exit code, and the rank's last line of output says why.
"""
from __future__ import annotations

import json
import pathlib
import re
import signal
from dataclasses import dataclass

from .console import how_it_ended

#: torchrun's line for a failed rank: "failed (exitcode: 1) local_rank: 1 (pid: 123) of binary: ..."
FAILED_RANK = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")
#: torchrun --tee prefixes what it prints of local rank r with "[default<r>]:" (RankLines)
RANK_MARK = re.compile(r"\[default(\d+)\]:")
TRACEBACK_PART = re.compile(r"^(Traceback \(most recent call last\):|\s+File \"|\s+\^|\s{2,}\S)")


@dataclass(frozen=True)
class RankFailure:
    rank: int | str
    kind: str  # the exception's type; "SystemExit" for a one-line refusal; "exit N" / "killed by X" without a file
    message: str
    time: float = 0.0

    def line(self) -> str:
        what = self.message if self.kind == "SystemExit" else f"{self.kind}: {self.message}".rstrip(": ")
        return f"rank {self.rank} failed: {what}"


def _from_file(path: pathlib.Path) -> RankFailure | None:
    try:
        rec = json.loads(path.read_text(errors="replace"))
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict):
        return None
    m = rec.get("mindp")
    if isinstance(m, dict):
        return RankFailure(m.get("rank", path.parent.name), str(m.get("type", "")), str(m.get("message", "")),
                           float(m.get("time", 0.0)))
    msg = rec.get("message")
    if isinstance(msg, dict):  # torch's @record: {"message": {"message": "T: text", "extraInfo": {...}}}
        text, stamp = str(msg.get("message", "")), str(msg.get("extraInfo", {}).get("timestamp", "0"))
    else:
        text, stamp = str(msg or ""), "0"
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    kind, _, rest = first.partition(": ")
    rank = int(path.parent.name) if path.parent.name.isdigit() else path.parent.name
    return RankFailure(rank, kind, rest, float(stamp) if stamp.isdigit() else 0.0)


def from_error_files(log_dir: pathlib.Path) -> RankFailure | None:
    """The earliest failure recorded under torchrun's --log-dir, or None."""
    found = [f for f in (_from_file(p) for p in sorted(log_dir.rglob("error.json"))) if f is not None]
    return min(found, key=lambda f: (f.time, str(f.rank))) if found else None


class RankLines:
    """torchrun's --tee'd output, a line of its log at a time -> each rank's own lines, whole.

    torchrun's tail of a rank's output prints what it has read, prefixed, even a line the rank has
    not ended yet (it wrote its text and its newline apart, as an unbuffered print does, and the
    tail read in between): its log then holds '[default0]:{"loss": 2.3}[default0]:', one line of
    rank 0 in two pieces, maybe with other ranks' pieces between them, or on later lines. A rank's
    line ends where a piece of it ends a line of the log."""

    def __init__(self):
        self._open: dict[int, str] = {}  # rank -> the pieces of its line so far

    def feed(self, line: str) -> list[tuple[int | None, str]]:
        """(rank, its line) for each rank's line that `line` ends; (None, text) for torchrun's own."""
        parts = RANK_MARK.split(line)
        if len(parts) == 1:
            return [(None, line)]
        ended = [(None, parts[0])] if parts[0] else []
        for rank, text in zip(map(int, parts[1::2]), parts[2::2]):
            self._open[rank] = self._open.get(rank, "") + text
        last = int(parts[-2])
        ended.append((last, self._open.pop(last)))
        return ended


def last_words(lines: list[str], rank: int) -> str:
    """The last line rank `rank` printed that is not part of a traceback's frames."""
    split = RankLines()
    said = [text.strip() for line in lines for r, text in split.feed(line) if r == rank]
    said = [s for s in said if s and not TRACEBACK_PART.match(s)]
    return said[-1] if said else ""


def from_log(text: str) -> RankFailure | None:
    """From torchrun's own output (its --tee'd ranks' lines): the first rank it saw fail."""
    lines = text.splitlines()
    for line in lines:
        m = FAILED_RANK.search(line)
        if m:
            rank, code = int(m.group(2)), int(m.group(1))
            said = last_words(lines, rank)
            kind, sep, rest = said.partition(": ")
            if sep and re.fullmatch(r"[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)", kind):
                return RankFailure(rank, kind.rsplit(".", 1)[-1], rest)
            # A signal's victim's last words are its own only for an abort (C++'s std::terminate,
            # an assertion: torch's gloo teardown at exit says "terminate called without an active
            # exception"); a SIGKILL's are whatever it printed before.
            return RankFailure(rank, how_it_ended(code), said if code >= 0 or code == -signal.SIGABRT else "")
    return None


def first_failure(log_dir: pathlib.Path, log: pathlib.Path) -> str | None:
    """One line naming the first failing rank and why, or None when nothing says."""
    found = from_error_files(log_dir)
    if found is None:
        try:
            found = from_log(log.read_text(errors="replace"))
        except OSError:
            found = None
    return found.line() if found else None
