"""A worker's receive path for PARAM frames: a batch of received rows -> the step's parameters,
every frame and every chunk it carries checked, the rejects counted by reason in the agent's stats.

Two paths giving the same results: with numba, one compiled pass checks every row and chunk and
lists where the accepted chunks' elements lie, and a second copies the fresh ones (byteswapped)
from the rows straight into the parameters; without (fused.NUMPY_ONLY, MINDP_NO_NUMBA=1), numpy
calls through codec.split_params and codec.decode. At ~8 frames a receive and ~80 receives a step
(the gpt's), the numpy path's ~40 calls a receive were most of its cost.

The checks, per chunk, in this order, the first failed one counted: the frame's length (its
`more`, count K for several chunks; a mindp frame of another length; other traffic is not counted),
the source (the node owning the chunk), codec.row_checks(PARAM), `more` 0 for a frame of one
chunk's length, then the job, the step (stale or future), the chunk and its count, and a chunk whose
gradient this worker has not sent (unsent).
"""
from __future__ import annotations

import collections
import ipaddress
from time import monotonic

import numpy as np

from mindp import codec, rxring
from mindp.protocol import ELEMENT_DTYPE, HEADER_DTYPE, HEADER_LEN, PARAM_CHUNKS_MAX, K, Flag, Kind, param_frame_len

from . import fused, shards

CHUNK_OFFSET = codec.PREFIX_LEN + HEADER_DTYPE.fields["chunk"][1]

#: The compiled path's reject counters, as stats keys, in the order of its `rejects` array: the
#: frame's length, its source, codec.row_checks(PARAM)'s reasons, then the step's checks.
_CHECKS = codec.row_checks(Kind.PARAM)
STAT_KEYS = ("rejected_length", "rejected_source", *(f"rejected_{reason}" for reason, *_ in _CHECKS),
             "rejected_job", "stale", "future", "rejected_chunk", "unsent")
_CHECK_TABLE = np.array([(at, size, value) for _, at, size, value in _CHECKS], dtype=np.int64)
#: rxring.is_mindp's test (IPv4, UDP, mindp's port), as the same table's rows.
_MINDP_TABLE = np.array([(at, size, value) for reason, at, size, value in codec.HEADER_CHECKS
                         if reason in ("ethertype", "udp", "port")], dtype=np.int64)
_FIELDS = np.array([codec.PREFIX_LEN + HEADER_DTYPE.fields[f][1] for f in
                    ("flags", "job", "count", "step", "chunk", "more")], dtype=np.int64)
_BODY = codec.PREFIX_LEN + HEADER_LEN  # where a frame's elements start
_BLOCK = K * ELEMENT_DTYPE[Kind.PARAM].itemsize  # bytes of one chunk's elements
_OUT = 4  # columns of an accepted chunk: row, offset of its elements, chunk, flags
_RETRANSMIT, _NONFINITE = int(Flag.RETRANSMIT), int(Flag.NONFINITE)  # (an enum's attribute costs 1 us)
_MINDP_PREFIX = rxring.MINDP_PREFIX


def _addr_row(mac: str, ip: str) -> np.ndarray:
    """A source as the 10 bytes a frame carries: MAC (bytes 6-11), IPv4 (bytes 26-29)."""
    return np.frombuffer(bytes.fromhex(mac.replace(":", "")) + ipaddress.IPv4Address(ip).packed, np.uint8)


class ParamReceiver:
    """One worker's PARAM receive: `receive` takes a batch of rows into a step's parameters."""

    def __init__(self, job_id: int, counts: np.ndarray, optimizer_mac: str, optimizer_ip: str,
                 sources: shards.ParamSources | None, rows: int):
        """counts: each chunk's element count; sources: a sharded job's (else every PARAM comes
        from the optimizer node); rows: the most rows a batch holds."""
        self.job_id = job_id
        self.counts = counts
        self.sources = sources
        self.compiled = not fused.NUMPY_ONLY
        # is_param[n]: n is a PARAM frame's length (a look-up: np.isin costs more than the rest of a check).
        self.is_param = np.zeros(param_frame_len(PARAM_CHUNKS_MAX) + 1, dtype=bool)
        self.is_param[[param_frame_len(n) for n in range(1, PARAM_CHUNKS_MAX + 1)]] = True
        # The numpy path's source check: the node's MAC and IP as integers (bytes 6-9 and 10-11 of
        # the frame, 26-29), compared per row far faster than byte by byte.
        addr = _addr_row(optimizer_mac, optimizer_ip)
        self.param_src = [(lo, hi, np.frombuffer(addr[a:b].tobytes(), dtype=f">u{hi - lo}")[0])
                          for lo, hi, a, b in ((6, 10, 0, 4), (10, 12, 4, 6), (26, 30, 6, 10))]
        # The compiled path's: a node per chunk range (his: each range's last chunk), one for all if not sharded.
        if sources is None:
            self.src_rows, self.src_his = addr[None, :].copy(), np.zeros(1, np.int64)
        else:
            self.src_rows = np.ascontiguousarray(np.concatenate([sources.macs, sources.ips], axis=1), dtype=np.uint8)
            self.src_his = sources.his.astype(np.int64)
        self.out = np.zeros((rows * PARAM_CHUNKS_MAX, _OUT), dtype=np.int64)
        self.rejects = np.zeros(len(STAT_KEYS), dtype=np.int64)
        self.step_args = np.zeros(3, dtype=np.int64)  # job, step, chunks
        if self.compiled:  # compiled (or loaded from numba's cache) now, not in a step's first receive
            rows0 = np.zeros((0, len(self.is_param) - 1), np.uint8)
            _scan(rows0, np.zeros(0, np.int64), self.is_param, _CHECK_TABLE, _MINDP_TABLE, _FIELDS, self.src_rows,
                  self.src_his, self.step_args, counts, np.zeros(0, np.int32), self.out, self.rejects)
            _copy(rows0, self.out[:0], np.zeros(0, bool), np.zeros(0, np.uint16))

    def receive(self, rows: np.ndarray, lens: np.ndarray, window, params: np.ndarray,
                stats: collections.Counter, resume=None) -> list[int]:
        """Frames received (the first lens[i] bytes of rows[i]) -> `params` (n_chunks * K fp16) for
        the chunks `window` takes fresh, recorded in `resume` if given; rejects counted in `stats`.
        Returns the fresh chunks flagged NONFINITE."""
        # (The compiled pass reads rows of the widest frame only: the agents' receive buffers.)
        if self.compiled and rows.shape[1] == len(self.is_param) - 1:
            return self._receive_compiled(rows, lens, window, params, stats, resume)
        return self._receive_numpy(rows, lens, window, params, stats, resume)

    def _receive_compiled(self, rows, lens, w, params, stats, resume) -> list[int]:
        if len(rows) * PARAM_CHUNKS_MAX > len(self.out):
            self.out = np.zeros((len(rows) * PARAM_CHUNKS_MAX, _OUT), dtype=np.int64)
        self.rejects[:] = 0
        self.step_args[:] = (self.job_id, w.step, w.n)
        n, behind, nonfinite_any = _scan(rows, lens, self.is_param, _CHECK_TABLE, _MINDP_TABLE, _FIELDS,
                                         self.src_rows, self.src_his, self.step_args, self.counts, w.attempts,
                                         self.out, self.rejects)
        if self.rejects.any():
            for key, v in zip(STAT_KEYS, self.rejects.tolist()):
                if v:
                    stats[key] += v
        if behind:
            w.peer_behind()
        if not n:
            return []
        out = self.out[:n]
        chunks, flags = out[:, 2], out[:, 3]
        fresh = w.on_params(chunks, monotonic(), (flags & _RETRANSMIT) == 0)
        taken = _copy(rows, out, fresh, np.asarray(params).view(np.uint16))
        nonfinite: list[int] = []
        if resume is not None or nonfinite_any:
            c, nf = chunks[fresh], (flags[fresh] & _NONFINITE) != 0
            if resume is not None:  # after the parameters: a kill in between only loses the mark
                resume.record(w.step, c, nf)
            nonfinite = c[nf].tolist()
        stats["params_received"] += taken
        stats["duplicates"] += n - taken
        return nonfinite

    def _receive_numpy(self, rows, lens, w, params, stats, resume) -> list[int]:
        ours = self.is_param[lens]  # lens are at most the rows' width
        if not ours.all():  # a mindp frame of another length is counted (split_params); other traffic is not
            keep = ours | rxring.is_mindp(rows, lens)
            rows, lens = rows[keep], lens[keep]
        rejects = collections.Counter()
        frames = codec.split_params(rows, lens, rejects)  # one PARAM chunk a row
        _count(stats, "rejected_length", rejects["length"])
        n_in = len(frames)
        if self.sources is not None:  # sharded: each chunk from the node owning it
            chunk = np.ascontiguousarray(frames[:, CHUNK_OFFSET : CHUNK_OFFSET + 4]).view(">u4").ravel()
            frames = frames[self.sources.match(chunk, frames[:, 6:12], frames[:, 26:30])]
        else:
            ok = np.ones(len(frames), dtype=bool)
            for lo, hi, want in self.param_src:
                ok &= np.ascontiguousarray(frames[:, lo:hi]).view(f">u{hi - lo}").ravel() == want
            frames = frames if ok.all() else frames[ok]
        _count(stats, "rejected_source", n_in - len(frames))
        dec = codec.decode(frames, Kind.PARAM)
        for reason, n in dec.rejects.items():
            stats[f"rejected_{reason}"] += n
        h = dec.headers
        if not len(h) or not w.n:
            return []
        ok = h["job"] == self.job_id
        _count(stats, "rejected_job", int((~ok).sum()))
        step = h["step"].astype(np.int64)
        stale = ok & (step < w.step)
        _count(stats, "stale", int(stale.sum()))
        if (stale & ((h["flags"] & Flag.RETRANSMIT) != 0)).any():
            w.peer_behind()
        _count(stats, "future", int((ok & (step > w.step)).sum()))
        ok &= step == w.step
        c = h["chunk"].astype(np.int64)
        cc = np.where(c < w.n, c, 0)
        good = (c < w.n) & (h["count"] == self.counts[cc])
        _count(stats, "rejected_chunk", int((ok & ~good).sum()))
        ok &= good
        # Parameters for a gradient we have not sent: taking them would mean never sending it,
        # and the chunk could then never complete for the other workers.
        unsent = ok & (w.attempts[cc] == 0)
        _count(stats, "unsent", int(unsent.sum()))
        idx = np.flatnonzero(ok & ~unsent)
        if not len(idx):
            return []
        flags = h["flags"][idx]
        fresh = w.on_params(c[idx], monotonic(), (flags & Flag.RETRANSMIT) == 0)
        take = idx[fresh]
        params.reshape(-1, K)[c[take]] = dec.elements if len(take) == len(h) else dec.elements[take]
        if resume is not None:  # after the parameters: a kill in between only loses the mark
            resume.record(w.step, c[take], (h["flags"][take] & Flag.NONFINITE) != 0)
        stats["params_received"] += len(take)
        stats["duplicates"] += len(idx) - len(take)
        return c[take[(h["flags"][take] & Flag.NONFINITE) != 0]].tolist()


def _count(stats: collections.Counter, key: str, n: int) -> None:
    if n:
        stats[key] += int(n)  # a numpy count would not go into --stats' JSON


if not fused.NUMPY_ONLY:
    from numba import njit

    @njit(nogil=True, cache=True, inline="always")
    def _field(row, at, size):
        v = 0
        for b in range(size):
            v = v << 8 | row[at + b]
        return v

    @njit(nogil=True, cache=True)
    def _scan(rows, lens, is_param, checks, mindp, fields, srcs, his, step_args, counts, attempts, out, rejects):
        """Every row's frame, then every chunk it carries, through the checks of the module
        docstring, as _receive_numpy runs them: rejects[i] += 1 per chunk (per frame for its
        length) failing STAT_KEYS[i] first; each accepted chunk's row, element offset, chunk and
        flags into out, in the rows' and the chunks' order. Returns (chunks accepted, whether a
        stale one flagged RETRANSMIT came (a peer is behind), whether an accepted one is flagged
        NONFINITE)."""
        job, step, n_chunks = step_args[0], step_args[1], step_args[2]
        at_flags, at_job, at_count, at_step, at_chunk, at_more = fields[0], fields[1], fields[2], fields[3], \
            fields[4], fields[5]
        one = _BODY + _BLOCK
        n_checks = checks.shape[0]
        job_r, stale_r = 2 + n_checks, 3 + n_checks
        n = 0
        behind = nonfinite = False
        for r in range(rows.shape[0]):
            row = rows[r]
            length = lens[r]
            if length < 0 or length >= is_param.shape[0] or not is_param[length]:
                mine = length >= _MINDP_PREFIX
                for m in range(mindp.shape[0]):
                    mine = mine and _field(row, mindp[m, 0], mindp[m, 1]) == mindp[m, 2]
                if mine:  # a mindp frame of another length
                    rejects[0] += 1
                continue
            more = _field(row, at_more, 2)
            count = _field(row, at_count, 2)
            extra = length - one
            if extra > 0 and not (extra == more * _BLOCK and more < PARAM_CHUNKS_MAX and count == K
                                  and length <= row.shape[0]):
                rejects[0] += 1
                continue
            n_frame = more + 1 if extra > 0 else 1
            header = -1  # the first row check failed, the same for every chunk of the frame
            c = 0
            while header < 0 and c < n_checks:
                if _field(row, checks[c, 0], checks[c, 1]) != checks[c, 2]:
                    header = c
                c += 1
            flags = row[at_flags]
            first = _field(row, at_chunk, 4)
            for i in range(n_frame):
                chunk = (first + i) & 0xFFFFFFFF
                own = 0
                while own < his.shape[0] - 1 and his[own] < chunk:
                    own += 1
                same = True
                for b in range(6):
                    same = same and row[6 + b] == srcs[own, b]
                for b in range(4):
                    same = same and row[26 + b] == srcs[own, 6 + b]
                if not same:
                    rejects[1] += 1
                elif header >= 0:
                    rejects[2 + header] += 1
                elif extra == 0 and more != 0:  # one chunk's length, yet it says it carries more
                    rejects[0] += 1
                elif n_chunks == 0:
                    pass
                elif _field(row, at_job, 2) != job:
                    rejects[job_r] += 1
                else:
                    s = _field(row, at_step, 4)
                    if s < step:
                        rejects[stale_r] += 1
                        behind = behind or (flags & _RETRANSMIT) != 0
                    elif s > step:
                        rejects[stale_r + 1] += 1
                    elif chunk >= n_chunks or count != counts[chunk]:
                        rejects[stale_r + 2] += 1
                    elif attempts[chunk] == 0:
                        rejects[stale_r + 3] += 1
                    else:
                        out[n, 0] = r
                        out[n, 1] = _BODY + i * _BLOCK
                        out[n, 2] = chunk
                        out[n, 3] = flags
                        n += 1
                        nonfinite = nonfinite or (flags & _NONFINITE) != 0
        return n, behind, nonfinite

    @njit(nogil=True, cache=True)
    def _copy(rows, out, fresh, params):
        """The fresh chunks' elements (big-endian fp16 bits in rows) into params (native uint16
        bits, K a chunk); returns how many."""
        taken = 0
        for j in range(out.shape[0]):
            if fresh[j]:
                # Sliced first and kept in uint16 the loop vectorises: indexing the whole row with
                # int64 arithmetic ran 28x slower (2.2 ms against 79 us for 2,048 chunks at K = 512).
                src = rows[out[j, 0], out[j, 1] : out[j, 1] + 2 * K]
                dst = params[out[j, 2] * K : out[j, 2] * K + K]
                for e in range(K):
                    dst[e] = np.uint16(src[2 * e]) << np.uint16(8) | np.uint16(src[2 * e + 1])
                taken += 1
        return taken
