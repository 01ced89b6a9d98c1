"""The StreamChannel half of the embedded switch's P4Runtime service: arbitration by election id
(the highest is the primary; every stream with an id is told who is), the primary's packet-out
into the pipeline's CPU port, and packet-in from it to the primary, each client's messages in a
bounded outbox."""
from __future__ import annotations

import asyncio
import collections
import threading
from dataclasses import dataclass

import grpc
from google.rpc import code_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from .p4runtime_codec import encode_int
from .p4runtime_pipeline import Pipeline

MAX_STREAMS = 256  # open StreamChannels; more are refused with RESOURCE_EXHAUSTED
STREAM_QUEUE = 1024  # messages waiting for one client that does not read


class Outbox:
    """Messages to one stream's client: put from any thread, awaited on the server's event loop.

    Bounded, so a client that does not read cannot grow the switch: a packet-in beyond the bound is
    dropped (counted by the service); any other message beyond it ends the stream with
    RESOURCE_EXHAUSTED, since the client would otherwise miss an arbitration change."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int):
        self.loop = loop
        self.limit = limit
        self.items: collections.deque = collections.deque()
        self.lock = threading.Lock()
        self.ready = asyncio.Event()
        self.closed = False

    def put(self, item, droppable: bool = False) -> bool:
        """False if the item was not queued (a dropped packet-in, or the stream is ending)."""
        with self.lock:
            if self.closed:
                return False
            if len(self.items) >= self.limit:
                if droppable:
                    return False
                self.items.clear()
                item = (grpc.StatusCode.RESOURCE_EXHAUSTED, "stream closed: the client does not read its messages")
            if item is None or isinstance(item, tuple):
                self.closed = True  # the end (or an error ending the stream) is the last message
            self.items.append(item)
        self.loop.call_soon_threadsafe(self.ready.set)
        return True

    async def get(self):
        while True:
            with self.lock:
                if self.items:
                    return self.items.popleft()
                self.ready.clear()
            await self.ready.wait()


@dataclass(eq=False)
class Stream:
    outbox: Outbox
    election_id: int | None = None


class StreamService(p4runtime_pb2_grpc.P4RuntimeServicer):
    """StreamChannel, run on the server's event loop: it takes only `arb_lock` (held for list
    updates and queue puts), so idle streams hold no thread and a long pipeline compile does not
    stall them. SwitchService adds the unary RPCs and sets `pipeline`, whose packet_out and
    packet_in metadata frame the packets."""

    def __init__(self, device_id: int, cpu_port: int | None, inject):
        self.device_id = device_id
        self.cpu_port = cpu_port
        self.inject = inject  # callable(frame, port) for packet-out; set by the data plane
        self.pipeline: Pipeline | None = None
        self.arb_lock = threading.Lock()
        self.streams: list[Stream] = []
        self.packet_in_dropped = 0  # packet-ins the primary's full stream queue had no room for

    def primary_election_id(self) -> int | None:
        ids = [s.election_id for s in self.streams if s.election_id is not None]
        return max(ids) if ids else None

    def is_primary(self, election_id) -> bool:
        with self.arb_lock:
            primary = self.primary_election_id()
        return primary is not None and (election_id.high << 64) | election_id.low == primary

    def _notify_all(self) -> None:
        primary = self.primary_election_id()
        for s in self.streams:
            if s.election_id is not None:
                self._send_arbitration(s, primary)

    def _send_arbitration(self, s: Stream, primary: int | None) -> None:
        resp = p4runtime_pb2.StreamMessageResponse()
        arb = resp.arbitration
        arb.device_id = self.device_id
        if primary is not None:
            arb.election_id.high = primary >> 64
            arb.election_id.low = primary & ((1 << 64) - 1)
        if s.election_id == primary:
            arb.status.code = code_pb2.OK
            arb.status.message = "Is master"
        else:
            arb.status.code = code_pb2.ALREADY_EXISTS
            arb.status.message = "Is slave"
        s.outbox.put(resp)

    async def StreamChannel(self, request_iterator, context):
        s = Stream(Outbox(asyncio.get_running_loop(), STREAM_QUEUE))
        with self.arb_lock:
            full = len(self.streams) >= MAX_STREAMS
            if not full:
                self.streams.append(s)
        if full:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"too many streams (at most {MAX_STREAMS})")
        reader = asyncio.ensure_future(self._read_stream(s, request_iterator))
        try:
            while True:
                item = await s.outbox.get()
                if item is None:
                    break
                if isinstance(item, tuple):  # (grpc code, message): end the stream with an error
                    await context.abort(item[0], item[1])
                yield item
        finally:
            reader.cancel()
            with self.arb_lock:
                self.streams.remove(s)
                if s.election_id is not None:
                    self._notify_all()

    async def _read_stream(self, s: Stream, request_iterator) -> None:
        try:
            async for req in request_iterator:
                if not self._on_stream_message(s, req):
                    break
        except Exception:  # the client went away
            pass
        finally:
            s.outbox.put(None)

    def _on_stream_message(self, s: Stream, req) -> bool:
        which = req.WhichOneof("update")
        if which == "arbitration":
            arb = req.arbitration
            if arb.device_id != self.device_id:
                s.outbox.put((grpc.StatusCode.NOT_FOUND, f"Invalid device id {arb.device_id}"))
                return False
            eid = (arb.election_id.high << 64) | arb.election_id.low
            with self.arb_lock:
                if any(o is not s and o.election_id == eid for o in self.streams):
                    s.outbox.put((grpc.StatusCode.INVALID_ARGUMENT, "Election id already in use by another client"))
                    return False
                s.election_id = eid
                self._notify_all()
        elif which == "packet":
            with self.arb_lock:
                if s.election_id is None or s.election_id != self.primary_election_id():
                    return True  # only the primary may send packets; ignored like BMv2
            self._packet_out(req.packet)
        return True

    def _packet_out(self, pkt) -> None:
        pl = self.pipeline
        if pl is None or self.inject is None or self.cpu_port is None:
            return
        header = b""
        if pl.packet_out:
            values = {m.metadata_id: m.value for m in pkt.metadata}
            v, bits = 0, 0
            for i, (name, width) in enumerate(pl.packet_out, start=1):
                v = (v << width) | (int.from_bytes(values.get(i, b"\0"), "big") & ((1 << width) - 1))
                bits += width
            header = v.to_bytes((bits + 7) // 8, "big")
        self.inject(header + pkt.payload, self.cpu_port)

    def packet_in(self, frame: bytes) -> None:
        """A frame the pipeline sent to the CPU port: to the primary controller as PacketIn."""
        pl = self.pipeline
        resp = p4runtime_pb2.StreamMessageResponse()
        payload = frame
        if pl and pl.packet_in:
            bits = sum(w for _, w in pl.packet_in)
            nbytes = (bits + 7) // 8
            v = int.from_bytes(frame[:nbytes], "big") >> (nbytes * 8 - bits)
            shift = bits
            for i, (_, width) in enumerate(pl.packet_in, start=1):
                shift -= width
                md = resp.packet.metadata.add()
                md.metadata_id = i
                md.value = encode_int((v >> shift) & ((1 << width) - 1), width)
            payload = frame[nbytes:]
        resp.packet.payload = payload
        with self.arb_lock:
            primary = self.primary_election_id()
            to = [s for s in self.streams if primary is not None and s.election_id == primary]
        for s in to:
            if not s.outbox.put(resp, droppable=True):
                self.packet_in_dropped += 1
