"""Opening a collector stream: who it is (from its credential, before any message is read), its
Hello checked against that, the node's series budget and the stream it supersedes; and ending
streams whose credential has expired or been revoked."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc

from gpufleet.aggregator.auth.tokens import AuthError, CollectorAuth, CollectorIdentity
from gpufleet.aggregator.fleet.state import FleetState
from gpufleet.aggregator.ingest.budget import NodeBudgets
from gpufleet.aggregator.ingest.refusals import Refusals
from gpufleet.aggregator.ingest.session import (
    End,
    IngestLimits,
    Malformed,
    Received,
    Session,
    decode_collector_message,
)
from gpufleet.aggregator.ingest.validation import Checker, Rejection
from gpufleet.aggregator.ingest.worker_pool import WorkerPool


class StreamOpening:
    """Opens streams into `streams` (node -> its session, shared with the service), one per node."""

    def __init__(
        self,
        auth: CollectorAuth,
        checker: Checker,
        budgets: NodeBudgets,
        limits: IngestLimits,
        streams: dict[str, Session],
        fleet: FleetState,
        pool: WorkerPool | None,
        refusals: Refusals,
    ) -> None:
        self._auth = auth
        self._checker = checker
        self._budgets = budgets
        self._limits = limits
        self._streams = streams
        self._fleet = fleet
        self._pool = pool
        self._refusals = refusals
        self._awaiting_hello: dict[str, int] = {}  # node -> its streams not past their Hello yet
        self._next_stream_id = 0

    async def _identify(self, context: grpc.aio.ServicerContext) -> CollectorIdentity | End:
        """Who the stream is, from its metadata and certificate alone: nothing it sends is read
        before this, so an unauthenticated peer costs no decode and no memory."""
        try:
            return await self._auth.identify(context.invocation_metadata(), context.auth_context())
        except AuthError as exc:
            return self._refusals.refuse("unauthenticated", grpc.StatusCode.UNAUTHENTICATED, str(exc))

    async def open(self, requests: AsyncIterator[object], context: grpc.aio.ServicerContext) -> Session | End:
        """Authenticate, then read the Hello; a session, or why the stream ends."""
        identity = await self._identify(context)
        if isinstance(identity, End):
            return identity
        node = identity.node
        first = await self._first_message(node, requests)
        if isinstance(first, End):
            return first
        hello = first.message.hello
        self._refusals.note_unknown(node, first)
        try:
            self._checker.check_hello(hello)
        except Rejection as r:
            return self._refusals.refuse(r.reason, r.code, r.message, hello.node)
        if hello.node != node:
            return self._refusals.refuse(
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
            return self._refusals.refuse(
                "series_cap", grpc.StatusCode.RESOURCE_EXHAUSTED, f"node {node!r}: hello refused: {why}", node
            )
        existing = self._streams.get(node)
        if existing and existing.hello.boot_id != hello.boot_id:
            interval = existing.hello.interval_s
            quiet_s = time.monotonic() - existing.last_message_monotonic
            if quiet_s < 3 * interval + 1:
                return self._refusals.refuse(
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
                End(grpc.StatusCode.ABORTED, "superseded by a newer stream for this node")
            )
        self._next_stream_id += 1
        session = Session(
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

    async def _first_message(self, node: str, requests: AsyncIterator[object]) -> Received | End:
        """The stream's Hello, decoded once its size is known to be a Hello's; or why not."""
        waiting = self._awaiting_hello.get(node, 0)
        if waiting >= self._limits.max_hellos_per_node:
            # Nothing of this stream is read: one credential's streams cannot hold more than
            # max_hellos_per_node Hellos in memory (docs/security.md "Bounded per-node state").
            return self._refusals.refuse(
                "hello_limit",
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"node {node!r}: {waiting} streams of this credential already wait for their hello "
                f"(max_hellos_per_node {self._limits.max_hellos_per_node}); try again later",
                node,
            )
        self._awaiting_hello[node] = waiting + 1
        try:
            async with asyncio.timeout(self._limits.hello_timeout_s):
                raw = await anext(requests)
        except (StopAsyncIteration, TimeoutError):
            return self._refusals.refuse(
                "no_hello",
                grpc.StatusCode.INVALID_ARGUMENT,
                f"node {node!r}: no hello within {self._limits.hello_timeout_s:g} s of opening the stream",
                node,
            )
        finally:
            left = self._awaiting_hello.pop(node) - 1
            if left:
                self._awaiting_hello[node] = left
        assert isinstance(raw, bytes)
        if len(raw) > self._limits.max_hello_bytes:
            return self._refusals.refuse(
                "hello_too_large",
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"node {node!r}: a {len(raw)}-byte first message is over max_hello_bytes "
                f"({self._limits.max_hello_bytes}); not decoded",
                node,
            )
        first = decode_collector_message(raw)
        if isinstance(first, Malformed):
            return self._refusals.refuse(
                "malformed",
                grpc.StatusCode.INVALID_ARGUMENT,
                f"node {node!r}: first message ({first.size} bytes) is not a gpufleet.v1.CollectorMessage: "
                f"{first.error}",
                node,
            )
        body = first.message.WhichOneof("body")
        if body != "hello":
            return self._refusals.refuse(
                "no_hello",
                grpc.StatusCode.INVALID_ARGUMENT,
                f"node {node!r}: the first message must be a hello, got {body}",
                node,
            )
        return first

    def end_invalid_streams(self) -> int:
        """End every stream whose credential has expired or been revoked since it opened (called
        when the revocation list changes); how many were ended."""
        ended = 0
        for node, session in list(self._streams.items()):
            why = self._auth.still_valid(session.identity)
            if why and not session.closed:
                session.out.put_nowait(
                    self._refusals.refuse("unauthenticated", grpc.StatusCode.UNAUTHENTICATED, why, node)
                )
                ended += 1
        return ended
