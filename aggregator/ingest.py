"""The Ingest service: one bidirectional stream per collector.

A stream is: credential check (metadata), Hello (protocol version, node identity bound to
the credential), then reports. Each report is validated, made durable through the group
-commit writer, and only then acknowledged. A bad report is rejected alone (Reject with a
gRPC status code and a message); a bad stream (credential, protocol, undecodable bytes)
is ended with that status. Every refusal is counted by reason and logged with the node.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
from google.protobuf.message import DecodeError

import gpufleet
from gpufleet.aggregator.auth import AuthError, CollectorAuth, bearer, is_service_account_token
from gpufleet.aggregator.fanout import Fanout
from gpufleet.aggregator.fleet_state import FleetState
from gpufleet.aggregator.metrics import AggregatorMetrics
from gpufleet.aggregator.store import StoreError
from gpufleet.aggregator.store.base import PointsRefused
from gpufleet.aggregator.validation import Checker, Rejection
from gpufleet.aggregator.workers import WorkerPool
from gpufleet.aggregator.writer import GroupCommitWriter
from gpufleet.protos import ingest_pb2, telemetry_pb2

log = logging.getLogger("gpufleet.aggregator.ingest")

SERVICE = "gpufleet.v1.Ingest"


@dataclass
class Malformed:
    """Bytes on the stream that do not decode as a CollectorMessage."""

    error: str
    size: int


def decode_collector_message(data: bytes) -> ingest_pb2.CollectorMessage | Malformed:
    # Decoding here, not in gRPC, lets an undecodable message get a precise status and a
    # count instead of gRPC's generic INTERNAL.
    try:
        return ingest_pb2.CollectorMessage.FromString(data)
    except DecodeError as exc:
        return Malformed(str(exc) or "not a valid protobuf message", len(data))


@dataclass
class _End:
    code: grpc.StatusCode
    message: str


@dataclass
class _Session:
    hello: ingest_pb2.Hello
    peer: str
    out: asyncio.Queue[ingest_pb2.AggregatorMessage | _End | None]
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
    hello_timeout_s: float = 30.0


class IngestService:
    def __init__(
        self,
        auth: CollectorAuth,
        writer: GroupCommitWriter,
        fleet: FleetState,
        metrics: AggregatorMetrics,
        limits: IngestLimits,
        fanout: Fanout,
        pool: WorkerPool | None = None,
    ) -> None:
        self._auth = auth
        self._writer = writer
        self._fleet = fleet
        self._metrics = metrics
        self._limits = limits
        self._streams: dict[str, _Session] = {}
        self._checker = Checker(limits.max_report_bytes, limits.retention_s, limits.max_clock_skew_s)
        # Told of every durable report and every command result, from its own task: the fleet
        # view, the health watch and the repair controller never run on the ack path.
        self.fanout = fanout
        # With ingest workers, each report's checks and its store write happen in a worker
        # process (aggregator/workers.py); this process keeps the streams.
        self._pool = pool
        self._next_stream_id = 0

    @property
    def streams_open(self) -> int:
        return len(self._streams)

    def streaming_nodes(self) -> list[str]:
        """The nodes whose collector stream this process holds now."""
        return [n for n, session in self._streams.items() if not session.closed]

    def send_command(self, node: str, command: ingest_pb2.Command) -> bool:
        """Queue a command down the node's stream; False when its collector is not connected."""
        session = self._streams.get(node)
        if session is None or session.closed:
            return False
        session.out.put_nowait(ingest_pb2.AggregatorMessage(command=command))
        log.info("command %s sent: %s", command.id, command.WhichOneof("action"), extra={"node": node})
        return True

    def handler(self) -> grpc.GenericRpcHandler:
        method = grpc.stream_stream_rpc_method_handler(
            self.stream,
            request_deserializer=decode_collector_message,
            response_serializer=ingest_pb2.AggregatorMessage.SerializeToString,
        )
        return grpc.method_handlers_generic_handler(SERVICE, {"Stream": method})

    def _refuse(self, reason: str, code: grpc.StatusCode, message: str, node: str = "") -> _End:
        self._metrics.reject(reason, code.name)
        log.warning(
            "refused collector stream: %s", message, extra={"node": node, "reason": reason, "code": code.name}
        )
        return _End(code, message)

    async def _open(
        self, requests: AsyncIterator[object], context: grpc.aio.ServicerContext
    ) -> _Session | _End:
        """Authenticate and read the Hello; a session, or why the stream ends."""
        try:
            token = bearer(context.invocation_metadata())
        except AuthError as exc:
            return self._refuse("unauthenticated", grpc.StatusCode.UNAUTHENTICATED, str(exc))
        try:
            first = await asyncio.wait_for(anext(requests), self._limits.hello_timeout_s)
        except (StopAsyncIteration, TimeoutError):
            return self._refuse(
                "no_hello",
                grpc.StatusCode.INVALID_ARGUMENT,
                f"no hello within {self._limits.hello_timeout_s:g} s of opening the stream",
            )
        if isinstance(first, Malformed):
            return self._refuse(
                "malformed",
                grpc.StatusCode.INVALID_ARGUMENT,
                f"first message ({first.size} bytes) is not a gpufleet.v1.CollectorMessage: {first.error}",
            )
        if first.WhichOneof("body") != "hello":
            return self._refuse(
                "no_hello",
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the first message must be a hello, got {first.WhichOneof('body')}",
            )
        hello = first.hello
        try:
            self._checker.check_hello(hello)
        except Rejection as r:
            return self._refuse(r.reason, r.code, r.message, hello.node)
        try:
            await self._auth.check(token, hello.node)
        except AuthError as exc:
            return self._refuse(
                "unauthenticated",
                grpc.StatusCode.UNAUTHENTICATED,
                f"{exc}"
                + (
                    ""
                    if is_service_account_token(token)
                    else f"; issue one with `gpufleet auth collector-token {hello.node}`"
                ),
                hello.node,
            )
        existing = self._streams.get(hello.node)
        if existing and existing.hello.boot_id != hello.boot_id:
            interval = existing.hello.interval_s
            quiet_s = time.monotonic() - existing.last_message_monotonic
            if quiet_s < 3 * interval + 1:
                return self._refuse(
                    "duplicate_node",
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"node {hello.node!r} is already streaming from {existing.peer} (collector boot "
                    f"{existing.hello.boot_id}, last message {quiet_s:.1f} s ago); this second "
                    f"collector (boot {hello.boot_id}) is refused. Two hosts share this node name "
                    "or credential.",
                    hello.node,
                )
        if existing:
            # The same collector reconnecting, or an old stream gone quiet: the new one wins.
            existing.out.put_nowait(
                _End(grpc.StatusCode.ABORTED, "superseded by a newer stream for this node")
            )
        self._next_stream_id += 1
        session = _Session(
            hello=hello, peer=context.peer(), out=asyncio.Queue(), stream_id=self._next_stream_id
        )
        self._streams[hello.node] = session
        if self._pool is not None:
            self._pool.open_stream(session.stream_id, hello)
        self._fleet.on_hello(hello)
        return session

    async def stream(
        self, requests: AsyncIterator[object], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[ingest_pb2.AggregatorMessage]:
        opened = await self._open(requests, context)
        if isinstance(opened, _End):
            await context.abort(opened.code, opened.message)
            return
        session = opened
        node = session.hello.node
        self._metrics.streams_open.inc()
        log.info(
            "collector connected from %s (boot %s, %d GPUs)",
            session.peer,
            session.hello.boot_id,
            len(session.hello.gpus),
            extra={"node": node},
        )
        reader = asyncio.create_task(self._read(session, requests))
        try:
            yield ingest_pb2.AggregatorMessage(
                welcome=ingest_pb2.Welcome(
                    protocol_version=session.hello.protocol_version,
                    aggregator_version=gpufleet.__version__,
                    max_report_bytes=self._limits.max_report_bytes,
                )
            )
            while True:
                msg = await session.out.get()
                if msg is None:
                    return
                if isinstance(msg, _End):
                    await context.abort(msg.code, msg.message)
                    return
                yield msg
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            session.closed = True
            if self._pool is not None:
                self._pool.close_stream(session.stream_id)
            self._metrics.streams_open.dec()
            if self._streams.get(node) is session:
                del self._streams[node]
                self._fleet.on_disconnect(node)
            log.info("collector stream closed", extra={"node": node})

    async def _read(self, session: _Session, requests: AsyncIterator[object]) -> None:
        node = session.hello.node
        try:
            async for msg in requests:
                session.last_message_monotonic = time.monotonic()
                if isinstance(msg, Malformed):
                    session.out.put_nowait(
                        self._refuse(
                            "malformed",
                            grpc.StatusCode.INVALID_ARGUMENT,
                            f"node {node!r}: a {msg.size}-byte message is not a gpufleet.v1."
                            f"CollectorMessage ({msg.error}); stream closed",
                            node,
                        )
                    )
                    return
                body = msg.WhichOneof("body")
                try:
                    if body == "report":
                        await self._accept(session, msg.report)
                        continue
                    if body == "command_result":
                        self._command_result(session, msg)
                        continue
                except Exception as exc:  # a bug: this stream ends INTERNAL, every other goes on
                    log.exception("ingest failed on a %s", body, extra={"node": node})
                    session.out.put_nowait(
                        self._refuse(
                            "internal",
                            grpc.StatusCode.INTERNAL,
                            f"node {node!r}: the aggregator failed on a {body} ({exc!r}); reconnect "
                            "and replay",
                            node,
                        )
                    )
                    return
                session.out.put_nowait(
                    self._refuse(
                        "protocol",
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"node {node!r}: unexpected {body or 'empty'} message after the hello",
                        node,
                    )
                )
                return
        except grpc.aio.AioRpcError as exc:
            # e.g. a message over the transport limit: gRPC ends the stream itself.
            self._metrics.reject("transport", exc.code().name)
            log.warning("collector stream broke: %s %s", exc.code().name, exc.details(), extra={"node": node})
        # Let in-flight writes finish so their acks still go out, then end the stream.
        if session.inflight:
            session.drained.clear()
            await session.drained.wait()
        self._send_acks(session)
        session.out.put_nowait(None)

    def _command_result(self, session: _Session, msg: ingest_pb2.CollectorMessage) -> None:
        node, result = session.hello.node, msg.command_result
        try:
            self._checker.check_message(msg, f"node {node!r}: command result")
        except Rejection as r:
            # Nothing to reject on the wire (a result has no seq): counted, logged, not acted on.
            self._metrics.reject(r.reason, r.code.name)
            log.warning("ignored command result: %s", r.message, extra={"node": node, "reason": r.reason})
            return
        log.info(
            "command %s on the node ended %s: %s",
            result.id,
            result.outcome,
            result.detail,
            extra={"node": node},
        )
        self.fanout.command_result(node, result)

    def _reject(self, session: _Session, seq: int, r: Rejection) -> None:
        self._metrics.reject(r.reason, r.code.name)
        log.warning(
            "rejected report: %s",
            r.message,
            extra={"node": session.hello.node, "seq": seq, "reason": r.reason},
        )
        if not session.closed:
            self._send_acks(session)  # in order: what was durable before this refusal first
            session.out.put_nowait(
                ingest_pb2.AggregatorMessage(
                    # seq as sent, clamped to the field: a Reject for an out-of-range seq still encodes
                    reject=ingest_pb2.Reject(seq=seq & (2**64 - 1), code=r.code.value[0], message=r.message)
                )
            )

    async def _accept(self, session: _Session, report: telemetry_pb2.NodeReport) -> None:
        if self._pool is not None:
            if not self._pool.has_room:
                await self._pool.wait_for_room()
            session.inflight += 1
            self._pool.submit(
                session.stream_id,
                session.hello.node,
                report.SerializeToString(),
                lambda error: self._durable(session, report, error),
            )
            return
        try:
            points = self._checker.check_report(report, session.hello)
        except Rejection as r:
            self._reject(session, report.seq, r)
            return
        if not self._writer.has_room:
            await self._writer.wait_for_room()
        session.inflight += 1
        self._writer.submit(points, lambda error: self._durable(session, report, error))

    def _durable(
        self, session: _Session, report: telemetry_pb2.NodeReport, error: StoreError | Rejection | None
    ) -> None:
        """Called by the writer (or an ingest worker) once the report is durable (error None),
        refused (a Rejection from a worker's checks, or PointsRefused) or could not be made
        durable. Only acknowledges: the listeners get the report through the fanout's queue."""
        session.inflight -= 1
        if not session.inflight:
            session.drained.set()
        if isinstance(error, Rejection):
            self._reject(session, report.seq, error)
            return
        if isinstance(error, PointsRefused):
            self._reject(
                session,
                report.seq,
                Rejection(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "store_refused",
                    f"node {session.hello.node!r}: report seq {report.seq} was refused by the store "
                    f"({error}); the other reports of its batch were stored",
                ),
            )
            return
        if error is not None:
            # Not acknowledged: the collector keeps the report and replays it on reconnect.
            self._send_acks(session)
            session.out.put_nowait(
                _End(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the store could not make report seq {report.seq} durable ({error}); "
                    "reconnect and replay",
                )
            )
            return
        self.fanout.report(report, time.time_ns())
        self._metrics.reports_accepted.inc()
        self._metrics.gpu_samples.inc(len(report.gpus))
        if not session.closed:
            # Every report of this stream made durable in this turn of the event loop (a group
            # commit completes many at once) goes out in one Ack: one gRPC write, not one each.
            if not session.acks:
                asyncio.get_running_loop().call_soon(self._send_acks, session)
            session.acks.append(report.seq)

    def _send_acks(self, session: _Session) -> None:
        if session.acks and not session.closed:
            session.out.put_nowait(ingest_pb2.AggregatorMessage(ack=ingest_pb2.Ack(seqs=session.acks)))
        session.acks = []
