"""An event loop on a thread of its own, and the two ways across: a coroutine sent to it (the
caller awaits without blocking its own loop), and a function run on another loop with a
deadline (the repair term's reads of the live view, which only the main loop may touch).

The repair term runs on one of these (aggregator/repair_wiring.py, docs/architecture.md "When
the control plane hangs"): every call it makes to the control plane waits on its thread, never
on the event loop that acks reports and answers the Fleet API. asyncio has no such helper
(asyncio.run blocks its caller; run_coroutine_threadsafe needs a loop already running)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger("gpufleet.aggregator.loop_thread")
T = TypeVar("T")

MAIN_LOOP_WAIT_S = 10.0  # how long a call from the thread waits for the main loop to run it


class LoopClosed(RuntimeError):
    """The loop a call was sent to has stopped (its term ended)."""


class LoopThread:
    def __init__(self, name: str) -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._closed = False

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            # What is still running when the loop stops is cancelled and waited for, then the
            # loop's own executor (its to_thread calls) is shut down: nothing outlives the thread.
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run coro on this thread's loop; LoopClosed once the loop stopped."""
        try:
            return asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError as exc:  # the loop is closed
            coro.close()
            raise LoopClosed(f"{self.name} has stopped") from exc

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await coro, run on this thread's loop, from another loop (which goes on meanwhile).
        A caller that is cancelled (its client went away) does not cut the call short there."""
        inner = asyncio.wrap_future(self.submit(coro))
        try:
            return await asyncio.shield(inner)
        except asyncio.CancelledError:
            if inner.cancelled():  # the loop stopped under it, not the caller
                raise LoopClosed(f"{self.name} stopped before the call ended") from None
            raise

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """fn(*args) on this thread's loop, soon; nothing once the loop stopped."""
        with contextlib.suppress(RuntimeError):  # closed: the term has ended, nobody listens
            self.loop.call_soon_threadsafe(fn, *args)

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the loop (what runs on it is cancelled) and wait for the thread to end."""
        if self._closed:
            return
        self._closed = True
        self.call_soon(self.loop.stop)
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join, timeout_s)
        if self._thread.is_alive():
            log.error("%s did not stop within %g s; left running as a daemon thread", self.name, timeout_s)


def call_on(loop: asyncio.AbstractEventLoop, fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) run on loop (another thread's), its answer returned to this thread; a
    TimeoutError after MAIN_LOOP_WAIT_S, a LoopClosed if that loop has stopped."""
    answer: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        try:
            answer.set_result(fn(*args))
        except BaseException as exc:  # handed to the caller on the other thread
            answer.set_exception(exc)

    try:
        loop.call_soon_threadsafe(run)
    except RuntimeError as exc:
        raise LoopClosed("the aggregator's event loop has stopped") from exc
    try:
        return answer.result(timeout=MAIN_LOOP_WAIT_S)
    except concurrent.futures.TimeoutError as exc:
        raise TimeoutError(
            f"the aggregator's event loop did not run {getattr(fn, '__name__', fn)} within "
            f"{MAIN_LOOP_WAIT_S:g} s"
        ) from exc
