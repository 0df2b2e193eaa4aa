"""Group commit: reports from every stream are gathered while the previous batch is being
written, then made durable in one store transaction, and each report's callback learns the
outcome. One fsync serves hundreds of reports, so acknowledging only after a durable
write stays cheap at fleet scale.

Submitting is a plain method call with a completion callback — no task, future or queue
item per report — because at thousands of reports a second the event loop's per-object
overhead, not the store, is what limits one aggregator process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from gpufleet.aggregator.metrics import AggregatorMetrics
from gpufleet.aggregator.store import Point, Store, StoreError

log = logging.getLogger("gpufleet.aggregator.writer")

Done = Callable[[StoreError | None], None]


class GroupCommitWriter:
    def __init__(
        self,
        store: Store,
        metrics: AggregatorMetrics,
        max_batch_points: int = 50_000,
        max_pending_points: int = 200_000,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._max_batch_points = max_batch_points
        self._max_pending_points = max_pending_points
        self._pending: list[tuple[list[Point], Done]] = []
        self._pending_points = 0
        self._wake = asyncio.Event()
        # Set while there is room: when the store falls behind, submitters wait on it and
        # gRPC flow control slows the collectors instead of memory growing without end.
        self._room = asyncio.Event()
        self._room.set()
        self._stopping = False
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="store-writer")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="group-commit-writer")

    @property
    def has_room(self) -> bool:
        return self._room.is_set()

    async def wait_for_room(self) -> None:
        await self._room.wait()

    def submit(self, points: list[Point], done: Done) -> None:
        """Queue points; done(None) runs once they are durable, done(error) if they are not."""
        self._pending.append((points, done))
        self._pending_points += len(points)
        if self._pending_points >= self._max_pending_points:
            self._room.clear()
        self._wake.set()

    def _take_batch(self) -> list[tuple[list[Point], Done]]:
        """The oldest pending reports, up to max_batch_points points (at least one report)."""
        n = cut = 0
        for cut, (pts, _) in enumerate(self._pending, 1):  # noqa: B007 (cut is used below)
            n += len(pts)
            if n >= self._max_batch_points:
                break
        batch, self._pending = self._pending[:cut], self._pending[cut:]
        self._pending_points -= n
        if self._pending_points < self._max_pending_points:
            self._room.set()
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending:
                if self._stopping:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = self._take_batch()
            points = [p for pts, _ in batch for p in pts]
            t0 = time.perf_counter()
            error: StoreError | None = None
            try:
                await loop.run_in_executor(self._executor, self._store.write, points)
            except StoreError as exc:
                error = exc
                self._metrics.store_write_errors.inc()
                log.error("store write of %d points failed: %s", len(points), exc)
            else:
                self._metrics.store_write_seconds.observe(time.perf_counter() - t0)
                self._metrics.store_points_written.inc(len(points))
            for _, done in batch:
                done(error)

    async def close(self) -> None:
        """Write everything already submitted, then stop."""
        self._stopping = True
        self._wake.set()
        if self._task and not self._task.done():
            await self._task
        self._executor.shutdown(wait=True)
