"""What one collector stream is, as the ingest service holds it: the decoded message or why it
is not one, how a stream ends, its session, the limits the service applies."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import grpc
from google.protobuf.message import DecodeError

from gpufleet.aggregator.auth.tokens import CollectorIdentity
from gpufleet.aggregator.ingest.budget import BudgetLimits
from gpufleet.protos import ingest_pb2


@dataclass
class Malformed:
    """Bytes on the stream that do not decode as a CollectorMessage."""

    error: str
    size: int


@dataclass(slots=True)
class Received:
    """A decoded CollectorMessage and, for a report, its bytes: what an ingest worker is handed
    without encoding the report again. unknown_bytes: how many bytes of fields the schema does
    not name were dropped (never stored, kept in the live view or forwarded)."""

    message: ingest_pb2.CollectorMessage
    report_bytes: bytes | None = None
    unknown_bytes: int = 0


# A CollectorMessage that is a report: the report field's tag, then its length (a varint).
_REPORT_TAG = (ingest_pb2.CollectorMessage.DESCRIPTOR.fields_by_name["report"].number << 3) | 2


def report_bytes(data: bytes) -> bytes | None:
    """The NodeReport's own bytes inside a CollectorMessage that holds only a report (as every
    collector sends it), or None when the message is laid out otherwise."""
    if not data or data[0] != _REPORT_TAG:
        return None
    length, shift, at = 0, 0, 1
    while at < len(data) and shift < 64:
        byte = data[at]
        length |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return data[at:] if at + length == len(data) else None
        shift += 7
    return None


def decode_collector_message(data: bytes) -> Received | Malformed:
    """Decoded by the stream's handler, not by gRPC: an undecodable message gets a precise
    status and a count instead of gRPC's generic INTERNAL, and the Hello's size is checked
    before it is decoded. Fields the schema does not name are dropped here, whatever their
    depth (protobuf keeps them otherwise, and serves them back on every answer that copies
    the message: docs/security.md "Bounded per-node state")."""
    try:
        message = ingest_pb2.CollectorMessage.FromString(data)
    except DecodeError as exc:
        return Malformed(str(exc) or "not a valid protobuf message", len(data))
    message.DiscardUnknownFields()
    kept = message.ByteSize()
    if kept == len(data):
        return Received(message, report_bytes(data) if message.HasField("report") else None)
    # Bytes the schema does not name (or a layout other than protobuf's own): what goes on is
    # the message as the schema has it.
    report = message.report.SerializeToString() if message.HasField("report") else None
    return Received(message, report, max(0, len(data) - kept))


class OncePer:
    """Whether a node's message of one kind is due again (at most once per period_s a node):
    what keeps a node that does the same thing every report from flooding the log."""

    def __init__(self, period_s: float = 60.0) -> None:
        self._period_s = period_s
        self._last: dict[str, float] = {}

    def due(self, node: str) -> bool:
        now = time.monotonic()
        if now - self._last.get(node, -1e9) <= self._period_s:
            return False
        self._last[node] = now
        return True


@dataclass
class End:
    code: grpc.StatusCode
    message: str


@dataclass
class Session:
    hello: ingest_pb2.Hello
    peer: str
    identity: CollectorIdentity
    out: asyncio.Queue[ingest_pb2.AggregatorMessage | End | None]
    stream_id: int = 0  # this stream's number, as the ingest workers know it
    acks: list[int] = field(default_factory=list)  # seqs durable this turn of the loop, not yet sent
    last_message_monotonic: float = field(default_factory=time.monotonic)
    inflight: int = 0  # reports submitted to the writer, not yet durable
    drained: asyncio.Event = field(default_factory=asyncio.Event)  # set when inflight is 0
    closed: bool = False


@dataclass
class IngestLimits:
    max_report_bytes: int = 1024 * 1024
    retention_s: float = 14 * 86400
    max_clock_skew_s: float = 300.0
    hello_timeout_s: float = 20.0
    max_hello_bytes: int = 256 * 1024  # a Hello larger than this is refused before it is decoded
    max_hellos_per_node: int = 4  # streams of one credential waiting for their Hello at once
    max_streams: int = 50_000  # collector streams open at once, authenticated or not
    max_streams_per_peer: int = 256  # ... from one peer address
    budget: BudgetLimits = field(default_factory=BudgetLimits)


def peer_host(peer: str) -> str:
    """The address part of a gRPC peer ("ipv4:10.0.0.5:51234" -> "ipv4:10.0.0.5")."""
    host, sep, port = peer.rpartition(":")
    return host if sep and port.isdigit() else peer
