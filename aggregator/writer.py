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
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from gpufleet.aggregator.metrics import AggregatorMetrics
from gpufleet.aggregator.spool import Spool
from gpufleet.aggregator.store import Point, Store, StoreError

log = logging.getLogger("gpufleet.aggregator.writer")

Done = Callable[[StoreError | None], None]


class GroupCommitWriter:
    def __init__(
        self,
        store: Store,
        metrics: AggregatorMetrics,
        spool: Spool | None = None,
        max_batch_points: int = 50_000,
        max_pending_points: int = 200_000,
    ) -> None:
        self._store = store
        self._spool = spool
        self._drain_wake = asyncio.Event()
        self._drainer: asyncio.Task[None] | None = None
        self.store_error: str = ""  # the last store failure, while the spool is not empty
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
        self._spool_executor = ThreadPoolExecutor(1, thread_name_prefix="spool")
        self._drain_stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="group-commit-writer")
        if self._spool is not None:
            self._drainer = asyncio.create_task(self._drain(), name="spool-drainer")
            if len(self._spool):
                self._drain_wake.set()

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
            error = await self._write_or_spool(loop, points)
            for _, done in batch:
                done(error)

    async def _write_or_spool(
        self, loop: asyncio.AbstractEventLoop, points: list[Point]
    ) -> StoreError | None:
        """Make points durable in the store or, failing that, in the spool. None on success."""
        if self._spool is not None and len(self._spool):
            return await self._to_spool(loop, points)  # behind what is spooled, in order
        t0 = time.perf_counter()
        try:
            await loop.run_in_executor(self._executor, self._store.write, points)
        except StoreError as exc:
            self._metrics.store_write_errors.inc()
            self.store_error = str(exc)
            if self._spool is None:
                log.error("store write of %d points failed: %s", len(points), exc)
                return exc
            log.warning("store write of %d points failed (%s); spooling to disk", len(points), exc)
            return await self._to_spool(loop, points)
        self._metrics.store_write_seconds.observe(time.perf_counter() - t0)
        self._metrics.store_points_written.inc(len(points))
        return None

    async def _to_spool(self, loop: asyncio.AbstractEventLoop, points: list[Point]) -> StoreError | None:
        assert self._spool is not None
        try:
            await loop.run_in_executor(self._spool_executor, self._spool.append, points)
        except StoreError as exc:  # SpoolFull: not acknowledged; collectors keep the reports
            log.error("%s", exc)
            return exc
        # Woken after the append, never before: a drainer that looked too early would find the
        # spool empty and go back to sleep with the batch in it.
        self._drain_wake.set()
        return None

    async def _drain(self) -> None:
        """Write spooled batches to the store, oldest first, as soon as it takes them."""
        assert self._spool is not None
        loop = asyncio.get_running_loop()
        backoff_s = 0.5
        while True:
            if not len(self._spool):
                self.store_error = ""
                self._drain_wake.clear()
                await self._drain_wake.wait()
                continue
            oldest = await loop.run_in_executor(self._spool_executor, self._spool.oldest)
            if oldest is None:
                continue
            n, points = oldest
            try:
                await loop.run_in_executor(self._executor, self._store.write, points)
            except StoreError as exc:
                self.store_error = str(exc)
                wait_s = getattr(exc, "retry_after_s", None) or backoff_s
                log.warning(
                    "store still refuses spooled batches (%s); %d batch(es) spooled; retrying in %.1f s",
                    exc,
                    len(self._spool),
                    wait_s,
                )
                backoff_s = min(30.0, backoff_s * 2)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._drain_stop.wait(), wait_s)  # a retry delay, stoppable
                if self._drain_stop.is_set():
                    return
                continue
            backoff_s = 0.5
            self._metrics.store_points_written.inc(len(points))
            await loop.run_in_executor(self._spool_executor, self._spool.remove, n)
            if not len(self._spool):
                log.info("spool drained: the store has everything again")

    async def close(self) -> None:
        """Write everything already submitted, then stop (what is spooled stays spooled)."""
        self._stopping = True
        self._wake.set()
        if self._task and not self._task.done():
            await self._task
        if self._drainer is not None:
            self._drain_stop.set()
            self._drain_wake.set()
            self._drainer.cancel()
            await asyncio.gather(self._drainer, return_exceptions=True)
        self._executor.shutdown(wait=True)
        self._spool_executor.shutdown(wait=True)
