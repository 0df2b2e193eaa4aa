"""The aggregator's periodic work, each loop supervised: retention, roll-ups, the start-up
restore of the live view, and the collector token revocation list."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpufleet.aggregator.auth.tokens import Revocations
from gpufleet.aggregator.fleet import rollups
from gpufleet.aggregator.fleet.state import FleetState
from gpufleet.aggregator.store import Store, StoreError
from gpufleet.common.memory import give_back_free_memory
from gpufleet.repair.state import RepairState, StateError

if TYPE_CHECKING:
    from gpufleet.aggregator.config import AggregatorConfig
    from gpufleet.aggregator.ingest.service import IngestService

log = logging.getLogger("gpufleet.aggregator")

RETENTION_EVERY_S = 600.0
# How often the embedded store's staged points are settled (aggregator/store/embedded.py): a
# settle writes each series' page once for all its points since the last, so rarely is cheap
# (ingest does not wait for it: it appends to the staging file); a read settles first, so
# this bounds the work a read may find to do.
SETTLE_EVERY_S = 10.0
REVOCATIONS_EVERY_S = 5.0


class BackgroundLoops:
    def __init__(
        self,
        config: AggregatorConfig,
        store: Store,
        fleet: FleetState,
        revocations: Revocations,
        ingest: IngestService,
        open_control_plane: Callable[[str], RepairState],
    ) -> None:
        self._config = config
        self._store = store
        self._fleet = fleet
        self._revocations = revocations
        self._ingest = ingest
        self._open_control_plane = open_control_plane
        self.restored = self._restore()  # the live view seeded from the store (else: restore_loop)

    def _restore(self) -> bool:
        """Seed the live view from the store; False (logged) if the store is unreachable now."""
        try:
            self._fleet.restore(self._store.latest("collector"), self._store.latest("gpu"))
        except StoreError as exc:
            log.warning(
                "cannot read the last known state of the fleet from the store (%s); starting "
                "with an empty live view, nodes appear as they report; retrying in the background",
                exc,
            )
            return False
        return True

    async def rollup_loop(self, stop: asyncio.Event) -> None:
        """Recompute the roll-ups every rollup_interval_s: the whole trailing windows every
        rollups.FULL_PASS_EVERY passes, what can have changed between (rollups.pass_lookbacks)."""
        passes, last_ns = 0, None
        while not stop.is_set():
            now_ns = time.time_ns()
            back = rollups.pass_lookbacks(passes, now_ns, last_ns)
            try:
                written = await asyncio.to_thread(rollups.run_once, self._store, now_ns, back)
                await asyncio.to_thread(give_back_free_memory)
                log.debug("roll-ups: %d points written (windows %s s)", written, back)
                passes, last_ns = passes + 1, now_ns
            except Exception as exc:  # the store is down, or refused a value: the next pass catches up
                log.warning("roll-up pass failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._config.rollup_interval_s)

    async def restore_loop(self, stop: asyncio.Event) -> None:
        """Retry the start-up restore until the store answers (the spool covers writes)."""
        delay_s = 2.0
        while not self.restored and not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay_s)  # a retry delay, stoppable
            self.restored = await asyncio.to_thread(self._restore)
            delay_s = min(60.0, delay_s * 2)

    async def retention_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.to_thread(self._store.apply_retention, time.time_ns())
            except Exception:  # keep serving; the next pass tries again
                log.exception("retention pass failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), RETENTION_EVERY_S)

    async def settle_loop(self, stop: asyncio.Event) -> None:
        """Settle the store's staged points every SETTLE_EVERY_S (reads settle on their own)."""
        failures = 0
        while not stop.is_set():
            try:
                await asyncio.to_thread(self._store.settle)
                failures = 0
            except StoreError as exc:  # the disk is full or the store down: kept staged, retried
                failures += 1
                if failures == 1 or failures % 60 == 0:
                    log.warning(
                        "cannot settle the store's staged points (%s; %d times): retrying", exc, failures
                    )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SETTLE_EVERY_S)

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
                    revoked = await asyncio.to_thread(state.kept.revoked_collector_tokens)
                    if revoked != self._revocations.ids:
                        self._revocations.update(revoked)
                        ended = self._ingest.end_invalid_streams()
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
