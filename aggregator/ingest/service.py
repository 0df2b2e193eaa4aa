"""The Ingest service: one bidirectional stream per collector.

A stream is: stream limits (per peer address and in all), the credential (metadata or client
certificate: who the stream is, checked before a single message is read or decoded), the Hello
(protocol version, the node the credential proves), then reports. Each report is validated,
made durable through the group-commit writer, and only then acknowledged. A bad report is
rejected alone (Reject with a gRPC status code and a message); a bad stream (credential,
protocol, undecodable bytes) is ended with that status. Every refusal is counted by reason
and logged with the node.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import grpc

from gpufleet.aggregator.auth.tokens import CollectorAuth
from gpufleet.aggregator.fleet.state import FleetState
from gpufleet.aggregator.ingest.budget import NodeBudgets
from gpufleet.aggregator.ingest.commands import CommandBook
from gpufleet.aggregator.ingest.fanout import Fanout
from gpufleet.aggregator.ingest.hello import StreamOpening
from gpufleet.aggregator.ingest.reports import ReportHandling
from gpufleet.aggregator.ingest.session import (
    End,
    IngestLimits,
    Malformed,
    Received,
    Session,
    decode_collector_message,
    peer_host,
)
from gpufleet.aggregator.ingest.validation import Checker
from gpufleet.aggregator.ingest.workers import WorkerPool
from gpufleet.aggregator.ingest.writer import GroupCommitWriter
from gpufleet.aggregator.metrics import AggregatorMetrics
from gpufleet.common.version import __version__
from gpufleet.protos import ingest_pb2

log = logging.getLogger("gpufleet.aggregator.ingest.service")

SERVICE = "gpufleet.v1.Ingest"


class IngestService(StreamOpening, ReportHandling):
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
        self._streams: dict[str, Session] = {}
        self._checker = Checker(limits.max_report_bytes, limits.retention_s, limits.max_clock_skew_s)
        self._budgets = NodeBudgets(limits.budget)
        self.commands = CommandBook()
        self._open_total = 0  # streams in the handler now, authenticated or not
        self._open_by_peer: dict[str, int] = {}
        self._throttle_logged: dict[str, float] = {}
        # Told of every durable report and every command result, from its own task: the fleet
        # view, the health watch and the repair controller never run on the ack path.
        self.fanout = fanout
        # With ingest workers, each report's checks and its store write happen in a worker
        # process (aggregator/ingest/workers.py); this process keeps the streams.
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
        self.commands.sent(node, command.id, session.hello.boot_id)
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

    def _refuse(self, reason: str, code: grpc.StatusCode, message: str, node: str = "") -> End:
        self._metrics.reject(reason, code.name)
        log.warning(
            "refused collector stream: %s", message, extra={"node": node, "reason": reason, "code": code.name}
        )
        return End(code, message)

    async def stream(
        self, requests: AsyncIterator[object], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[ingest_pb2.AggregatorMessage]:
        peer = peer_host(context.peer())
        if self._open_total >= self._limits.max_streams or (
            self._open_by_peer.get(peer, 0) >= self._limits.max_streams_per_peer
        ):
            end = self._refuse(
                "stream_limit",
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"too many collector streams: {self._open_by_peer.get(peer, 0)} open from {peer} "
                f"(max_streams_per_peer {self._limits.max_streams_per_peer}), {self._open_total} in all "
                f"(max_streams {self._limits.max_streams}); try again later",
            )
            await context.abort(end.code, end.message)
            return
        self._open_total += 1
        self._open_by_peer[peer] = self._open_by_peer.get(peer, 0) + 1
        try:
            opened = await self._open(requests, context)
        except BaseException:
            self._close_slot(peer)
            raise
        if isinstance(opened, End):
            self._close_slot(peer)
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
                    aggregator_version=__version__,
                    max_report_bytes=self._limits.max_report_bytes,
                    columnar_gpus=session.hello.columnar_gpus,
                )
            )
            while True:
                msg = await session.out.get()
                if msg is None:
                    return
                if isinstance(msg, End):
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
            self._close_slot(peer)
            if self._streams.get(node) is session:
                del self._streams[node]
                self._fleet.on_disconnect(node)
            log.info("collector stream closed", extra={"node": node})

    async def _read(self, session: Session, requests: AsyncIterator[object]) -> None:
        node = session.hello.node
        try:
            async for received in requests:
                session.last_message_monotonic = time.monotonic()
                if isinstance(received, Malformed):
                    session.out.put_nowait(
                        self._refuse(
                            "malformed",
                            grpc.StatusCode.INVALID_ARGUMENT,
                            f"node {node!r}: a {received.size}-byte message is not a gpufleet.v1."
                            f"CollectorMessage ({received.error}); stream closed",
                            node,
                        )
                    )
                    return
                assert isinstance(received, Received)
                msg = received.message
                body = msg.WhichOneof("body")
                expired = self._auth.still_valid(session.identity)
                if expired:
                    session.out.put_nowait(
                        self._refuse("unauthenticated", grpc.StatusCode.UNAUTHENTICATED, expired, node)
                    )
                    return
                try:
                    if body == "report":
                        raw = received.report_bytes
                        await self._pace(node, msg.report, len(raw) if raw is not None else None)
                        await self._accept(session, msg.report, raw)
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
