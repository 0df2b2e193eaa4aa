"""Group commit: reports from every stream are gathered while the previous batch is being
written, then made durable in one store transaction, and each report's callback learns the
outcome. One fsync serves hundreds of reports, so acknowledging only after a durable
write stays cheap at fleet scale.

Submitting is a plain method call with a completion callback — no task, future or queue
item per report — because at thousands of reports a second the event loop's per-object
overhead, not the store, is what limits one aggregator process.

The writer cannot be stopped by what it writes (docs/architecture.md, "Ingest that nothing
stops"):
- a batch the store refuses for a reason other than being unavailable is split in halves
  until the report(s) causing it are found (bisect); those are refused (`PointsRefused` to
  their callback, a Reject to the collector) and every other report is made durable;
- a store or disk that cannot take writes (down, ENOSPC, EIO) sends the batch to the spool;
  if the spool cannot take it either, the reports are not acknowledged (`StoreUnavailable`:
  the stream ends UNAVAILABLE and the collectors keep them) — logged once when it starts and
  once when it ends;
- an unexpected error in one batch completes that batch as not durable and the loop goes on;
  the loop and the spool drainer run under a Supervisor, which restarts them if anything
  still escapes.
The spool drainer retries a spooled batch the store refuses up to POISON_RETRIES times, then
bisects it: the points the store takes are written, the rest go to the spool's quarantine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from gpufleet.aggregator.ingest.spool import Spool
from gpufleet.aggregator.metrics import AggregatorMetrics
from gpufleet.aggregator.store import Point, Store, StoreError
from gpufleet.aggregator.store.base import PointsRefused, StoreUnavailable, is_unavailable
from gpufleet.aggregator.supervise import Supervisor

log = logging.getLogger("gpufleet.aggregator.ingest.writer")

Done = Callable[[StoreError | None], None]
POISON_RETRIES = 3  # a spooled batch the store refuses this many times is bisected and quarantined
T = TypeVar("T")


class _Entry:
    """One submitted report: its points, its callback, when it was submitted."""

    __slots__ = ("done", "finished", "points", "submitted")

    def __init__(self, points: list[Point], done: Done) -> None:
        self.points = points
        self.done = done
        self.submitted = time.monotonic()
        self.finished = False

    def finish(self, error: StoreError | None) -> None:
        if not self.finished:
            self.finished = True
            self.done(error)


def _points(entries: Sequence[_Entry]) -> list[Point]:
    return [p for e in entries for p in e.points]


async def isolate(
    items: Sequence[T], write: Callable[[Sequence[T]], Awaitable[None]], error: BaseException
) -> list[tuple[T, BaseException]]:
    """write(items) failed with `error`, not an unavailable store: find the items that fail on
    their own, writing every other one (halves, recursively). A store that becomes unavailable
    meanwhile raises out of here; what was written stays written (writes are idempotent)."""
    if len(items) == 1:
        return [(items[0], error)]
    mid = len(items) // 2
    bad: list[tuple[T, BaseException]] = []
    for half in (items[:mid], items[mid:]):
        try:
            await write(half)
        except Exception as exc:
            if is_unavailable(exc):
                raise
            bad += await isolate(half, write, exc)
    return bad


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
        self.store_error: str = ""  # the last store failure, while the spool is not empty
        self.not_acking: str = ""  # why reports are not being acknowledged now ("" while they are)
        self._metrics = metrics
        self._max_batch_points = max_batch_points
        self._max_pending_points = max_pending_points
        self._pending: list[_Entry] = []
        self._inflight: list[_Entry] = []
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
        self._drainer: asyncio.Task[None] | None = None
        self._poison: dict[int, int] = {}  # spool segment -> consecutive refusals
        self.refused_reports_total = 0

    def start(self, supervisor: Supervisor) -> None:
        self._task = supervisor.start("group-commit-writer", self._run)
        if self._spool is not None:
            self._drainer = supervisor.start("spool-drainer", self._drain)
            if len(self._spool):
                self._drain_wake.set()

    @property
    def has_room(self) -> bool:
        return self._room.is_set()

    async def wait_for_room(self) -> None:
        await self._room.wait()

    def backlog(self) -> tuple[int, int]:
        """(reports, bytes) handed to the writer and not yet durable (bytes: not known here, the
        reports are points by now; its bound is max_pending_points)."""
        return len(self._pending) + len(self._inflight), 0

    def oldest_waiting_s(self) -> float:
        """How long the oldest report handed to the writer has waited for its outcome."""
        oldest = min((e.submitted for e in (*self._inflight[:1], *self._pending[:1])), default=None)
        return time.monotonic() - oldest if oldest is not None else 0.0

    def submit(self, points: list[Point], done: Done) -> None:
        """Queue points; done(None) runs once they are durable, done(error) if they are not:
        PointsRefused when the store will not take this report's points, another StoreError
        when it cannot take writes now."""
        n = len(points)  # before anything is queued: a bad argument fails here, not in the writer
        self._pending.append(_Entry(points, done))
        self._pending_points += n
        if self._pending_points >= self._max_pending_points:
            self._room.clear()
        self._wake.set()

    async def write(self, points: list[Point]) -> None:
        """submit, and wait: returns once the points are durable, raises the StoreError if not
        (for the aggregator's own points, e.g. aggregator/fleet/export.py)."""
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[StoreError | None] = loop.create_future()

        def done(error: StoreError | None) -> None:
            loop.call_soon_threadsafe(lambda: outcome.done() or outcome.set_result(error))

        self.submit(points, done)
        error = await outcome
        if error is not None:
            raise error

    def _take_batch(self) -> list[_Entry]:
        """The oldest pending reports, up to max_batch_points points (at least one report)."""
        n = cut = 0
        for cut, entry in enumerate(self._pending, 1):  # noqa: B007 (cut is used below)
            n += len(entry.points)
            if n >= self._max_batch_points:
                break
        batch, self._pending = self._pending[:cut], self._pending[cut:]
        self._pending_points -= n
        if self._pending_points < self._max_pending_points:
            self._room.set()
        return batch

    async def _run(self) -> None:
        while True:
            if not self._pending:
                if self._stopping:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = self._inflight = self._take_batch()
            try:
                await self._commit(batch)
            except Exception as exc:  # a bug: this batch is not acknowledged, the writer goes on
                self._metrics.writer_errors.inc()
                log.exception("group commit of %d reports failed unexpectedly; not acknowledged", len(batch))
                for entry in batch:
                    entry.finish(StoreUnavailable(f"internal error in the aggregator's writer: {exc!r}"))
            finally:
                self._inflight = []

    async def _in(self, executor: ThreadPoolExecutor, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)

    async def _store_write(self, points: Sequence[Point]) -> None:
        t0 = time.perf_counter()
        await self._in(self._executor, self._store.write, points)
        self._metrics.store_write_seconds.observe(time.perf_counter() - t0)
        self._metrics.store_points_written.inc(len(points))

    async def _spool_write(self, points: Sequence[Point]) -> None:
        assert self._spool is not None
        await self._in(self._spool_executor, self._spool.append, points)
        # Woken after the append, never before: a drainer that looked too early would find the
        # spool empty and go back to sleep with the batch in it.
        self._drain_wake.set()

    async def _commit(self, batch: list[_Entry]) -> None:
        """Make the batch durable in the store, or in the spool; refuse the reports neither
        will take; leave the rest unacknowledged if neither can take writes now."""
        spooling = self._spool is not None and len(self._spool) > 0  # behind what is spooled, in order
        write = self._spool_write if spooling else self._store_write
        try:
            await write(_points(batch))
        except Exception as exc:
            if not is_unavailable(exc):
                await self._refuse_poison(batch, write, exc)
                return
            if spooling or self._spool is None:
                self._not_durable(batch, exc)
                return
            self._metrics.store_write_errors.inc()
            self.store_error = str(exc)
            log.warning("store write of %d reports failed (%s); spooling to disk", len(batch), exc)
            try:
                await self._spool_write(_points(batch))
            except Exception as spool_exc:
                if not is_unavailable(spool_exc):
                    await self._refuse_poison(batch, self._spool_write, spool_exc)
                    return
                self._not_durable(batch, spool_exc)
                return
        self._durable(batch)

    async def _refuse_poison(
        self, batch: list[_Entry], write: Callable[[Sequence[Point]], Awaitable[None]], error: BaseException
    ) -> None:
        """The store (or spool) refused the batch for what it holds: bisect for the culprits."""

        async def write_entries(entries: Sequence[_Entry]) -> None:
            await write(_points(entries))

        log.warning(
            "a batch of %d reports was refused (%s); finding the report(s) that cause it", len(batch), error
        )
        try:
            bad = await isolate(batch, write_entries, error)
        except Exception as exc:  # the store went away meanwhile: all not acknowledged, replayed
            self._not_durable(batch, exc)
            return
        for entry, exc in bad:
            self._metrics.store_refused_reports.inc()
            self.refused_reports_total += 1
            entry.finish(PointsRefused(f"the store refused it: {exc}"))
        self._durable([e for e in batch if not e.finished])

    def _durable(self, batch: list[_Entry]) -> None:
        if self.not_acking:
            log.warning("reports are acknowledged again: the store (or spool) takes writes")
            self.not_acking = ""
        for entry in batch:
            entry.finish(None)

    def _not_durable(self, batch: list[_Entry], exc: BaseException) -> None:
        error = exc if isinstance(exc, StoreError) else StoreUnavailable(f"{type(exc).__name__}: {exc}")
        self._metrics.store_write_errors.inc()
        if not self.not_acking:
            # One clear line when acks stop (and one when they resume), not one per batch.
            log.error(
                "not acknowledging reports: neither the store nor the spool can take writes (%s); "
                "collectors keep their reports and replay them; ingest resumes by itself when "
                "there is room again",
                error,
            )
        self.not_acking = str(error)
        for entry in batch:
            entry.finish(error)

    async def _drain(self) -> None:
        """Write spooled batches to the store, oldest first, as soon as it takes them."""
        assert self._spool is not None
        backoff_s = 0.5
        while True:
            if not len(self._spool):
                self.store_error = ""
                self._drain_wake.clear()
                await self._drain_wake.wait()
                continue
            try:
                oldest = await self._in(self._spool_executor, self._spool.oldest)
            except Exception as exc:  # a segment that cannot be read back: kept aside, not retried
                await self._in(self._spool_executor, self._spool.quarantine_unreadable, str(exc))
                continue
            if oldest is None:
                continue
            n, points = oldest
            try:
                await self._store_write(points)
            except Exception as exc:
                if not is_unavailable(exc):
                    refusals = self._poison[n] = self._poison.get(n, 0) + 1
                    if refusals >= POISON_RETRIES:
                        await self._quarantine(n, points, exc)
                        continue
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
            self._poison.pop(n, None)
            await self._in(self._spool_executor, self._spool.remove, n)
            if not len(self._spool):
                log.info("spool drained: the store has everything again")

    async def _quarantine(self, n: int, points: list[Point], error: BaseException) -> None:
        """Spooled batch n was refused POISON_RETRIES times: write what the store takes, keep
        the rest in the spool's quarantine, and let the drain go on."""
        assert self._spool is not None

        async def write_points(some: Sequence[Point]) -> None:
            await self._store_write(some)

        try:
            bad = await isolate(points, write_points, error)
        except Exception as exc:  # the store went away meanwhile: the segment stays, retried later
            log.warning("store became unavailable while isolating spooled batch %d: %s", n, exc)
            return
        if bad:
            bad_points = [p for p, _ in bad]
            await self._in(
                self._spool_executor, self._spool.quarantine, n, bad_points, str(bad[0][1]), self._poison[n]
            )
        else:  # the store took every part on its own: nothing to keep aside
            await self._in(self._spool_executor, self._spool.remove, n)
        self._poison.pop(n, None)

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
