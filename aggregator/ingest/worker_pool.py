"""Ingest on several cores: the main process's side of its ingest worker processes
(docs/architecture.md "Ingest on several cores").

One Python process is one core for Python code: at fleet scale the decode, validation,
conversion and store writes of every report, plus gRPC and the fleet view in the same
interpreter, are more than that core can do. With `ingest_workers = N` the main process keeps
the collector streams (credentials, hellos, sequence, acks, rejects, commands, the fleet view,
repair) and hands each report's bytes to one of N worker processes (aggregator/ingest/worker.py)
chosen by its node, so a node's reports are stored in order. A worker answers each report with
its outcome: durable (ack), rejected (Reject, counted under the same reasons) or not durable
(the stream ends UNAVAILABLE; the collector replays).

A worker that dies is noticed at once (its socket closes): every report it held is answered
not durable (nothing is acknowledged that was not made durable), the crash is logged and
counted (`gpufleet_task_restarts_total{task="ingest-worker-N"}`) and the worker is started
again by the Supervisor; the streams it served are announced to the new one. Until it is back,
that worker's nodes get UNAVAILABLE and replay later.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import socket
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from gpufleet.aggregator.config import AggregatorConfig
from gpufleet.aggregator.ingest.spool import SpoolStatus
from gpufleet.aggregator.ingest.validation import Rejection
from gpufleet.aggregator.ingest.wire_frames import frame, read_frame
from gpufleet.aggregator.metrics import AggregatorMetrics
from gpufleet.aggregator.store.base import PointsRefused, StoreError, StoreUnavailable
from gpufleet.aggregator.supervise import Supervisor
from gpufleet.protos import ingest_pb2, worker_pb2

log = logging.getLogger("gpufleet.aggregator.ingest.worker_pool")

Outcome = worker_pb2.ReportOutcome
# done(None): durable; done(Rejection | PointsRefused): refused; done(StoreError): not durable.
Done = Callable[[StoreError | Rejection | None], None]
MAX_INFLIGHT_PER_WORKER = 20_000  # reports handed to one worker and not yet answered
_CODES = {c.value[0]: c for c in grpc.StatusCode}


class WorkerExited(RuntimeError):
    """An ingest worker process ended while the aggregator was running."""


@dataclass
class _Worker:
    index: int
    writer: asyncio.StreamWriter | None = None
    pid: int = 0
    inflight: dict[int, tuple[Done, float, int]] = field(
        default_factory=dict
    )  # token -> (done, submitted, bytes)
    inflight_bytes: int = 0
    out: worker_pb2.ToWorker = field(default_factory=worker_pb2.ToWorker)
    flush_scheduled: bool = False
    stats: worker_pb2.WorkerStats = field(default_factory=worker_pb2.WorkerStats)
    counted: worker_pb2.WorkerStats = field(default_factory=worker_pb2.WorkerStats)  # in our metrics


class WorkerPool:
    def __init__(self, config: AggregatorConfig, metrics: AggregatorMetrics, log_level: str = "info") -> None:
        self._config = config
        self._metrics = metrics
        self._log_level = log_level
        self._workers = [_Worker(i) for i in range(config.ingest_workers)]
        # Each worker's share of the backlog's memory ceiling (ingest_backlog_max_bytes).
        self._max_bytes_per_worker = max(1, config.ingest_backlog_max_bytes // max(1, len(self._workers)))
        self._streams: dict[int, ingest_pb2.Hello] = {}  # open collector streams, for a restarted worker
        self._token = 0
        self._room = asyncio.Event()
        self._room.set()
        self._stopping = False
        self._procs: list[asyncio.subprocess.Process | None] = [None] * len(self._workers)

    def __len__(self) -> int:
        return len(self._workers)

    def start(self, supervisor: Supervisor) -> list[asyncio.Task[None]]:
        return [supervisor.start(f"ingest-worker-{w.index}", lambda w=w: self._run(w)) for w in self._workers]

    def worker_of(self, node: str) -> int:
        """Which worker stores this node's reports (stable across restarts)."""
        return zlib.crc32(node.encode()) % len(self._workers)

    # --- what the ingest service calls ----------------------------------------------------
    def open_stream(self, stream: int, hello: ingest_pb2.Hello) -> None:
        self._streams[stream] = hello
        self._request(self._workers[self.worker_of(hello.node)], opened=(stream, hello))

    def close_stream(self, stream: int) -> None:
        hello = self._streams.pop(stream, None)
        if hello is not None:
            self._request(self._workers[self.worker_of(hello.node)], closed=stream)

    @property
    def has_room(self) -> bool:
        return self._room.is_set()

    async def wait_for_room(self) -> None:
        await self._room.wait()

    def submit(self, stream: int, node: str, report: bytes, done: Done) -> None:
        """Hand a serialized NodeReport to its node's worker; done(outcome) once it answers."""
        worker = self._workers[self.worker_of(node)]
        if worker.writer is None:
            done(StoreUnavailable(f"ingest worker {worker.index} is restarting"))
            return
        self._token += 1
        worker.inflight[self._token] = (done, time.monotonic(), len(report))
        worker.inflight_bytes += len(report)
        if not self._has_room(worker):
            self._room.clear()
        self._request(worker, report=(self._token, stream, report))

    # --- what the watchdog and status read (as from the in-process writer) -----------------
    @property
    def not_acking(self) -> str:
        return next(
            (f"ingest worker {w.index}: {w.stats.not_acking}" for w in self._workers if w.stats.not_acking),
            "",
        )

    @property
    def store_error(self) -> str:
        return next((w.stats.store_error for w in self._workers if w.stats.store_error), "")

    @property
    def refused_reports_total(self) -> int:
        return sum(w.stats.refused_reports_total for w in self._workers)

    def oldest_waiting_s(self) -> float:
        """The longest any report handed to a worker has waited for its outcome."""
        now = time.monotonic()
        oldest = [next(iter(w.inflight.values()))[1] for w in self._workers if w.inflight]
        return max((now - t for t in oldest), default=0.0)

    def spool_status(self, main: SpoolStatus) -> SpoolStatus:
        """The main process's spool and every worker's as one: sizes and counts summed, the
        oldest batch of any, near the limit if any is (each worker's limit is its share of
        spool_max_bytes: the sum is the setting)."""
        stats = [w.stats for w in self._workers]
        return dataclasses.replace(
            main,
            bytes=main.bytes + sum(s.spool_bytes for s in stats),
            batches=main.batches + sum(s.spool_batches for s in stats),
            points=main.points + sum(s.spool_points for s in stats),
            oldest_age_s=max([main.oldest_age_s, *(s.spool_oldest_age_s for s in stats)]),
            drained_points_total=main.drained_points_total + sum(s.spool_drained_points_total for s in stats),
            drain_points_per_s=main.drain_points_per_s + sum(s.spool_drain_points_per_s for s in stats),
            near_limit=main.near_limit or any(s.spool_near_limit for s in stats),
            refused_total=main.refused_total + sum(s.spool_refused_batches_total for s in stats),
            quarantined_batches=main.quarantined_batches + sum(s.spool_quarantined_batches for s in stats),
            quarantined_points=main.quarantined_points + sum(s.spool_quarantined_points for s in stats),
        )

    async def wait_started(self, timeout_s: float) -> list[int]:
        """Wait until every worker has sent its first stats (it runs, and its spool is counted),
        at most timeout_s; the indices of those that have not."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            late = [w.index for w in self._workers if not w.stats.pid]
            if not late:
                return []
            await asyncio.sleep(0.05)  # polled: a worker's first stats come within a second
        return [w.index for w in self._workers if not w.stats.pid]

    @property
    def points_dropped_total(self) -> int:
        return sum(w.stats.points_dropped_total for w in self._workers)

    def not_running(self) -> list[str]:
        """Why each worker that is not serving now is unhealthy (its nodes get UNAVAILABLE)."""
        return [
            f"ingest worker {w.index} is not running (its nodes' reports are not acknowledged)"
            for w in self._workers
            if w.writer is None
        ]

    def pids(self) -> list[int]:
        return [w.pid for w in self._workers]

    # --- the socket to each worker ----------------------------------------------------------
    def _request(
        self,
        worker: _Worker,
        report: tuple[int, int, bytes] | None = None,
        opened: tuple[int, ingest_pb2.Hello] | None = None,
        closed: int | None = None,
    ) -> None:
        if worker.writer is None:
            return  # a restarted worker is told of every open stream when it starts
        request = worker.out.requests.add()
        if report is not None:
            item = request.report
            item.token, item.stream, item.report = report
        elif opened is not None:
            request.opened.stream = opened[0]
            request.opened.hello.CopyFrom(opened[1])
        elif closed is not None:
            request.closed.stream = closed
        if not worker.flush_scheduled:
            # Everything asked of a worker in one turn of the event loop goes as one frame.
            worker.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush, worker)

    def _flush(self, worker: _Worker) -> None:
        worker.flush_scheduled = False
        if worker.writer is None or not worker.out.requests:
            return
        worker.writer.write(frame(worker.out.SerializeToString()))
        worker.out = worker_pb2.ToWorker()

    async def _run(self, worker: _Worker) -> None:
        """Start the worker process, feed it, read its answers; raise WorkerExited if it ends."""
        parent, child = socket.socketpair()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "gpufleet.aggregator.ingest.worker",
                "--socket-fd",
                str(child.fileno()),
                "--index",
                str(worker.index),
                "--log-level",
                self._log_level,
                pass_fds=(child.fileno(),),
            )
        finally:
            child.close()
        self._procs[worker.index] = proc
        reader, writer = await asyncio.open_unix_connection(sock=parent)
        # The configuration goes over the socket, not the command line: it can hold secrets.
        writer.write(frame(json.dumps(dataclasses.asdict(self._config)).encode()))
        worker.pid = proc.pid or 0
        worker.out = worker_pb2.ToWorker()
        worker.writer = writer
        for stream, hello in self._streams.items():
            if self.worker_of(hello.node) == worker.index:
                self._request(worker, opened=(stream, hello))
        log.info("ingest worker %d running (pid %d)", worker.index, worker.pid)
        error = "its socket closed"
        try:
            while (data := await read_frame(reader)) is not None:
                self._answer(worker, worker_pb2.FromWorker.FromString(data))
        except (ConnectionError, OSError) as exc:
            error = str(exc)
        finally:
            worker.writer = None
            writer.close()
            returncode = await self._reap(proc)
            self._fail_inflight(worker, f"ingest worker {worker.index} (pid {worker.pid}) ended")
        if not self._stopping:
            raise WorkerExited(
                f"ingest worker {worker.index} (pid {worker.pid}) exited {returncode}: {error}"
            )

    @staticmethod
    async def _reap(proc: asyncio.subprocess.Process) -> int | None:
        try:
            return await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            return await proc.wait()

    def _fail_inflight(self, worker: _Worker, why: str) -> None:
        held, worker.inflight = worker.inflight, {}
        if held:
            log.error(
                "%s with %d reports not yet durable: not acknowledged, the collectors replay them",
                why,
                len(held),
            )
        worker.inflight_bytes = 0
        for done, _, _ in held.values():
            done(StoreUnavailable(f"{why} before the report was durable"))
        self._update_room()

    def _has_room(self, worker: _Worker) -> bool:
        return (
            len(worker.inflight) < MAX_INFLIGHT_PER_WORKER
            and worker.inflight_bytes < self._max_bytes_per_worker
        )

    def _update_room(self) -> None:
        if all(self._has_room(w) for w in self._workers):
            self._room.set()

    def backlog(self) -> tuple[int, int]:
        """(reports, bytes) handed to the workers and not yet answered: what the ceiling bounds."""
        return sum(len(w.inflight) for w in self._workers), sum(w.inflight_bytes for w in self._workers)

    def _answer(self, worker: _Worker, batch: worker_pb2.FromWorker) -> None:
        for outcome in batch.outcomes:
            entry = worker.inflight.pop(outcome.token, None)
            if entry is None:
                continue
            done = entry[0]
            worker.inflight_bytes -= entry[2]
            if outcome.kind == Outcome.DURABLE:
                done(None)
            elif outcome.kind == Outcome.REJECTED:
                code = _CODES.get(outcome.code, grpc.StatusCode.INVALID_ARGUMENT)
                if outcome.reason == "store_refused":
                    done(PointsRefused(outcome.message))
                else:
                    done(Rejection(code, outcome.reason, outcome.message))
            else:
                done(StoreUnavailable(outcome.message or "the store could not make it durable"))
        if batch.HasField("stats"):
            self._count(worker, batch.stats)
        self._update_room()

    def _count(self, worker: _Worker, stats: worker_pb2.WorkerStats) -> None:
        """Fold a worker's cumulative stats into this process's metrics (by the increase)."""
        before = worker.counted if worker.counted.pid == stats.pid else worker_pb2.WorkerStats()
        m = self._metrics
        m.store_points_written.inc(max(0, stats.points_written_total - before.points_written_total))
        m.store_write_errors.inc(max(0, stats.store_write_errors_total - before.store_write_errors_total))
        m.store_refused_reports.inc(max(0, stats.refused_reports_total - before.refused_reports_total))
        m.writer_errors.inc(max(0, stats.writer_errors_total - before.writer_errors_total))
        writes = stats.store_writes_total - before.store_writes_total
        if writes > 0:  # the batches' mean, once per batch: the histogram's count and sum stay right
            mean_s = (stats.store_write_seconds_total - before.store_write_seconds_total) / writes
            for _ in range(min(writes, 1000)):
                m.store_write_seconds.observe(max(0.0, mean_s))
        worker.stats = stats
        worker.counted = stats

    async def close(self) -> None:
        """Stop the workers: each writes what it accepted, answers what it can, and exits."""
        self._stopping = True
        for worker in self._workers:
            if worker.writer is not None:
                self._flush(worker)
                worker.writer.write_eof()
        for proc in self._procs:
            if proc is not None and proc.returncode is None:
                await self._reap(proc)
