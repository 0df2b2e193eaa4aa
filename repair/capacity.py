"""The capacity guard: the rail that keeps a repair that may wait from taking a serving pool
below its floor (docs/repair.md "Serving-aware repair").

Asked by the gate (repair/rails.py) before a node's drain starts. It projects what the drain
would do to every pool the node serves (repair/serving.py):

- no pool would go below the floor: the drain goes on (a wait that was under way ends, and its
  alert resolves);
- a pool would, and every finding behind the incident may wait (the policy's `may_wait`): the
  drain is held, with the pools and figures in the node's detail ("waiting for capacity: ..."),
  checked again every pass, for at most the floor's max_capacity_wait_s: then the drain goes on
  with the "capacity at risk" alert (or, with hold_past_max_capacity_wait, an alert says it
  still waits and it keeps waiting);
- a pool would, and the finding is urgent (or a person said go on, `gpufleet repair proceed`):
  the drain goes on, and a "capacity at risk" alert names the pools.

What it remembers is in the workflow (may_wait, capacity_wait_since_ns, capacity_alert,
capacity_override), saved with it, so a restart or a new leader carries on the same wait. A
node's own readings cannot hold back its urgent repair: urgency is the policy's, never the
node's."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping

from gpufleet.protos.names import CAPACITY_WAIT_PREFIX
from gpufleet.repair.health import Health, HoldKind
from gpufleet.repair.incidents import IncidentDesk
from gpufleet.repair.serving import Pools, Projection, ReplicaReading, ServingFloor
from gpufleet.repair.state import Workflow

log = logging.getLogger("gpufleet.repair")


class CapacityGuard:
    def __init__(
        self,
        floor: ServingFloor,
        readings: Callable[[], list[ReplicaReading]],
        desk: IncidentDesk,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        """readings: every engine replica in the fleet now (read once a pass, when first needed)."""
        self.floor = floor
        self._readings = readings
        self._desk = desk
        self._clock = clock
        self._pools: Pools | None = None

    def new_pass(self) -> None:
        """The readings are read again at the next check (once a pass)."""
        self._pools = None

    def pools(self, workflows: dict[str, Workflow]) -> Pools:
        if self._pools is None:
            self._pools = Pools(self._readings(), LiveStates(workflows))
        return self._pools

    def projections(self, node: str, workflows: dict[str, Workflow]) -> list[Projection]:
        """What draining the node now would do to each pool it serves."""
        return self.pools(workflows).projections(node, LiveStates(workflows), self.floor)

    def replicas_on(self, node: str, workflows: dict[str, Workflow]) -> list[ReplicaReading]:
        """The node's engine replicas, as this pass read them: those in pools and those no pool
        takes alike (a graceful drain takes every engine of the node out of rotation: that acts
        on the node itself, whatever the node says it serves)."""
        pools = self.pools(workflows)
        placed = [r for p in pools.of_node(node) for r in p.replicas if r.node == node]
        return placed + [r for r in pools.unverified if r.node == node]

    def check(self, wf: Workflow, workflows: dict[str, Workflow]) -> tuple[HoldKind, str] | None:
        """Before a drain starts: None to go ahead, else the hold and its reason."""
        if not self.floor.guard:
            return None
        now = self._clock()
        short = [p for p in self.projections(wf.node, workflows) if p.below_floor]
        what = "; ".join(p.describe() for p in short)
        if not short:
            if wf.capacity_wait_since_ns:
                waited = (now - wf.capacity_wait_since_ns) / 1e9
                log.warning(
                    "capacity returned after %.0f s: the drain goes on",
                    waited,
                    extra={"node": wf.node, "incident": wf.incident_id},
                )
                self._desk.capacity(wf, "resolved", f"capacity returned after {waited:.0f} s", now)
                wf.capacity_wait_since_ns = 0
            return None
        if not wf.may_wait or wf.capacity_override:
            why = f"{wf.capacity_override} said go on" if wf.may_wait else "the finding is urgent"
            self._go_at_risk(wf, why, what, now)
            return None
        if not wf.capacity_wait_since_ns:
            wf.capacity_wait_since_ns = now
        waited_s = (now - wf.capacity_wait_since_ns) / 1e9
        if waited_s >= self.floor.max_capacity_wait_s:
            if not self.floor.hold_past_max_capacity_wait:
                # The wait is bounded (docs/repair.md): pressure a node reports, real or not,
                # delays another node's repair by at most max_capacity_wait_s.
                self._go_at_risk(wf, f"waited {waited_s:.0f} s, max_capacity_wait_s", what, now)
                return None
            if not wf.capacity_alert:
                self._desk.capacity(wf, "firing", f"waiting {waited_s:.0f} s for capacity: {what}", now)
        return HoldKind.CAPACITY, CAPACITY_WAIT_PREFIX + what

    def _go_at_risk(self, wf: Workflow, why: str, what: str, now: int) -> None:
        """The drain goes on below the floor: a "capacity at risk" alert (once) names the pools."""
        if not wf.capacity_alert:
            log.error(
                "capacity at risk: draining (%s): %s",
                why,
                what,
                extra={"node": wf.node, "incident": wf.incident_id},
            )
            self._desk.capacity(wf, "firing", f"capacity at risk ({why}): {what}", now, "critical")
        wf.capacity_wait_since_ns = 0


def waiting_nodes(workflows: Mapping[str, Workflow]) -> set[str]:
    """Nodes whose drain waits for serving capacity now."""
    return {
        n
        for n, wf in list(workflows.items())
        if wf.held is not None and wf.held.kind is HoldKind.CAPACITY and wf.state == Health.CORDONED
    }


class LiveStates(Mapping[str, Health]):
    """Each node's workflow state as it is when read: the guard runs on the thread that moves
    the workflows, so a lookup per replica (not a copy of the fleet's states per check)."""

    def __init__(self, workflows: Mapping[str, Workflow]) -> None:
        self._workflows = workflows

    def __getitem__(self, node: str) -> Health:
        return self._workflows[node].state

    def __iter__(self) -> Iterator[str]:
        return iter(self._workflows)

    def __len__(self) -> int:
        return len(self._workflows)


def node_states(workflows: Mapping[str, Workflow]) -> dict[str, Health]:
    """The nodes not healthy (the rest are HEALTHY by default): a copy, safe across threads."""
    return {n: wf.state for n, wf in list(workflows.items()) if wf.state != Health.HEALTHY}
