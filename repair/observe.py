"""The scheduler's view, read within a polling budget: the whole fleet (one `scontrol show
node`, one LIST) at most every observe_interval_s, the nodes with a workflow under way on
every pass (one small read). A failed read leaves those nodes unknown: nothing is decided
from an old view of them."""

from __future__ import annotations

import logging
import time

from gpufleet.repair.backends.base import Backend, BackendError, Observed
from gpufleet.repair.rails import SchedulerView

log = logging.getLogger("gpufleet.repair")


class SchedulerWatch:
    def __init__(self, backend: Backend, observe_interval_s: float) -> None:
        self._backend = backend
        self._interval_s = observe_interval_s
        self._next_fleet_read = 0.0  # monotonic time of the next whole-fleet read
        self._seen: dict[str, Observed] = {}  # as last read
        self._last = SchedulerView()  # whether the last read worked
        self.reads = 0

    async def read(self, nodes: list[str], whole: bool, watched: list[str]) -> tuple[SchedulerView, set[str]]:
        """Read for this pass: every node when a whole-fleet read is due (and `whole`), else
        the watched ones. Returns whether the read worked and which nodes it covered."""
        if not self._backend.observes or not nodes:
            return SchedulerView(), set()
        fleet_read = whole and time.monotonic() >= self._next_fleet_read
        ask = nodes if fleet_read else watched
        if not ask:
            return self._last, set()  # nothing read this pass: as readable as the last read
        try:
            seen = await self._backend.observe(ask, whole_fleet=fleet_read)
        except BackendError as exc:
            log.warning("cannot read the scheduler's view this pass: %s", exc)
            for node in ask:
                self._seen.pop(node, None)
            self._last = SchedulerView(readable=False, error=str(exc))
            return self._last, set()
        finally:
            self.reads += 1
        self._last = SchedulerView()
        if fleet_read:
            self._next_fleet_read = time.monotonic() + self._interval_s
        for node in ask:
            if node in seen:
                self._seen[node] = seen[node]
            else:
                self._seen.pop(node, None)
        return self._last, set(ask)

    def get(self, node: str) -> Observed | None:
        return self._seen.get(node)

    def forget(self, node: str) -> None:
        """The node was just changed (or may have been): read it again before deciding."""
        self._seen.pop(node, None)

    def cordoned(self) -> frozenset[str]:
        """Nodes the last reads showed cordoned, by anyone."""
        return frozenset(n for n, o in self._seen.items() if o.cordoned)
