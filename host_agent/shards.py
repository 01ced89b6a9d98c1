"""Sharded optimizer nodes (issue 14.2): which node owns which chunks, and how the shards of a job
agree that a step is non-finite.

A job's chunk space is split into M contiguous ranges [lo, hi], one per optimizer node
(`mindp.topology.Topology.shard_ranges`). The switch sends each chunk's sum to the node owning it
and admits a PARAM only from that node; workers check the source too (`ParamSources`).

A non-finite step is a no-op for the whole model (docs/PROTOCOL.md), but the NONFINITE flag of a
sum reaches only the shard owning that chunk. That shard tells every other shard (a NOTICE over
UDP on `NOTICE_PORT`, resent until acknowledged) and holds back every answer of the step flagged
NONFINITE until all of them acknowledged. Workers cannot finish the step without those answers
(the flagged chunk's own answer is one), so no worker starts the next step, and no shard applies
a chunk of it, before every shard knows: a shard that is still in the step marks it non-finite;
one that already committed it commits it again as skipped (its source copy still holds the state
before the step). Every shard then ends on the reference's bits, also for a non-finite last step.
"""
from __future__ import annotations

import collections
import socket
import struct
import time
from dataclasses import dataclass

import numpy as np

from mindp.netutil import bound_udp
from mindp.protocol import SHARD_ACK, SHARD_NOTICE, SHARD_NOTICE_FORMAT, SHARD_NOTICE_PORT, Flag
from mindp.topology import Host, Topology

NOTICE_PORT, NOTICE, ACK = SHARD_NOTICE_PORT, SHARD_NOTICE, SHARD_ACK
_MSG = struct.Struct(SHARD_NOTICE_FORMAT)
#: Seconds between resends of an unacknowledged notice.
NOTICE_RESEND = 0.05


@dataclass(frozen=True)
class ShardHost:
    lo: int  # first chunk owned
    hi: int  # last chunk owned (inclusive)
    host: Host


def job_shards(topo: Topology, job_id: int) -> list[ShardHost]:
    """The job's optimizer shards in chunk order (one shard owning every chunk if not sharded)."""
    job = topo.job(job_id)
    return [ShardHost(int(lo), int(hi), host if isinstance(host, Host) else topo.host(host))
            for lo, hi, host in topo.shard_ranges(job)]


def parse_chunks(text: str) -> tuple[int, int]:
    """'LO:HI' (inclusive) -> (lo, hi); ValueError with a one-line reason."""
    try:
        lo, hi = (int(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"bad chunk range {text!r}: want LO:HI (inclusive)") from None
    if not 0 <= lo <= hi:
        raise ValueError(f"bad chunk range {text!r}: want 0 <= LO <= HI")
    return lo, hi


class ParamSources:
    """Which (MAC, IP) may send the PARAM of each chunk: the node owning it."""

    def __init__(self, shards: list[tuple[int, int, str, str]]):
        """shards: (lo, hi, mac, ip) in chunk order, contiguous."""
        self.his = np.array([hi for _, hi, _, _ in shards], dtype=np.int64)
        self.macs = np.array([np.frombuffer(bytes.fromhex(m.replace(":", "")), np.uint8) for _, _, m, _ in shards])
        self.ips = np.array([np.frombuffer(socket.inet_aton(i), np.uint8) for _, _, _, i in shards])

    def owner(self, chunks: np.ndarray) -> np.ndarray:
        """Shard index of each chunk (len(shards) for a chunk beyond the last)."""
        return np.searchsorted(self.his, np.asarray(chunks, dtype=np.int64), side="left")

    def match(self, chunks: np.ndarray, macs: np.ndarray, ips: np.ndarray) -> np.ndarray:
        """(n,) chunks, (n, 6) source MACs, (n, 4) source IPs -> which come from the chunk's owner."""
        own = np.minimum(self.owner(chunks), len(self.his) - 1)
        return (macs == self.macs[own]).all(axis=1) & (ips == self.ips[own]).all(axis=1)


class NonfiniteAgreement:
    """One shard's side of the non-finite agreement (see the module docstring): `outgoing` holds
    back answers flagged NONFINITE of a step the peers have not all acknowledged; `poll` answers the
    peers' notices (`skip(step) -> bool`, the node's NodeCore.skip_step), takes their
    acknowledgements and resends notices; it returns the answers released."""

    def __init__(self, job_id: int, peers: list[str], skip, bind: str = "0.0.0.0", port: int = NOTICE_PORT):
        self.job_id = job_id
        self.port = port
        self.peers = list(peers)
        self.skip = skip
        self.sock = bound_udp(bind, port)
        self.agreed: set[int] = set()
        self.waiting: dict[int, set[str]] = {}  # step -> peers yet to acknowledge
        # step -> chunk -> (header, parameters): the latest held answer of each chunk (answers
        # repeat as workers retransmit; one per chunk is all a worker needs).
        self.held: dict[int, dict[int, tuple[np.void, np.ndarray]]] = collections.defaultdict(dict)
        self.last_sent = 0.0
        self.stats = collections.Counter()

    def outgoing(self, hdr: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The answers that may leave now; NONFINITE answers of a step not yet agreed are held."""
        if not self.peers:
            return hdr, vals
        nf = (hdr["flags"] & Flag.NONFINITE) != 0
        hold = nf & ~np.isin(hdr["step"].astype(np.int64), list(self.agreed))
        if not hold.any():
            return hdr, vals
        for step in np.unique(hdr["step"][hold]).tolist():
            rows = np.flatnonzero(hold & (hdr["step"] == step))
            for i in rows.tolist():
                self.held[step][int(hdr["chunk"][i])] = (hdr[i].copy(), vals[i].copy())
            self.stats["held_answers"] += len(rows)
            if step not in self.waiting:
                self.waiting[step] = set(self.peers)
                self.stats["notices"] += 1
                self._notify(step)
        return hdr[~hold], vals[~hold]

    def _notify(self, step: int) -> None:
        for ip in self.waiting.get(step, ()):
            self._sendto(NOTICE, step, ip)
        self.last_sent = time.monotonic()

    def _sendto(self, magic: bytes, step: int, ip: str) -> None:
        try:
            self.sock.sendto(_MSG.pack(magic, self.job_id, step), (ip, self.port))
        except OSError:  # unreachable for now (a peer restarting, ARP pending): resent later
            self.stats["notice_send_errors"] += 1

    def poll(self, now: float | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """Handle received notices/acks, resend due notices; returns the answers released."""
        now = time.monotonic() if now is None else now
        released = []
        while True:
            try:
                data, (ip, _) = self.sock.recvfrom(64)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # e.g. ICMP unreachable reported on the socket
                continue
            if len(data) != _MSG.size:
                self.stats["notice_rejected"] += 1
                continue
            magic, job, step = _MSG.unpack(data)
            if job != self.job_id or ip not in self.peers or magic not in (NOTICE, ACK):
                self.stats["notice_rejected"] += 1
            elif magic == NOTICE:
                if self.skip(step):
                    self.stats["notices_acked"] += 1
                    self._sendto(ACK, step, ip)
            elif step in self.waiting:
                self.waiting[step].discard(ip)
                if not self.waiting[step]:
                    del self.waiting[step]
                    self.agreed.add(step)
                    answers = list(self.held.pop(step, {}).values())
                    if answers:
                        released.append((np.stack([h for h, _ in answers]), np.stack([v for _, v in answers])))
        if self.waiting and now - self.last_sent >= NOTICE_RESEND:
            for step in self.waiting:
                self._notify(step)
        return released

    def close(self) -> None:
        self.sock.close()


def ranges_of(topo: Topology, job_id: int) -> list[tuple[int, int, str, str]]:
    """(lo, hi, mac, ip) of each shard of the job, for ParamSources."""
    return [(s.lo, s.hi, s.host.mac, s.host.ip) for s in job_shards(topo, job_id)]

