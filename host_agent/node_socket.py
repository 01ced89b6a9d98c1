"""The optimizer node on a raw socket: `OptimizerNode` feeds the SUM frames addressed to it to a
`NodeCore` (node_core) and sends the PARAM frames it answers with, through link loss, switch
restarts (the stall resend) and a sharded job's non-finite agreement (shards).
"""
from __future__ import annotations

import collections
import socket
import sys
import time
from dataclasses import dataclass

import numpy as np

from mindp import codec
from mindp.protocol import PARAM_CHUNKS_MAX, K, Kind, param_frame_len
from mindp.readable import readable

from . import digest, fused, rawsock, shards
from .node_core import NodeCore
from .rawsock import LINK_BACKOFF, LINK_ERRNOS


#: Elements the node takes per poll at most, in RECV_ROWS whole SUM frames (its receive buffer,
#: 4-5 MB at any K from 32 on; the socket's buffer holds more, rawsock.prepare). Each batch costs ~100 us
#: besides the kernel (header pass, a kernel call waking its threads, bookkeeping, its share of the
#: commit): at 131,072 elements a batch that was a third of a 4M-element step's time, at 524,288
#: about a quarter of the kernel's. Counted in elements, so the batch's work and the buffer's
#: memory stay the same as K changes (16,384 frames at K = 32, 1,024 at K = 512).
RECV_ELEMENTS = 1 << 19
RECV_ROWS = max(1, RECV_ELEMENTS // K)
#: Receive coalescing, as the workers' (WorkerConfig.coalesce): woken by sums while at least
#: COALESCE_MIN chunks of its step are still to come, the node waits --rx-usecs before reading, so
#: that one read takes a larger batch and the per-batch cost is paid fewer times. A step's last
#: chunks, which the workers wait for, are read at once.
RX_USECS = 500
COALESCE_MIN = 256


def stall_due(n: int, gap_max: int) -> int:
    """When resend n (from 0) of a stall is due, in stall_resend periods after the last sum: gaps of
    1, 2, 4, ... periods, at most gap_max (a power of two) each."""
    k = gap_max.bit_length() - 1  # doublings before the cap
    return 2 ** (n + 1) - 1 if n < k else 2 ** k - 1 + (n - k + 1) * gap_max


#: Why the node drops a received row of SUM length, in the order its checks run: not from the
#: switch to us (counted as rejected_source), then codec.decode's checks of a SUM (codec.row_checks).
_CHECKS = codec.row_checks(Kind.SUM)
ROW_REJECTS = ("source", *(reason for reason, *_ in _CHECKS))
_CHECK_TABLE = np.array([(at, size, value) for _, at, size, value in _CHECKS], dtype=np.int64)

_HEADER_AT = codec.PREFIX_LEN  # a frame's mindp header, then its elements
_ELEMENTS_AT = codec.PREFIX_LEN + codec.HEADER_LEN
_HF = codec.HEADER_DTYPE.fields
_H_KIND, _H_FLAGS, _H_JOB = _HF["kind"][1], _HF["flags"][1], _HF["job"][1]
_H_COUNT, _H_STEP, _H_CHUNK, _H_MORE = _HF["count"][1], _HF["step"][1], _HF["chunk"][1], _HF["more"][1]
_PARAM_KIND = int(Kind.PARAM)

if not fused.NUMPY_ONLY:
    from llvmlite import ir
    from numba import njit, types
    from numba.core import cgutils
    from numba.extending import intrinsic

    @intrinsic
    def _be_row(typingctx, rows, r, at, out, m):
        """out[m] = the big-endian int64 words at byte `at` of rows[r] (any alignment), in native
        order: one vector load and byte swap (a loop over the bytes was four times numpy's cast)."""
        def codegen(context, builder, sig, args):
            rty, ity, aty, oty, mty = sig.args
            words = ir.VectorType(ir.IntType(64), K)
            src = fused.row_pointer(context, builder, rty, args[0], ity, args[1])
            src = builder.gep(src, [context.cast(builder, args[2], aty, types.intp)])
            dst = fused.row_pointer(context, builder, oty, args[3], mty, args[4])
            v = builder.load(builder.bitcast(src, words.as_pointer()), align=1)
            swap = cgutils.get_or_insert_function(builder.module, ir.FunctionType(words, [words]),
                                                  f"llvm.bswap.v{K}i64")
            builder.store(builder.call(swap, [v]), builder.bitcast(dst, words.as_pointer()), align=8)
            return context.get_dummy_value()
        return types.void(rows, r, at, out, m), codegen

    @njit(nogil=True, cache=True)
    def _take_sums(rows, me, sources, any_source, checks, bad, headers, sums):
        """The rows that are a SUM for us (`me`: our MAC and IP) from one of `sources` (each a MAC
        and IP; or any_source) and pass `checks` (_CHECK_TABLE: offset, bytes, value), in order:
        their headers (wire bytes) into `headers`' rows and their big-endian elements into `sums`
        in native order, as codec.decoded_rows gives them; returns how many. For every other row
        bad[reason] += 1, the reason its first failed check (ROW_REJECTS)."""
        m = 0
        for r in range(rows.shape[0]):
            row = rows[r]
            mine = True
            for b in range(6):
                mine &= row[b] == me[b]
            for b in range(4):
                mine &= row[30 + b] == me[6 + b]
            if mine and not any_source:
                known = False
                for s in range(len(sources)):
                    same = True
                    for b in range(6):
                        same &= row[6 + b] == sources[s, b]
                    for b in range(4):
                        same &= row[26 + b] == sources[s, 6 + b]
                    known |= same
                mine = known
            reason = -1 if mine else 0
            c = 0
            while reason < 0 and c < checks.shape[0]:
                v = 0
                for b in range(checks[c, 1]):
                    v = v << 8 | row[checks[c, 0] + b]
                if v != checks[c, 2]:
                    reason = 1 + c
                c += 1
            if reason >= 0:
                bad[reason] += 1
                continue
            headers[m, :] = row[_HEADER_AT:_ELEMENTS_AT]
            _be_row(rows, r, _ELEMENTS_AT, sums, m)
            m += 1
        return m

    @njit(inline="always")
    def _field(h, at, size):
        v = np.int64(0)
        for b in range(size):
            v = (v << 8) | np.int64(h[at + b])
        return v

    @njit(inline="always")
    def _joins(a, b):
        """Answer header b goes in the frame of the one before it, a (codec.param_frames): both full
        chunks, consecutive, of one step, job and flags."""
        return (_field(a, _H_COUNT, 2) == K and _field(b, _H_COUNT, 2) == K
                and _field(b, _H_CHUNK, 4) == (_field(a, _H_CHUNK, 4) + 1) & 0xFFFFFFFF
                and _field(a, _H_STEP, 4) == _field(b, _H_STEP, 4) and _field(a, _H_JOB, 2) == _field(b, _H_JOB, 2)
                and a[_H_FLAGS] == b[_H_FLAGS])

    @njit(nogil=True, cache=True)
    def _pack_params(hb, vals, prefixes, frames, frames16, lens):
        """codec.param_frames into the rows of `frames` (frame i in frames[i, :lens[i]]; frames16:
        the same rows as uint16): answer headers `hb` (wire bytes) and their native fp16 bits
        `vals`, a frame for up to PARAM_CHUNKS_MAX consecutive full chunks of one step, job and
        flags, in order; prefixes[c - 1]: the Ethernet, IPv4 and UDP headers of a frame of c
        chunks. Returns how many frames."""
        n, most = hb.shape[0], prefixes.shape[0]
        nf = f = 0
        while f < n:
            size = 1
            while size < most and f + size < n and _joins(hb[f + size - 1], hb[f + size]):
                size += 1
            row = frames[nf]
            row[:_HEADER_AT] = prefixes[size - 1]
            row[_HEADER_AT:_ELEMENTS_AT] = hb[f]
            row[_HEADER_AT + _H_KIND] = _PARAM_KIND
            row[_HEADER_AT + _H_MORE] = 0
            row[_HEADER_AT + _H_MORE + 1] = size - 1
            out = frames16[nf]
            at = _ELEMENTS_AT // 2
            for c in range(f, f + size):
                v = vals[c]
                for j in range(v.shape[0]):  # big-endian on the wire
                    out[at + j] = (v[j] >> np.uint16(8)) | (v[j] << np.uint16(8))
                at += v.shape[0]
            lens[nf] = 2 * at
            nf += 1
            f += size
        return nf


@dataclass
class NodeAddress:
    mac: str
    ip: str


class OptimizerNode:
    """NodeCore on a raw socket: SUM frames in, PARAM frames out to the switch (broadcast address)."""

    #: A stall's resends: after 1, 3, 7, ... times stall_resend s without a sum, the gap doubling up
    #: to this many times stall_resend, then kept for as long as no sum comes. Never given up: a
    #: switch restored after the series ended (its restart and pipeline push took longer on a busy
    #: machine) absorbs a retransmitted gradient of a chunk some workers already had as a new, never
    #: completed use (they will not resend it), so no sum comes and only a resend can answer it.
    STALL_GAP_MAX = 8

    def __init__(self, core: NodeCore, sock, addr: NodeAddress, faults: rawsock.Faults | None = None,
                 stall_resend: float = 1.0, sources: list[tuple[str, str]] | None = None,
                 agreement: shards.NonfiniteAgreement | None = None, digests: digest.Server | None = None,
                 rx_usecs: int = RX_USECS):
        """agreement: a shard's non-finite agreement with the job's other shards (host_agent.shards);
        digests: the step digest's server (host_agent.digest), answered beside the sums;
        rx_usecs: receive coalescing (RX_USECS; 0: off)."""
        self.core = core
        self.agreement = agreement
        self.digests = digests
        self.sock = sock
        self.addrs = codec.Addresses(addr.mac, "ff:ff:ff:ff:ff:ff", addr.ip, "255.255.255.255")
        self.faults = faults
        self.stats = core.stats
        core.defer_commit = True  # committed in _handle, after the answers left
        self.stall_resend = stall_resend
        self.hold = rx_usecs * 1e-6
        self.mac = bytes.fromhex(addr.mac.replace(":", ""))
        self.ip = socket.inet_aton(addr.ip)
        self.sources = None if sources is None else {(bytes.fromhex(m.replace(":", "")), socket.inet_aton(i))
                                                      for m, i in sources}
        self.auxdata = rawsock.enable_auxdata(sock)
        # A burst of sums a poll: decoded where the receive ring holds them (rawsock.waiting_rows), else
        # copied into the rows of this buffer first (frames to sort out; no ring: recvmmsg into them).
        self.rx = np.zeros((RECV_ROWS, codec.frame_len(Kind.SUM)), dtype=np.uint8)
        self._prefixes = np.array([np.frombuffer(codec.frame_prefix(Kind.PARAM, self.addrs, c * K), np.uint8)
                                   for c in range(1, PARAM_CHUNKS_MAX + 1)])
        self.receiver = rawsock.RowReceiver(self.rx, True) if rawsock.MMSG and self.auxdata else None
        self._src_keys = None if self.sources is None else [int.from_bytes(m + i, "big") for m, i in self.sources]
        self._me = np.frombuffer(self.mac + self.ip, np.uint8)
        self._src_rows = np.array([list(m + i) for m, i in sorted(self.sources or ())], np.uint8).reshape(-1, 10)
        # The PARAM frames of a batch (compiled packer): built in these, grown to the largest batch.
        self._tx = np.empty((0, param_frame_len(PARAM_CHUNKS_MAX)), np.uint8)
        self._tx16, self._tx_lens = self._tx.view(np.uint16), np.empty(0, np.int64)
        if not fused.NUMPY_ONLY:  # compiled (or loaded) now: the first batch neither waits nor grows the process
            width = self.rx.shape[1]  # rows of the buffer, and rows of the ring (strided: a slot apart)
            for rows in (self.rx[:0], np.zeros((2, width + 1), np.uint8)[:, :width]):
                _take_sums(rows, self._me, self._src_rows, self.sources is None, _CHECK_TABLE,
                           np.zeros(len(ROW_REJECTS), np.int64), np.empty((len(rows), codec.HEADER_LEN), np.uint8),
                           np.empty((len(rows), K), np.int64))
            frames = np.empty((0, param_frame_len(PARAM_CHUNKS_MAX)), np.uint8)
            _pack_params(np.empty((0, codec.HEADER_LEN), np.uint8), np.empty((0, K), np.uint16), self._prefixes,
                         frames, frames.view(np.uint16), np.empty(0, np.int64))
        self._stop = False
        self._digest_ready = True
        self._last_sum = time.monotonic()
        self._stall_resends = 0
        self._down_since: float | None = None
        self._backoff = LINK_BACKOFF[0]
        self._sends_failed = False  # since the link was last looked at (rawsock.raise_if_link_down)

    def stop(self) -> None:
        self._stop = True

    def poll(self, timeout: float) -> int:
        """Wait up to `timeout` for frames, handle one batch; returns frames received. A link that
        went down (ENETDOWN/ENXIO/ENODEV) is reported in one line and retried with backoff;
        frames lost meanwhile are recovered by the workers' retransmissions and the stall resend."""
        self._digest_ready = True  # (unless poll says otherwise)
        try:
            n = self._poll(timeout)
            self._check_link()
        except OSError as exc:
            if exc.errno not in LINK_ERRNOS:
                raise
            self._link_down(exc)
            return 0
        finally:
            if self.digests:  # queries that came, and those held for a step committed meanwhile
                if self._digest_ready:
                    self.digests.poll(self.core.committed)
                elif self.digests.held:  # (its socket had nothing: a read would only raise EAGAIN)
                    self.digests.flush(self.core.committed)
        if n and self._down_since is not None:
            print(f"mindp-optimizer: link back after {time.monotonic() - self._down_since:.1f} s", file=sys.stderr,
                  flush=True)
            self._down_since, self._backoff = None, LINK_BACKOFF[0]
        return n

    def _check_link(self) -> None:
        """Sends failed since the last look: raise the link's error if it went down. Looked at
        after a whole poll, not inside a send: the batch's commit and digests go first."""
        if self._sends_failed:
            self._sends_failed = False
            rawsock.raise_if_link_down(self.sock)

    def _link_down(self, exc: OSError) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
            self.stats["link_down"] += 1
            print(f"mindp-optimizer: link down ({exc.strerror}); retrying every {LINK_BACKOFF[0]}-{LINK_BACKOFF[1]} s",
                  file=sys.stderr, flush=True)
        time.sleep(self._backoff)
        self._backoff = min(self._backoff * 2, LINK_BACKOFF[1])

    def _poll(self, timeout: float) -> int:
        peers = [self.agreement.sock] if self.agreement else []
        if self.digests:
            peers.append(self.digests.sock)
        ready = readable([self.sock, *peers], timeout)
        self._digest_ready = self.digests is not None and self.digests.sock in ready
        if self._digest_ready and self.core.told_lr:  # a step's lr comes with its queries: read them first
            self.digests.poll(self.core.committed)
            self._digest_ready = False
        if self.agreement:  # notices, acknowledgements, resends; answers the peers released
            for hdr, vals in self.agreement.poll():
                self._send(hdr, vals, held=False)
        if self.sock not in ready:
            return 0
        store = self.core.store
        if self.hold and store.n_chunks - store.n_applied >= COALESCE_MIN:
            time.sleep(self.hold)
        self.stats["receives"] += 1
        if self.receiver is not None and not self.faults:
            waiting = None if fused.NUMPY_ONLY else rawsock.waiting_rows(self.sock, self.rx.shape[1], len(self.rx))
            if waiting is not None:  # decoded where the kernel put them: the sums are not copied twice
                ring, rows = waiting
                self.stats["receives_in_place"] += 1
                try:
                    dec = self._decode_rows(rows)
                finally:
                    ring.release(len(rows))
            else:
                n, tagged, other = rawsock.recv_rows_untagged(self.sock, self.rx, self.receiver)
                self.stats["rejected_tagged"] += int(tagged)  # (numpy counts would not go into --stats' JSON)
                self.stats["rejected_length"] += int(other)
                rows = self.rx[:n]
                if fused.NUMPY_ONLY:
                    mine = self._rows_from_switch(rows)
                    return self._handle(rows if mine.all() else rows[mine])  # (a copy of megabytes at large K)
                dec = self._decode_rows(rows)
            self._handle_decoded(dec)
            return len(dec.headers) + sum(dec.rejects.values())  # the rows from the switch, as _handle counts
        if self.auxdata:
            frames, tagged = rawsock.recv_batch_untagged(self.sock)
            if tagged:
                self.stats["rejected_tagged"] += tagged
        else:
            frames = rawsock.recv_batch(self.sock)
        frames = self._from_switch(frames)
        if self.faults:
            frames = self.faults.filter_recv(frames)
        return self._handle(frames)

    def _handle(self, frames) -> int:
        """Received frames (bytes, or rows of SUM length) -> answers sent; returns how many."""
        self._handle_decoded(codec.decode(frames, Kind.SUM))
        return len(frames)

    def _decode_rows(self, rows: np.ndarray) -> codec.Decoded:
        """_rows_from_switch, then codec.decode, over received rows of SUM length: their checks,
        headers and elements in one compiled pass (~100 us of numpy calls a batch of 40 frames
        before)."""
        heads, sums = np.empty((len(rows), codec.HEADER_LEN), np.uint8), np.empty((len(rows), K), np.int64)
        bad = np.zeros(len(ROW_REJECTS), np.int64)
        m = _take_sums(rows, self._me, self._src_rows, self.sources is None, _CHECK_TABLE, bad, heads, sums)
        rejects = collections.Counter()
        if m < len(rows):
            rejects.update({reason: int(n) for reason, n in zip(ROW_REJECTS, bad.tolist()) if n})
            if "source" in rejects:
                self.stats["rejected_source"] += rejects.pop("source")
        return codec.Decoded(heads[:m].view(codec.HEADER_DTYPE).reshape(-1), sums[:m], rejects)

    def _handle_decoded(self, dec: codec.Decoded) -> None:
        for reason, n in dec.rejects.items():
            self.stats[f"rejected_{reason}"] += n
        if len(dec.headers):
            self._last_sum = time.monotonic()
            self._stall_resends = 0
            self._send(*self.core.handle(dec.headers, dec.elements))
            if self.digests and self.core.complete_digest():  # the workers' wait ends before the fsyncs
                self.digests.flush(self.core.committed)
            self.core.commit_if_complete()

    def _rows_from_switch(self, rows: np.ndarray) -> np.ndarray:
        """_from_switch over rows of SUM length, vectorised: which rows to keep."""
        def field(lo: int, hi: int) -> np.ndarray:
            wide = np.zeros((len(rows), 16), dtype=np.uint8)
            wide[:, 16 - (hi - lo) :] = rows[:, lo:hi]
            return wide.view(">u8").reshape(-1, 2)
        mine = (field(0, 6) == np.frombuffer(self.mac.rjust(16, b"\0"), ">u8")).all(axis=1) \
            & (field(30, 34) == np.frombuffer(self.ip.rjust(16, b"\0"), ">u8")).all(axis=1)
        if self._src_keys is not None:
            # (MAC, IP) as one 80-bit key in two 64-bit words, compared with each possible source.
            key = np.zeros((len(rows), 16), dtype=np.uint8)
            key[:, 6:12] = rows[:, 6:12]
            key[:, 12:16] = rows[:, 26:30]
            words = key.view(">u8").reshape(-1, 2)
            known = np.zeros(len(rows), dtype=bool)
            for k in self._src_keys:
                known |= (words[:, 0] == k >> 64) & (words[:, 1] == k & 0xFFFFFFFFFFFFFFFF)
            mine &= known
        if not mine.all():
            self.stats["rejected_source"] += int(np.count_nonzero(~mine))
        return mine

    def _from_switch(self, frames: list) -> list:
        """SUM-sized frames are sums only if addressed to us (MAC and IP, as the switch rewrites
        them) from a host the job may have as a worker (`sources`, if known); others are counted."""
        size = codec.frame_len(Kind.SUM)
        keep = []
        for f in frames:
            if len(f) == size and (f[0:6] != self.mac or f[30:34] != self.ip
                                   or (self.sources is not None and (bytes(f[6:12]), bytes(f[26:30])) not in self.sources)):
                self.stats["rejected_source"] += 1
            else:
                keep.append(f)
        return keep

    def _send(self, hdr: np.ndarray, vals: np.ndarray, held: bool = True) -> int:
        if self.agreement and held:  # a shard holds NONFINITE answers until every shard knows
            hdr, vals = self.agreement.outgoing(hdr, vals)
        if not len(hdr):
            return 0
        if fused.NUMPY_ONLY:
            out = codec.param_frames(hdr, vals, self.addrs)  # up to PARAM_CHUNKS_MAX chunks a frame
            frames, lens, n = out.frames, out.lens, len(out.frames)
        else:  # the same frames, built in one compiled pass
            hb = np.ascontiguousarray(fused.wire_order(hdr)).view(np.uint8).reshape(len(hdr), codec.HEADER_LEN)
            if len(self._tx) < len(hdr):  # one buffer reused from batch to batch (rows past n untouched)
                self._tx = np.empty((max(len(hdr), 2 * len(self._tx)), param_frame_len(PARAM_CHUNKS_MAX)), np.uint8)
                self._tx16, self._tx_lens = self._tx.view(np.uint16), np.empty(len(self._tx), np.int64)
            frames, lens = self._tx, self._tx_lens
            n = _pack_params(hb, np.ascontiguousarray(vals, np.float16).view(np.uint16), self._prefixes, frames,
                             self._tx16, lens)
        _, failed = rawsock.send_rows(self.sock, frames, range(n), self.faults, lens)
        self.stats["params_sent"] += len(hdr)
        self.stats["send_errors"] += failed  # frames
        self._sends_failed |= failed > 0
        return len(hdr)

    def check_stall(self, now: float) -> None:
        """No sum for stall_resend s (then 3x, 7x, ...): send the recent parameters again. Covers
        a switch that lost its partial sums (restart) while some workers had a chunk's parameters
        and others not, and a lost last parameter chunk of the run."""
        if not self.stall_resend or now - self._last_sum < self.stall_resend * stall_due(self._stall_resends,
                                                                                          self.STALL_GAP_MAX):
            return
        self._stall_resends += 1
        try:
            self.stats["stall_resends"] += self._send(*self.core.recent_params())
            self._check_link()
        except OSError as exc:  # the link went down between polls: as in poll(), one line and a wait
            if exc.errno not in LINK_ERRNOS:
                raise
            self._link_down(exc)

    def _settled(self, now: float, linger: float) -> bool:
        """No query held, and none came for `linger` s: no worker is still checking a step."""
        d = self.digests
        return d is None or (not d.held and now - d.last_query >= linger)

    def serve(self, steps: int | None = None, linger: float = 5.0, idle_timeout: float | None = None) -> None:
        """Serve until `steps` steps are committed and neither a sum nor a step digest's query came
        for `linger` s (late resends and checks are answered meanwhile); until stop(); or until
        idle for `idle_timeout` s."""
        self.core.store.prefetch_from(0)
        last = time.monotonic()
        try:
            while not self._stop:
                if self.poll(0.05):
                    last = time.monotonic()
                elif self.faults is not None and self.faults.held:  # idle: the test's reordered answers go
                    self.faults.release(self.sock.send)
                now = time.monotonic()
                self.check_stall(now)
                idle = now - last
                if steps is not None and self.core.committed + 1 >= steps and self._settled(now, linger) and idle >= linger:
                    return
                if idle_timeout is not None and idle >= idle_timeout:
                    return
        finally:
            ring = rawsock.ring_of(self.sock) if self.auxdata else None
            if ring is not None:  # frames the kernel dropped on a full ring (the node fell behind)
                self.stats["ring_drops"] += ring.dropped()

