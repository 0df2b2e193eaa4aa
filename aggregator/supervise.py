"""One small supervision helper for the aggregator's background tasks.

A supervised task that raises is logged with its traceback, counted
(`gpufleet_task_restarts_total{task}`) and started again after a backoff (0.1 s doubling to
10 s, back to 0.1 s after a minute without a crash); it ends only when it returns or is
cancelled. A task that restarted `loop_restarts` times within `loop_window_s` is "restarting
in a loop", which the watchdog reports as unhealthy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from gpufleet.aggregator.declared_metrics import counter

log = logging.getLogger("gpufleet.aggregator.supervise")


@dataclass
class TaskRecord:
    name: str
    restarts_total: int = 0
    last_error: str = ""
    restarts: deque[float] = field(default_factory=lambda: deque(maxlen=32))  # monotonic times


class Supervisor:
    def __init__(
        self, registry: CollectorRegistry, loop_restarts: int = 3, loop_window_s: float = 60.0
    ) -> None:
        self._restarts = counter(registry, "gpufleet_task_restarts")
        self.loop_restarts = loop_restarts
        self.loop_window_s = loop_window_s
        self.records: dict[str, TaskRecord] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, name: str, body: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
        """Run body() under supervision as task `name`; the task is returned."""
        task = asyncio.create_task(self.supervised(name, body), name=name)
        self._tasks.append(task)
        return task

    def supervised(self, name: str, body: Callable[[], Awaitable[None]]) -> Coroutine[Any, Any, None]:
        """body() under supervision, as a coroutine for the caller to run on a loop of its own
        (the repair term's thread, aggregator/repair_wiring.py): counted and reported here, its
        task owned, cancelled and awaited by the caller."""
        record = self.records.setdefault(name, TaskRecord(name))
        self._restarts.labels(task=name)  # the series exists (at 0) before any crash
        return self._run(record, body)

    async def _run(self, record: TaskRecord, body: Callable[[], Awaitable[None]]) -> None:
        delay_s = 0.1
        while True:
            started = time.monotonic()
            try:
                await body()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if time.monotonic() - started > 60:
                    delay_s = 0.1
                record.restarts_total += 1
                record.last_error = f"{type(exc).__name__}: {exc}"
                record.restarts.append(time.monotonic())
                self._restarts.labels(task=record.name).inc()
                log.exception(
                    "background task %s crashed (%s); restart %d in %.1f s",
                    record.name,
                    record.last_error,
                    record.restarts_total,
                    delay_s,
                    extra={"task": record.name},
                )
            await asyncio.sleep(delay_s)  # a restart backoff, not a synchronisation
            delay_s = min(10.0, delay_s * 2)

    def looping(self) -> list[str]:
        """Why each task restarting in a loop is unhealthy, one line each."""
        now = time.monotonic()
        out = []
        for r in list(self.records.values()):  # the term's thread may add one meanwhile
            recent = sum(1 for t in list(r.restarts) if now - t <= self.loop_window_s)
            if recent >= self.loop_restarts:
                out.append(
                    f"background task {r.name} restarted {recent} times in the last "
                    f"{self.loop_window_s:g} s (last error: {r.last_error})"
                )
        return out

    async def stop(self) -> None:
        """Cancel every supervised task still running and wait for them."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
