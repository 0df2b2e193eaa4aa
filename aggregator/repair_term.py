"""One term of the repair controller, on a thread and event loop of its own (docs/architecture.md
"When the control plane hangs").

The controller, its alert dispatcher and its history export make every one of their
control-plane calls (workflows, ledger, audit, incidents, alert outbox) synchronously, where
their decisions are made. Here they make them on the term's thread: a PostgreSQL that hangs
holds that thread for its call timeouts, never the aggregator's event loop, which goes on
acking reports and answering the Fleet API. What the term reads of the live view (snapshots,
liveness) and the commands it sends down a stream are run on the event loop that owns them
(aggregator/loop_thread.py `call_on`); what the event loop tells the term (a poke, a command's
result, a person's cordon) is sent to the term's loop.

A term starts by loading its state (workflows, ledger, breaker, alert outbox); a load that
fails (the store down or hung) is logged and tried again with a backoff until it succeeds or
the term is ended. Its tasks are supervised (aggregator/supervise.py) on its own loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from gpufleet.aggregator.fleet.export import EventExporter
from gpufleet.aggregator.loop_thread import LoopThread
from gpufleet.aggregator.supervise import Supervisor
from gpufleet.aggregator.workloads.digest import WasteDigest
from gpufleet.repair.alerts.dispatcher import AlertDispatcher
from gpufleet.repair.controller import RepairController
from gpufleet.repair.state import RepairState, StateError

log = logging.getLogger("gpufleet.aggregator.repair")
T = TypeVar("T")

Spawn = Callable[[str, Callable[[], Awaitable[None]]], "asyncio.Task[None]"]
BUILD_RETRY_MAX_S = 10.0  # the longest wait between two attempts to load a term's state


@dataclass
class TermParts:
    controller: RepairController
    dispatcher: AlertDispatcher
    exporter: EventExporter | None
    interval_s: float
    digest: WasteDigest | None = None  # the waste digest through the sinks (None: not set)


class RepairTerm:
    def __init__(
        self, name: str, state: RepairState, build: Callable[[Spawn], TermParts], supervisor: Supervisor
    ) -> None:
        """build(spawn): the term's parts, made on its thread (it reads the control plane);
        state: the store they use (the Fleet API reads incidents and audit from it)."""
        self.name = name
        self.state = state
        self._build = build
        self._supervisor = supervisor
        self.thread = LoopThread(f"repair-term-{name}")
        self._stop = asyncio.Event()  # used on the term's loop only (set through call_soon)
        self._tasks: list[asyncio.Task[None]] = []
        self.parts: TermParts | None = None
        self.built: concurrent.futures.Future[TermParts] = concurrent.futures.Future()
        self.build_failures_total = 0
        self.done: concurrent.futures.Future[None] | None = None

    @property
    def controller(self) -> RepairController | None:
        return self.parts.controller if self.parts is not None else None

    def start(self) -> None:
        self.thread.start()
        self.done = self.thread.submit(self._main())

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """fn(*args) on the term's loop (a poke, a command's result), once its parts exist."""
        if self.parts is not None:
            self.thread.call_soon(fn, *args)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await coro, run on the term's loop (a person's cordon: the controller's own lock and
        state, on its thread), from the aggregator's loop, which goes on meanwhile."""
        return await self.thread.run(coro)

    async def wait_built(self, timeout_s: float) -> RepairController | None:
        """The controller once its state is loaded; None if that takes longer than timeout_s."""
        if self.built.cancelled():  # the term ended before it loaded
            return None
        inner = asyncio.wrap_future(self.built)
        try:
            parts = await asyncio.wait_for(asyncio.shield(inner), timeout_s)
        except TimeoutError:
            return None
        except asyncio.CancelledError:
            if inner.cancelled():  # the term ended meanwhile, not the caller
                return None
            raise
        return parts.controller

    def _spawn(self, name: str, body: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
        task = asyncio.create_task(self._supervisor.supervised(name, body), name=name)
        self._tasks.append(task)
        return task

    async def _main(self) -> None:
        parts = await self._loaded()
        if parts is None:
            return
        self.parts = parts
        self.built.set_result(parts)
        work = [self._spawn("repair", lambda: parts.controller.run(self._stop, parts.interval_s))]
        exporter = parts.exporter
        if exporter is not None:
            work.append(self._spawn("history-export", lambda: exporter.run(self._stop)))
        digest = parts.digest
        if digest is not None:
            work.append(self._spawn("waste-digest", lambda: digest.run(self._stop)))
        await asyncio.wait(work)  # all end when the term is stopped (a pass is not cut short)
        await parts.dispatcher.close()

    async def _loaded(self) -> TermParts | None:
        delay_s = 0.5
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                return self._build(self._spawn)
            except Exception as exc:  # the store is down or hung: say so, try again
                self.build_failures_total += 1
                await self._cancel_tasks()  # whatever the failed attempt had started
                log.error(
                    "repair term %s could not load its state after %.1f s (%s); trying again in %g s",
                    self.name,
                    time.monotonic() - started,
                    exc,
                    delay_s,
                    exc_info=not isinstance(exc, StateError),  # a bug shows its traceback
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay_s)  # a retry delay, stoppable
            delay_s = min(BUILD_RETRY_MAX_S, delay_s * 2)
        self.built.cancel()
        return None

    async def _cancel_tasks(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def end(self, timeout_s: float = 60.0) -> None:
        """Stop the term: a pass under way finishes (a step is not cut short) within timeout_s,
        then whatever still runs on its loop is cancelled and its thread ends."""
        self.thread.call_soon(self._stop.set)
        if self.done is not None:
            inner = asyncio.wrap_future(self.done)
            try:
                await asyncio.wait_for(asyncio.shield(inner), timeout_s)
            except asyncio.CancelledError:
                if not inner.cancelled():  # the caller was cancelled, not the term
                    raise
            except TimeoutError:
                log.error(
                    "repair term %s did not end within %g s; its tasks are cancelled", self.name, timeout_s
                )
            except Exception:
                log.exception("repair term %s ended with an error", self.name)
        await self.thread.stop()
        self.built.cancel()
