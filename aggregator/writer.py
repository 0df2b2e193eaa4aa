"""Group commit: reports from every stream are gathered while the previous batch is being
written, then made durable in one store transaction, and each waiting report learns its
outcome. One fsync serves hundreds of reports, so acknowledging only after a durable
write stays cheap at fleet scale."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from gpufleet.aggregator.metrics import AggregatorMetrics
from gpufleet.aggregator.store import Point, Store, StoreError

log = logging.getLogger("gpufleet.aggregator.writer")


class GroupCommitWriter:
    def __init__(
        self,
        store: Store,
        metrics: AggregatorMetrics,
        max_batch_points: int = 50_000,
        max_pending: int = 20_000,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._max_batch_points = max_batch_points
        # Bounded: when the store falls behind, submitters wait, and gRPC flow control
        # slows the collectors instead of the aggregator's memory growing without end.
        # None is the stop sentinel, queued behind everything already submitted.
        self._queue: asyncio.Queue[tuple[list[Point], asyncio.Future[None]] | None] = asyncio.Queue(
            max_pending
        )
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="store-writer")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="group-commit-writer")

    async def write(self, points: list[Point]) -> None:
        """Return once points are durable; raise StoreError if they could not be made so."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._queue.put((points, future))
        await future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        stopping = False
        while not stopping:
            first = await self._queue.get()
            if first is None:
                return
            batch = [first]
            n_points = len(first[0])
            while n_points < self._max_batch_points and not self._queue.empty():
                item = self._queue.get_nowait()
                if item is None:
                    stopping = True
                    break
                batch.append(item)
                n_points += len(item[0])
            points = [p for pts, _ in batch for p in pts]
            t0 = time.perf_counter()
            try:
                await loop.run_in_executor(self._executor, self._store.write, points)
            except StoreError as exc:
                self._metrics.store_write_errors.inc()
                log.error("store write of %d points failed: %s", len(points), exc)
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            self._metrics.store_write_seconds.observe(time.perf_counter() - t0)
            self._metrics.store_points_written.inc(len(points))
            for _, fut in batch:
                if not fut.done():
                    fut.set_result(None)

    async def close(self) -> None:
        """Write everything already submitted, then stop."""
        if self._task and not self._task.done():
            await self._queue.put(None)
            await self._task
        self._executor.shutdown(wait=True)
