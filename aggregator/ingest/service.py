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
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import grpc

from gpufleet.aggregator.auth.tokens import CollectorAuth
from gpufleet.aggregator.fleet.state import FleetState
from gpufleet.aggregator.ingest.budget import NodeBudgets
from gpufleet.aggregator.ingest.commands import CommandBook
from gpufleet.aggregator.ingest.fanout import Fanout
from gpufleet.aggregator.ingest.refusals import Refusals
from gpufleet.aggregator.ingest.reports import ReportHandling
from gpufleet.aggregator.ingest.session import (
    End,
    IngestLimits,
    Malformed,
    Session,
    decode_collector_message,
    peer_host,
)
from gpufleet.aggregator.ingest.stream_opening import StreamOpening
from gpufleet.aggregator.ingest.validation import Checker
from gpufleet.aggregator.ingest.worker_pool import WorkerPool
from gpufleet.aggregator.ingest.writer import GroupCommitWriter
from gpufleet.aggregator.metrics import AggregatorMetrics
from gpufleet.common.version import __version__
from gpufleet.protos import ingest_pb2

log = logging.getLogger("gpufleet.aggregator.ingest.service")

SERVICE = "gpufleet.v1.Ingest"
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED


class IngestService:
    """The Ingest servicer: admits a stream (the per-peer and total limits), opens it
    (stream_opening.py), reads its messages and hands reports and command results to the report
    handling (reports.py), and writes what the stream is sent."""

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
        self._fleet = fleet
        self._metrics = metrics
        self._limits = limits
        self._streams: dict[str, Session] = {}
        checker = Checker(limits.max_report_bytes, limits.retention_s, limits.max_clock_skew_s)
        budgets = NodeBudgets(limits.budget)
        self._refusals = Refusals(metrics)
        self.commands = CommandBook()
        # Told of every durable report and every command result, from its own task: the fleet
        # view, the health watch and the repair controller never run on the ack path.
        self.fanout = fanout
        # With ingest workers, each report's checks and its store write happen in a worker
        # process (aggregator/ingest/worker_pool.py); this process keeps the streams.
        self._pool = pool
        self._opening = StreamOpening(
            auth, checker, budgets, limits, self._streams, fleet, pool, self._refusals
        )
        self._reports = ReportHandling(checker, budgets, limits, writer, pool, self.commands, fanout, metrics)
        self._open_total = 0  # streams in the handler now, authenticated or not
        self._open_by_peer: dict[str, int] = {}

    def end_invalid_streams(self) -> int:
        """End every stream whose credential has expired or been revoked since it opened (called
        when the revocation list changes); how many were ended."""
        return self._opening.end_invalid_streams()

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
            # Raw bytes: the handler decodes each message (aggregator/ingest/session.py), so
            # that a Hello's size is checked before it is decoded.
            request_deserializer=_raw,
            response_serializer=ingest_pb2.AggregatorMessage.SerializeToString,
        )
        return grpc.method_handlers_generic_handler(SERVICE, {"Stream": method})

    async def stream(
        self, requests: AsyncIterator[object], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[ingest_pb2.AggregatorMessage]:
        peer = peer_host(context.peer())
        if self._open_total >= self._limits.max_streams or (
            self._open_by_peer.get(peer, 0) >= self._limits.max_streams_per_peer
        ):
            end = self._refusals.refuse(
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
            opened = await self._opening.open(requests, context)
        except BaseException:
            self._close_slot(peer)
            raise
        if isinstance(opened, End):
            self._close_slot(peer)
            await release(requests)
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
        expiry = self._expire_at(session)
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
            if expiry is not None:
                expiry.cancel()
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
            await release(requests)  # last: the stream's slot is free whatever it does

    def _expire_at(self, session: Session) -> asyncio.TimerHandle | None:
        """A timer that ends the stream when its credential expires, whether or not the stream
        sends anything then (a token is checked again at each message too)."""
        expires_ns = session.identity.expires_ns
        if not expires_ns:
            return None

        loop = asyncio.get_running_loop()

        def expire() -> None:
            if session.closed:
                return
            why = self._auth.still_valid(session.identity)
            if not why:  # the wall clock is behind the monotonic one: look again in a second
                loop.call_later(1.0, expire)
                return
            session.out.put_nowait(
                self._refusals.refuse(
                    "unauthenticated", grpc.StatusCode.UNAUTHENTICATED, why, session.hello.node
                )
            )

        delay_s = max(0.0, (expires_ns - time.time_ns()) / 1e9) + 0.01
        return loop.call_later(delay_s, expire)

    async def _read(self, session: Session, requests: AsyncIterator[object]) -> None:
        node = session.hello.node
        try:
            async for data in requests:
                session.last_message_monotonic = time.monotonic()
                assert isinstance(data, bytes)
                received = decode_collector_message(data)
                if isinstance(received, Malformed):
                    session.out.put_nowait(
                        self._refusals.refuse(
                            "malformed",
                            grpc.StatusCode.INVALID_ARGUMENT,
                            f"node {node!r}: a {received.size}-byte message is not a gpufleet.v1."
                            f"CollectorMessage ({received.error}); stream closed",
                            node,
                        )
                    )
                    return
                self._refusals.note_unknown(node, received)
                msg = received.message
                body = msg.WhichOneof("body")
                expired = self._auth.still_valid(session.identity)
                if expired:
                    session.out.put_nowait(
                        self._refusals.refuse(
                            "unauthenticated", grpc.StatusCode.UNAUTHENTICATED, expired, node
                        )
                    )
                    return
                try:
                    if body == "report":
                        raw = received.report_bytes
                        await self._reports.pace(node, msg.report, len(raw) if raw is not None else None)
                        await self._reports.accept(session, msg.report, raw)
                        continue
                    if body == "command_result":
                        self._reports.command_result(session, msg)
                        continue
                except Exception as exc:  # a bug: this stream ends INTERNAL, every other goes on
                    log.exception("ingest failed on a %s", body, extra={"node": node})
                    session.out.put_nowait(
                        self._refusals.refuse(
                            "internal",
                            grpc.StatusCode.INTERNAL,
                            f"node {node!r}: the aggregator failed on a {body} ({exc!r}); reconnect "
                            "and replay",
                            node,
                        )
                    )
                    return
                session.out.put_nowait(
                    self._refusals.refuse(
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
        self._reports.send_acks(session)
        session.out.put_nowait(None)

    def _close_slot(self, peer: str) -> None:
        self._open_total -= 1
        left = self._open_by_peer.pop(peer) - 1
        if left:
            self._open_by_peer[peer] = left


def _raw(data: bytes) -> bytes:
    return data


RELEASE_TIMEOUT_S = 1.0


async def release(requests: AsyncIterator[object]) -> None:
    """Close gRPC's request iterator. It is an async generator that holds the last message it
    yielded while it is suspended, in a reference cycle with its receiver: left open, a refused
    stream's Hello (up to the transport's limit) stays in memory until the cyclic collector
    runs (200 streams of one token reading 3.9 MiB each kept 16 MiB more a round)."""
    agen = requests.__aiter__()
    aclose = getattr(agen, "aclose", None)
    if aclose is not None:
        # Bounded: a generator still inside gRPC's read is left to the cyclic collector.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(aclose(), RELEASE_TIMEOUT_S)
