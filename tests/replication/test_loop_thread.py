"""The repair term's thread (aggregator/loop_thread.py): what crosses between it and the
aggregator's event loop. Real threads and loops; the aggregator-level behaviour (acks and the
Fleet API while PostgreSQL hangs) is tests/replication/test_control_plane_hangs.py."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gpufleet.aggregator.loop_thread import LoopClosed, LoopThread, call_on


def test_a_call_sent_to_the_term_finishes_though_its_caller_gave_up() -> None:
    """A person's cordon whose client went away is not cut short on the term's thread."""
    release, done = threading.Event(), threading.Event()

    async def action() -> str:
        await asyncio.to_thread(release.wait, 30)
        done.set()
        return "cordoned"

    async def main() -> None:
        term = LoopThread("test-term")
        term.start()
        try:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(term.run(action()), 0.05)  # the caller gives up
            release.set()
            assert await asyncio.to_thread(done.wait, 30), "the action was cut short"
            assert await term.run(asyncio.sleep(0, "still serving")) == "still serving"
        finally:
            await term.stop()

    asyncio.run(main())


def test_a_call_to_a_term_that_stopped_says_so_and_a_poke_is_dropped() -> None:
    async def main() -> None:
        term = LoopThread("test-term")
        term.start()
        blocked = threading.Event()

        async def forever() -> None:
            blocked.set()
            await asyncio.Event().wait()

        pending = asyncio.ensure_future(term.run(forever()))
        assert await asyncio.to_thread(blocked.wait, 30)
        await term.stop()
        with pytest.raises(LoopClosed, match="stopped before the call ended"):
            await pending  # the call under way when the loop stopped
        with pytest.raises(LoopClosed, match="has stopped"):
            await term.run(asyncio.sleep(0))
        term.call_soon(print, "nobody listens")  # no error: the term has ended

    asyncio.run(main())


def test_the_term_reads_the_live_view_on_the_loop_that_owns_it() -> None:
    """call_on runs the function on the other loop's thread and hands back its answer or error."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        owner = threading.get_ident()

        def where(x: int) -> tuple[int, int]:
            return threading.get_ident(), x * 2

        def fails() -> None:
            raise KeyError("gpu-node-7")

        ran_on, doubled = await asyncio.to_thread(call_on, loop, where, 21)
        assert (ran_on, doubled) == (owner, 42)
        with pytest.raises(KeyError, match="gpu-node-7"):
            await asyncio.to_thread(call_on, loop, fails)

    asyncio.run(main())
