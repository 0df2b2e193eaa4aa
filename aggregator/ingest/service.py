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
from dataclasses import dataclass, field

import grpc
from google.protobuf.message import DecodeError

from gpufleet.aggregator.auth.tokens import AuthError, CollectorAuth, CollectorIdentity
from gpufleet.aggregator.fleet.state import FleetState
from gpufleet.aggregator.ingest.budget import BudgetLimits, NodeBudgets
from gpufleet.aggregator.ingest.fanout import Fanout
from gpufleet.aggregator.ingest.validation import Checker, Rejection
from gpufleet.aggregator.ingest.workers import WorkerPool
from gpufleet.aggregator.ingest.writer import GroupCommitWriter
from gpufleet.aggregator.metrics import AggregatorMetrics
from gpufleet.aggregator.store import StoreError
from gpufleet.aggregator.store.base import PointsRefused
from gpufleet.common.version import __version__
from gpufleet.protos import ingest_pb2, telemetry_pb2

log = logging.getLogger("gpufleet.aggregator.ingest.service")

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
    identity: CollectorIdentity
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
    hello_timeout_s: float = 10.0
    max_streams: int = 50_000  # collector streams open at once, authenticated or not
    max_streams_per_peer: int = 256  # ... from one peer address
    budget: BudgetLimits = field(default_factory=BudgetLimits)


def peer_host(peer: str) -> str:
    """The address part of a gRPC peer ("ipv4:10.0.0.5:51234" -> "ipv4:10.0.0.5")."""
    host, sep, port = peer.rpartition(":")
    return host if sep and port.isdigit() else peer


COMMANDS_PER_NODE = 256  # commands awaiting an answer that one node's book keeps (oldest forgotten)
COMMAND_ANSWER_S = 3600.0  # an answer later than this is refused (the step timed out long ago)


@dataclass
class _SentCommand:
    boot_id: str
    sent: float  # monotonic


class CommandBook:
    """The commands sent to each node's collector and not yet answered (docs/security.md
    "Commands bound to their node"): an answer is taken only for a command sent to that node,
    from the same collector boot it was sent to (a later stream of that boot may carry it: a
    result the broken stream did not), and only once. Anything else is refused and counted."""

    def __init__(self) -> None:
        self._sent: dict[str, dict[str, _SentCommand]] = {}

    def sent(self, node: str, command_id: str, boot_id: str) -> None:
        book = self._sent.setdefault(node, {})
        book[command_id] = _SentCommand(boot_id, time.monotonic())
        while len(book) > COMMANDS_PER_NODE:
            del book[next(iter(book))]

    def answer(self, node: str, command_id: str, boot_id: str) -> str:
        """Why this answer is refused ("" when it is this node's, taken now)."""
        book = self._sent.get(node, {})
        sent = book.get(command_id)
        if sent is None:
            return f"no command {command_id[:80]!r} was sent to node {node!r} (or it was answered already)"
        if sent.boot_id != boot_id:
            return (
                f"command {command_id[:80]!r} was sent to another collector boot of node {node!r}; "
                "a restarted collector cannot answer it"
            )
        del book[command_id]
        if time.monotonic() - sent.sent > COMMAND_ANSWER_S:
            return f"command {command_id[:80]!r} was sent more than {COMMAND_ANSWER_S:g} s ago"
        return ""


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

    def _refuse(self, reason: str, code: grpc.StatusCode, message: str, node: str = "") -> _End:
        self._metrics.reject(reason, code.name)
        log.warning(
            "refused collector stream: %s", message, extra={"node": node, "reason": reason, "code": code.name}
        )
        return _End(code, message)

    async def _identify(self, context: grpc.aio.ServicerContext) -> CollectorIdentity | _End:
        """Who the stream is, from its metadata and certificate alone: nothing it sends is read
        before this, so an unauthenticated peer costs no decode and no memory."""
        try:
            return await self._auth.identify(context.invocation_metadata(), context.auth_context())
        except AuthError as exc:
            return self._refuse("unauthenticated", grpc.StatusCode.UNAUTHENTICATED, str(exc))

    async def _open(
        self, requests: AsyncIterator[object], context: grpc.aio.ServicerContext
    ) -> _Session | _End:
        """Authenticate, then read the Hello; a session, or why the stream ends."""
        identity = await self._identify(context)
        if isinstance(identity, _End):
            return identity
        node = identity.node
        try:
            first = await asyncio.wait_for(anext(requests), self._limits.hello_timeout_s)
        except (StopAsyncIteration, TimeoutError):
            return self._refuse(
                "no_hello",
                grpc.StatusCode.INVALID_ARGUMENT,
                f"node {node!r}: no hello within {self._limits.hello_timeout_s:g} s of opening the stream",
                node,
            )
        if isinstance(first, Malformed):
            return self._refuse(
                "malformed",
                grpc.StatusCode.INVALID_ARGUMENT,
                f"node {node!r}: first message ({first.size} bytes) is not a gpufleet.v1.CollectorMessage: "
                f"{first.error}",
                node,
            )
        if first.WhichOneof("body") != "hello":
            return self._refuse(
                "no_hello",
                grpc.StatusCode.INVALID_ARGUMENT,
                f"node {node!r}: the first message must be a hello, got {first.WhichOneof('body')}",
                node,
            )
        hello = first.hello
        try:
            self._checker.check_hello(hello)
        except Rejection as r:
            return self._refuse(r.reason, r.code, r.message, hello.node)
        if hello.node != node:
            return self._refuse(
                "unauthenticated",
                grpc.StatusCode.UNAUTHENTICATED,
                f"the credential presented belongs to the collector on node {node!r}, not "
                f"{hello.node!r}; give {hello.node!r} its own (`gpufleet auth collector-token "
                f"{hello.node}`)",
                hello.node,
            )
        why = self._budgets.admit_series(
            node, "gpu", ((g.index, g.uuid, g.model, hello.cluster) for g in hello.gpus)
        )
        if why:
            return self._refuse(
                "series_cap", grpc.StatusCode.RESOURCE_EXHAUSTED, f"node {node!r}: hello refused: {why}", node
            )
        existing = self._streams.get(node)
        if existing and existing.hello.boot_id != hello.boot_id:
            interval = existing.hello.interval_s
            quiet_s = time.monotonic() - existing.last_message_monotonic
            if quiet_s < 3 * interval + 1:
                return self._refuse(
                    "duplicate_node",
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"node {node!r} is already streaming from {existing.peer} (last message "
                    f"{quiet_s:.1f} s ago); this second collector (boot {hello.boot_id}) is refused. "
                    "Two hosts share this node name or credential. (The first one's boot id is not "
                    "told: it is what a stream of that collector presents.)",
                    node,
                )
        if existing:
            # The same collector reconnecting, or an old stream gone quiet: the new one wins.
            existing.out.put_nowait(
                _End(grpc.StatusCode.ABORTED, "superseded by a newer stream for this node")
            )
        self._next_stream_id += 1
        session = _Session(
            hello=hello,
            peer=context.peer(),
            identity=identity,
            out=asyncio.Queue(),
            stream_id=self._next_stream_id,
        )
        self._streams[node] = session
        if self._pool is not None:
            self._pool.open_stream(session.stream_id, hello)
        self._fleet.on_hello(hello, stream=session.stream_id)
        return session

    def _close_slot(self, peer: str) -> None:
        self._open_total -= 1
        left = self._open_by_peer.pop(peer) - 1
        if left:
            self._open_by_peer[peer] = left

    def end_invalid_streams(self) -> int:
        """End every stream whose credential has expired or been revoked since it opened (called
        when the revocation list changes); how many were ended."""
        ended = 0
        for node, session in list(self._streams.items()):
            why = self._auth.still_valid(session.identity)
            if why and not session.closed:
                session.out.put_nowait(
                    self._refuse("unauthenticated", grpc.StatusCode.UNAUTHENTICATED, why, node)
                )
                ended += 1
        return ended

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
        if isinstance(opened, _End):
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
            self._close_slot(peer)
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
                expired = self._auth.still_valid(session.identity)
                if expired:
                    session.out.put_nowait(
                        self._refuse("unauthenticated", grpc.StatusCode.UNAUTHENTICATED, expired, node)
                    )
                    return
                try:
                    if body == "report":
                        await self._pace(node, msg.report)
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

    async def _pace(self, node: str, report: telemetry_pb2.NodeReport) -> None:
        """Hold the stream back while the node sends faster than its budget (node_budget.py)."""
        wait_s = self._budgets.pace(node, report.ByteSize())
        if wait_s <= 0:
            return
        self._metrics.throttled.inc()
        now = time.monotonic()
        if now - self._throttle_logged.get(node, -1e9) > 60:
            self._throttle_logged[node] = now
            log.warning(
                "node sends faster than its report or byte rate (node_reports_per_s %g, node_bytes_per_s "
                "%g): its stream is read more slowly (%.2f s now); logged once a minute",
                self._limits.budget.reports_per_s,
                self._limits.budget.bytes_per_s,
                wait_s,
                extra={"node": node},
            )
        await asyncio.sleep(wait_s)  # rate limiting, not synchronisation: the stream waits its turn

    def _command_result(self, session: _Session, msg: ingest_pb2.CollectorMessage) -> None:
        node, result = session.hello.node, msg.command_result
        try:
            self._checker.check_message(msg, f"node {node!r}: command result")
        except Rejection as r:
            # Nothing to reject on the wire (a result has no seq): counted, logged, not acted on.
            self._metrics.reject(r.reason, r.code.name)
            log.warning("ignored command result: %s", r.message, extra={"node": node, "reason": r.reason})
            return
        why = self.commands.answer(node, result.id, session.hello.boot_id)
        if why:
            self._metrics.command_results_refused.inc()
            self._metrics.reject("command_not_ours", grpc.StatusCode.PERMISSION_DENIED.name)
            log.warning(
                "refused a command result: %s", why, extra={"node": node, "command_id": result.id[:80]}
            )
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
        if report.engines:
            why = self._budgets.admit_series(
                session.hello.node,
                "engine",
                ((e.engine, e.model, e.port, session.hello.cluster) for e in report.engines),
            )
            if why:
                self._reject(
                    session,
                    report.seq,
                    Rejection(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        "series_cap",
                        f"node {session.hello.node!r}: report seq {report.seq} refused: {why}",
                    ),
                )
                return
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
        self.fanout.report(report, time.time_ns(), session.stream_id)
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
