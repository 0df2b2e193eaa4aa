"""The aggregator's periodic work, each loop supervised: retention, roll-ups, the start-up
restore of the live view, and the collector token revocation list."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from gpufleet.aggregator.fleet import rollups
from gpufleet.aggregator.store import StoreError
from gpufleet.repair.state import RepairState, StateError

log = logging.getLogger("gpufleet.aggregator")

RETENTION_EVERY_S = 600.0
REVOCATIONS_EVERY_S = 5.0


class BackgroundLoops:
    def _restore(self) -> bool:
        """Seed the live view from the store; False (logged) if the store is unreachable now."""
        try:
            self.fleet.restore(self.store.latest("collector"), self.store.latest("gpu"))
        except StoreError as exc:
            log.warning(
                "cannot read the last known state of the fleet from the store (%s); starting "
                "with an empty live view, nodes appear as they report; retrying in the background",
                exc,
            )
            return False
        return True

    async def rollup_loop(self, stop: asyncio.Event) -> None:
        """Recompute the roll-ups' trailing windows every rollup_interval_s (see rollups.py)."""
        while not stop.is_set():
            try:
                written = await asyncio.to_thread(rollups.run_once, self.store)
                log.debug("roll-ups: %d points written", written)
            except Exception as exc:  # the store is down, or refused a value: the next pass catches up
                log.warning("roll-up pass failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.config.rollup_interval_s)

    async def restore_loop(self, stop: asyncio.Event) -> None:
        """Retry the start-up restore until the store answers (the spool covers writes)."""
        delay_s = 2.0
        while not self._restored and not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay_s)  # a retry delay, stoppable
            self._restored = await asyncio.to_thread(self._restore)
            delay_s = min(60.0, delay_s * 2)

    async def retention_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.to_thread(self.store.apply_retention, time.time_ns())
            except Exception:  # keep serving; the next pass tries again
                log.exception("retention pass failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), RETENTION_EVERY_S)

    async def revocation_loop(self, stop: asyncio.Event) -> None:
        """Keep the collector token revocation list as the control plane has it (every
        REVOCATIONS_EVERY_S, on a connection of its own); a token revoked meanwhile ends its
        stream at once. While the control plane cannot be read, the last list stands."""
        state: RepairState | None = None
        try:
            while not stop.is_set():
                try:
                    if state is None:
                        state = await asyncio.to_thread(self._open_control_plane, "revocations")
                    revoked = await asyncio.to_thread(state.revoked_collector_tokens)
                    if revoked != self.revocations.ids:
                        self.revocations.update(revoked)
                        ended = self.ingest.end_invalid_streams()
                        log.info(
                            "collector token revocation list: %d token(s); %d open stream(s) ended",
                            len(revoked),
                            ended,
                        )
                except StateError as exc:
                    log.warning("cannot read the collector token revocation list: %s", exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), REVOCATIONS_EVERY_S)
        finally:
            if state is not None:
                state.close()
