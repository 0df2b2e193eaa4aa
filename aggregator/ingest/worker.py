"""An ingest worker process (docs/architecture.md "Ingest on several cores").

Started by the aggregator's main process (aggregator/ingest/worker_pool.py) with one end of a socket pair.
The first frame is the aggregator's configuration (JSON); then ToWorker batches come in and
FromWorker batches go out. For every report: decode, the complete validation
(aggregator/ingest/validation.py, the same code as in one process), conversion to points and the
group commit through the same writer, spool and store code; the outcome goes back by token.
The worker's own stats go back about once a second.

The worker ends when the socket closes (the main process stopped or died): what it has
accepted is written first; nothing is acknowledged by anyone else.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import time

import grpc

from gpufleet.aggregator.config import AggregatorConfig
from gpufleet.aggregator.ingest.spool import Spool, worker_spool_dir
from gpufleet.aggregator.ingest.validation import Checker, Rejection
from gpufleet.aggregator.ingest.wire_frames import frame, read_frame
from gpufleet.aggregator.ingest.writer import GroupCommitWriter
from gpufleet.aggregator.metrics import AggregatorMetrics
from gpufleet.aggregator.store import StoreError
from gpufleet.aggregator.store.base import PointsRefused
from gpufleet.aggregator.supervise import Supervisor
from gpufleet.common.memory import tune_gc
from gpufleet.protos import ingest_pb2, telemetry_pb2, worker_pb2

log = logging.getLogger("gpufleet.aggregator.ingest.worker")
Outcome = worker_pb2.ReportOutcome
STATS_EVERY_S = 1.0


class Worker:
    def __init__(self, config: AggregatorConfig, index: int, out: asyncio.StreamWriter) -> None:
        self.index = index
        self._out = out
        self.metrics = AggregatorMetrics()  # this process's own; summarised in WorkerStats
        self.store = config.open_store()
        workers = max(1, config.ingest_workers)
        self.spool = Spool(
            worker_spool_dir(config.data_path, index),
            max(1, config.spool_max_bytes // workers),
            config.spool_warn_ratio,
        )
        self.writer = GroupCommitWriter(self.store, self.metrics, self.spool)
        self.supervisor = Supervisor(self.metrics.registry)
        self.checker = Checker(config.max_report_bytes, config.retention_s, config.max_clock_skew_s)
        self._hellos: dict[int, ingest_pb2.Hello] = {}
        self._pending = worker_pb2.FromWorker()
        self._flush_scheduled = False

    # --- outcomes back to the main process ------------------------------------------------
    def _send(self, outcome: Outcome) -> None:
        self._pending.outcomes.append(outcome)
        self._schedule_flush()

    def _durable(self, token: int) -> None:
        # The common case, built in place (no message made and then copied in).
        outcome = self._pending.outcomes.add()
        outcome.token = token
        outcome.kind = Outcome.DURABLE
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._pending.outcomes or self._pending.HasField("stats"):
            self._out.write(frame(self._pending.SerializeToString()))
            self._pending = worker_pb2.FromWorker()

    def _stats(self) -> worker_pb2.WorkerStats:
        sample = self.metrics.registry.get_sample_value
        spool = self.spool.status()
        return worker_pb2.WorkerStats(
            pid=os.getpid(),
            not_acking=self.writer.not_acking,
            store_error=self.writer.store_error,
            oldest_waiting_s=self.writer.oldest_waiting_s(),
            refused_reports_total=self.writer.refused_reports_total,
            points_written_total=int(sample("gpufleet_store_points_written_total") or 0),
            store_write_errors_total=int(sample("gpufleet_store_write_errors_total") or 0),
            store_writes_total=int(sample("gpufleet_store_write_seconds_count") or 0),
            store_write_seconds_total=sample("gpufleet_store_write_seconds_sum") or 0.0,
            writer_errors_total=int(sample("gpufleet_writer_errors_total") or 0),
            spool_batches=spool.batches,
            spool_bytes=spool.bytes,
            spool_points=spool.points,
            spool_oldest_age_s=spool.oldest_age_s,
            spool_drained_points_total=spool.drained_points_total,
            spool_drain_points_per_s=spool.drain_points_per_s,
            spool_near_limit=spool.near_limit,
            spool_refused_batches_total=spool.refused_total,
            spool_quarantined_batches=spool.quarantined_batches,
            spool_quarantined_points=spool.quarantined_points,
            points_dropped_total=self.store.points_dropped_total,
        )

    async def stats_loop(self) -> None:
        while True:
            self._pending.stats.CopyFrom(self._stats())
            self._flush()
            await asyncio.sleep(STATS_EVERY_S)  # a reporting period, not synchronisation

    # --- requests from the main process ---------------------------------------------------
    async def handle(self, batch: worker_pb2.ToWorker) -> None:
        for request in batch.requests:
            body = request.WhichOneof("body")
            if body == "report":
                await self._report(request.report)
            elif body == "opened":
                self._hellos[request.opened.stream] = request.opened.hello
            elif body == "closed":
                self._hellos.pop(request.closed.stream, None)

    async def _report(self, item: worker_pb2.ReportToStore) -> None:
        token = item.token
        hello = self._hellos.get(item.stream)
        if hello is None:  # a bug in the main process: never stored, never acknowledged
            self._send(
                Outcome(
                    token=token,
                    kind=Outcome.UNAVAILABLE,
                    message=f"ingest worker {self.index} does not know stream {item.stream}",
                )
            )
            return
        try:
            report = telemetry_pb2.NodeReport.FromString(item.report)
            points = self.checker.check_report(report, hello, size=len(item.report))
        except Rejection as r:
            self._send(
                Outcome(
                    token=token,
                    kind=Outcome.REJECTED,
                    code=r.code.value[0],
                    reason=r.reason,
                    message=r.message,
                )
            )
            return
        except Exception as exc:  # a bug in a check: this report is not stored, the worker goes on
            log.exception("ingest worker failed on a report", extra={"node": hello.node})
            self._send(
                Outcome(
                    token=token,
                    kind=Outcome.REJECTED,
                    code=grpc.StatusCode.INTERNAL.value[0],
                    reason="internal",
                    message=f"node {hello.node!r}: the aggregator failed on a report ({exc!r})",
                )
            )
            return
        if not self.writer.has_room:
            await self.writer.wait_for_room()
        self.writer.submit(
            points,
            lambda error: (
                self._durable(token) if error is None else self._send(self._outcome(token, report.seq, error))
            ),
        )

    @staticmethod
    def _outcome(token: int, seq: int, error: StoreError | None) -> Outcome:
        if error is None:
            return Outcome(token=token, kind=Outcome.DURABLE)
        if isinstance(error, PointsRefused):
            return Outcome(
                token=token,
                kind=Outcome.REJECTED,
                code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
                reason="store_refused",
                message=f"report seq {seq} was refused by the store ({error}); the other reports "
                "of its batch were stored",
            )
        return Outcome(token=token, kind=Outcome.UNAVAILABLE, message=str(error))


async def serve(sock: socket.socket, index: int) -> None:
    reader, out = await asyncio.open_unix_connection(sock=sock)
    first = await read_frame(reader)
    if first is None:
        return
    config = AggregatorConfig(**json.loads(first))
    worker = Worker(config, index, out)
    worker.writer.start(worker.supervisor)
    stats = worker.supervisor.start("worker-stats", worker.stats_loop)
    tune_gc()  # fewer, larger garbage collections under load (common/memory.py)
    log.info("ingest worker %d started (pid %d)", index, os.getpid())
    started = time.monotonic()
    try:
        while (data := await read_frame(reader)) is not None:
            await worker.handle(worker_pb2.ToWorker.FromString(data))
    finally:
        stats.cancel()
        await worker.writer.close()  # what was accepted is written (its outcome has nowhere to go)
        await worker.supervisor.stop()
        worker.store.close()
        log.info("ingest worker %d stopping after %.0f s", index, time.monotonic() - started)


def main() -> None:
    p = argparse.ArgumentParser(description="gpufleet ingest worker (started by the aggregator)")
    p.add_argument("--socket-fd", type=int, required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--log-level", default="info")
    args = p.parse_args()
    from gpufleet.common.logsetup import configure

    configure(args.log_level, component="aggregator", worker=str(args.index))
    # The main process decides when a worker stops: by closing its socket (a signal to the
    # whole process group, Ctrl-C or systemd's stop, reaches the main process too).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    sock = socket.socket(fileno=args.socket_fd)
    asyncio.run(serve(sock, args.index))


if __name__ == "__main__":
    main()
