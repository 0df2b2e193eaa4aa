"""Durable reports and command results, handed to their listeners off the ack path.

The writer's completion only acknowledges and puts the report here; the fleet view, the
health watch and the repair controller are called from this queue's own task
(docs/architecture.md, "Acks never wait on anyone else"). A listener that raises is logged
with the node and counted (`gpufleet_listener_errors_total{listener}`), and the next listener
and the next report go on. The queue is bounded: when it is full (the listeners are stuck or
far behind) a report is not given to the listeners — it is durable and acknowledged all the
same — and the drop is counted and logged; the watchdog reports listeners that lag.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpufleet.aggregator.metrics import AggregatorMetrics
from gpufleet.protos import ingest_pb2, telemetry_pb2

log = logging.getLogger("gpufleet.aggregator.ingest.fanout")

# (report, received_unix_ns, stream): stream is the ingest stream's number (fleet_state.py), 0 if none
ReportListener = Callable[[telemetry_pb2.NodeReport, int, int], None]
CommandListener = Callable[[str, ingest_pb2.CommandResult], None]  # (node, result)


@dataclass(frozen=True)
class _Report:
    report: telemetry_pb2.NodeReport
    received_ns: int
    stream: int
    queued: float  # monotonic


@dataclass(frozen=True)
class _Command:
    node: str
    result: ingest_pb2.CommandResult
    queued: float


class Fanout:
    def __init__(self, metrics: AggregatorMetrics, max_queued: int = 50_000) -> None:
        self._metrics = metrics
        self._queue: asyncio.Queue[_Report | _Command] = asyncio.Queue(max_queued)
        self.report_listeners: list[tuple[str, ReportListener]] = []
        self.command_listeners: list[tuple[str, CommandListener]] = []
        self.errors_total = 0
        self.dropped_total = 0
        self._oldest_queued: float | None = None

    def on_report(self, name: str, listener: ReportListener) -> None:
        self.report_listeners.append((name, listener))

    def on_command_result(self, name: str, listener: CommandListener) -> None:
        self.command_listeners.append((name, listener))

    def report(self, report: telemetry_pb2.NodeReport, received_ns: int, stream: int = 0) -> None:
        self._put(_Report(report, received_ns, stream, time.monotonic()), report.node)

    def command_result(self, node: str, result: ingest_pb2.CommandResult) -> None:
        self._put(_Command(node, result, time.monotonic()), node)

    def _put(self, item: _Report | _Command, node: str) -> None:
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            self.dropped_total += 1
            self._metrics.listener_dropped.inc()
            if self.dropped_total == 1 or self.dropped_total % 1000 == 0:
                log.error(
                    "listener queue full (%d items): %s from this node not given to the fleet view "
                    "and repair (it is stored and acknowledged); %d dropped so far",
                    self._queue.maxsize,
                    type(item).__name__.strip("_").lower(),
                    self.dropped_total,
                    extra={"node": node},
                )

    def lag_s(self) -> float:
        """How long the item now being handled (or next in line) has waited."""
        return time.monotonic() - self._oldest_queued if self._oldest_queued is not None else 0.0

    async def run(self) -> None:
        handled = 0
        while True:
            item = await self._queue.get()
            self._oldest_queued = item.queued
            if isinstance(item, _Report):
                for name, fn in self.report_listeners:
                    self._call(name, item.report.node, fn, item.report, item.received_ns, item.stream)
            else:
                for name, fn in self.command_listeners:
                    self._call(name, item.node, fn, item.node, item.result)
            self._oldest_queued = None
            handled += 1
            if handled % 256 == 0:
                await asyncio.sleep(0)  # a full queue never returns to the loop by itself: yield

    def _call(self, name: str, node: str, fn: Callable[..., None], *args: object) -> None:
        try:
            fn(*args)
        except Exception as exc:
            self.errors_total += 1
            self._metrics.listener_errors.labels(listener=name).inc()
            log.exception(
                "listener %s failed on a report from this node: %r", name, exc, extra={"node": node}
            )
