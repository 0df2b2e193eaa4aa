"""A stream's reports and command results: paced to the node's budget, checked, made durable
(here or in a worker), acknowledged in order or rejected alone; answers to commands taken only
from the node and boot they were sent to."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from gpufleet.aggregator.ingest.budget import NodeBudgets
from gpufleet.aggregator.ingest.commands import CommandBook
from gpufleet.aggregator.ingest.fanout import Fanout
from gpufleet.aggregator.ingest.session import End, IngestLimits, OncePer, Session
from gpufleet.aggregator.ingest.validation import Checker, DroppedPart, Rejection
from gpufleet.aggregator.ingest.worker_pool import WorkerPool
from gpufleet.aggregator.ingest.writer import GroupCommitWriter
from gpufleet.aggregator.metrics import AggregatorMetrics
from gpufleet.aggregator.store import StoreError
from gpufleet.aggregator.store.base import PointsRefused
from gpufleet.protos import ingest_pb2, telemetry_pb2

log = logging.getLogger("gpufleet.aggregator.ingest.service")


class ReportHandling:
    """What a stream's reports and command results become: durable, then acknowledged (or
    rejected alone), and told to the fanout."""

    def __init__(
        self,
        checker: Checker,
        budgets: NodeBudgets,
        limits: IngestLimits,
        writer: GroupCommitWriter,
        pool: WorkerPool | None,
        commands: CommandBook,
        fanout: Fanout,
        metrics: AggregatorMetrics,
    ) -> None:
        self._checker = checker
        self._budgets = budgets
        self._limits = limits
        self._writer = writer
        self._pool = pool
        self._commands = commands
        self._fanout = fanout
        self._metrics = metrics
        self._throttle_logged = OncePer(60.0)
        self._dropped_logged = OncePer(60.0)

    async def pace(self, node: str, report: telemetry_pb2.NodeReport, size: int | None = None) -> None:
        """Hold the stream back while the node sends faster than its budget (node_budget.py)."""
        wait_s = self._budgets.pace(node, report.ByteSize() if size is None else size)
        if wait_s <= 0:
            return
        self._metrics.throttled.inc()
        if self._throttle_logged.due(node):
            log.warning(
                "node sends faster than its report or byte rate (node_reports_per_s %g, node_bytes_per_s "
                "%g): its stream is read more slowly (%.2f s now); logged once a minute",
                self._limits.budget.reports_per_s,
                self._limits.budget.bytes_per_s,
                wait_s,
                extra={"node": node},
            )
        await asyncio.sleep(wait_s)  # rate limiting, not synchronisation: the stream waits its turn

    def _note_dropped(self, node: str, dropped: list[DroppedPart]) -> None:
        """Parts of a report dropped or marked, the rest kept: counted by reason, logged once a
        minute a node (the first of them, and how many)."""
        for part in dropped:
            self._metrics.parts_dropped.labels(reason=part.reason).inc()
        if self._dropped_logged.due(node):
            log.warning(
                "%s (%d part(s) of this report dropped or marked, the rest stored; logged once a minute)",
                dropped[0].message,
                len(dropped),
                extra={"node": node, "reason": dropped[0].reason},
            )

    def command_result(self, session: Session, msg: ingest_pb2.CollectorMessage) -> None:
        node, result = session.hello.node, msg.command_result
        try:
            self._checker.check_message(msg, f"node {node!r}: command result")
        except Rejection as r:
            # Nothing to reject on the wire (a result has no seq): counted, logged, not acted on.
            self._metrics.reject(r.reason, r.code.name)
            log.warning("ignored command result: %s", r.message, extra={"node": node, "reason": r.reason})
            return
        why = self._commands.answer(node, result.id, session.hello.boot_id)
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
        self._fanout.command_result(node, result)

    def _reject(self, session: Session, seq: int, r: Rejection) -> None:
        self._metrics.reject(r.reason, r.code.name)
        log.warning(
            "rejected report: %s",
            r.message,
            extra={"node": session.hello.node, "seq": seq, "reason": r.reason},
        )
        if not session.closed:
            self.send_acks(session)  # in order: what was durable before this refusal first
            session.out.put_nowait(
                ingest_pb2.AggregatorMessage(
                    # seq as sent, clamped to the field: a Reject for an out-of-range seq still encodes
                    reject=ingest_pb2.Reject(seq=seq & (2**64 - 1), code=r.code.value[0], message=r.message)
                )
            )

    async def accept(
        self, session: Session, report: telemetry_pb2.NodeReport, raw: bytes | None = None
    ) -> None:
        """Check, store and acknowledge one report; raw: its bytes as they came, if known (a
        worker is handed those, not the report encoded again)."""
        if report.engines or report.events:
            dropped = self._checker.drop_inconsistent_parts(report, session.hello)
            if dropped:
                raw = None  # changed: the worker is handed the report as kept
                self._note_dropped(session.hello.node, dropped)
        if report.engines:
            why = self._budgets.admit_series(
                session.hello.node,
                "engine",
                ((e.engine, e.model, e.port, e.pool, session.hello.cluster) for e in report.engines),
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
                report.SerializeToString() if raw is None else raw,
                lambda error: self._durable(session, report, error),
            )
            return
        try:
            points = self._checker.check_report(report, session.hello, size=None if raw is None else len(raw))
        except Rejection as r:
            self._reject(session, report.seq, r)
            return
        if not self._writer.has_room:
            await self._writer.wait_for_room()
        session.inflight += 1
        self._writer.submit(points, lambda error: self._durable(session, report, error))

    def _durable(
        self, session: Session, report: telemetry_pb2.NodeReport, error: StoreError | Rejection | None
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
            self.send_acks(session)
            session.out.put_nowait(
                End(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the store could not make report seq {report.seq} durable ({error}); "
                    "reconnect and replay",
                )
            )
            return
        self._fanout.report(report, time.time_ns(), session.stream_id)
        self._metrics.reports_accepted.inc()
        self._metrics.gpu_samples.inc(len(report.gpus) or report.gpu_columns.count)
        if not session.closed:
            # Every report of this stream made durable in this turn of the event loop (a group
            # commit completes many at once) goes out in one Ack: one gRPC write, not one each.
            if not session.acks:
                asyncio.get_running_loop().call_soon(self.send_acks, session)
            session.acks.append(report.seq)

    def send_acks(self, session: Session) -> None:
        if session.acks and not session.closed:
            session.out.put_nowait(ingest_pb2.AggregatorMessage(ack=ingest_pb2.Ack(seqs=session.acks)))
        session.acks = []
