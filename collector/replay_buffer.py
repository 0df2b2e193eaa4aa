"""Reports the aggregator has not yet acknowledged, kept for replay after a reconnect.

Bounded: when full, the oldest report is dropped and counted (the count travels in every
later report's CollectorStats, so the loss is visible at the aggregator).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict

from gpufleet.protos import telemetry_pb2

log = logging.getLogger("gpufleet.collector.buffer")


class ReplayBuffer:
    def __init__(self, max_reports: int) -> None:
        if max_reports < 1:
            raise ValueError(f"replay buffer size {max_reports} must be at least 1 report")
        self.max_reports = max_reports
        self._reports: OrderedDict[int, telemetry_pb2.NodeReport] = OrderedDict()
        self.dropped_total = 0
        self.rejected_total = 0
        self.acked_total = 0
        self._changed = asyncio.Event()
        self._empty = asyncio.Event()
        self._empty.set()

    def __len__(self) -> int:
        return len(self._reports)

    def add(self, report: telemetry_pb2.NodeReport) -> None:
        self._reports[report.seq] = report
        while len(self._reports) > self.max_reports:
            seq, _ = self._reports.popitem(last=False)
            self.dropped_total += 1
            log.error(
                "replay buffer full (%d reports): dropped unacknowledged report seq %d",
                self.max_reports,
                seq,
                extra={"seq": seq, "dropped_total": self.dropped_total},
            )
        self._empty.clear()
        self._changed.set()

    def holds(self, seq: int) -> bool:
        return seq in self._reports

    def ack(self, seqs: list[int]) -> None:
        for seq in seqs:
            if self._reports.pop(seq, None) is not None:
                self.acked_total += 1
        if not self._reports:
            self._empty.set()

    def reject(self, seq: int) -> bool:
        """Forget a report the aggregator refused; True if it was still held."""
        if self._reports.pop(seq, None) is None:
            return False
        self.rejected_total += 1
        if not self._reports:
            self._empty.set()
        return True

    def after(self, seq: int) -> list[telemetry_pb2.NodeReport]:
        """Held reports with a sequence number above seq, oldest first."""
        return [r for s, r in self._reports.items() if s > seq]

    async def wait_for_new(self) -> None:
        await self._changed.wait()
        self._changed.clear()

    async def wait_empty(self) -> None:
        """Return once every held report has been acknowledged or rejected."""
        await self._empty.wait()
