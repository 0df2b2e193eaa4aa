"""The safety rails: one gate every automatic action passes (docs/architecture.md "Repair").

`Gate.check(step, ...)` answers None (go) or the Hold that stops the step, in this order:

1. the circuit breaker is tripped: nothing automatic happens to any node, in any state, until a
   person runs `gpufleet breaker reset` (returning a repaired node included);
2. dry-run: the step is recorded as what would have been done, and not done;
3. a step that changes the scheduler (cordon, drain, uncordon) needs this pass's view of the
   scheduler: when it could not be read, the step waits and says why;
4. a cordon within the cap on nodes out of service (absolute and a fraction of the fleet); for
   an urgent finding, nodes whose drain waits for serving capacity do not count;
5. one drain at a time;
6. a drain that would take a serving pool below its floor waits, when every finding behind it
   may wait (repair/capacity.py); an urgent one goes on with a "capacity at risk" alert.

Ownership (a person's cordon always wins) is checked twice: by the reconciler from the
scheduler's view, and by the backend right before it acts (repair/backends/base.py)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass

from gpufleet.repair.capacity import CapacityGuard, waiting_nodes
from gpufleet.repair.health import OUT_OF_SERVICE, SCHEDULER_STEPS, Health, HoldKind, Step
from gpufleet.repair.kept_values import KeptValues
from gpufleet.repair.outcome import Outcome, Status
from gpufleet.repair.state import Workflow


@dataclass
class Rails:
    dry_run: bool = False
    max_out_of_service: int = 10
    max_out_of_service_fraction: float = 0.1
    breaker_nodes: int = 5
    breaker_window_s: float = 600.0


@dataclass(frozen=True)
class Hold:
    kind: HoldKind
    reason: str

    @property
    def outcome(self) -> Outcome:
        """The audit row's outcome for a held step."""
        return Outcome(Status.DRY_RUN) if self.kind is HoldKind.DRY_RUN else Outcome(Status.HELD, self.reason)


class Breaker:
    """Trips when breaker_nodes distinct nodes fail within breaker_window_s; kept in the repair
    state, so a restart comes back tripped."""

    def __init__(self, state: KeptValues, rails: Rails) -> None:
        self._state, self._rails = state, rails
        saved = json.loads(state.get("breaker") or "{}")
        self.tripped: bool = saved.get("tripped", False)
        self.reason: str = saved.get("reason", "")
        self.since_ns: int = saved.get("since_ns", 0)
        # Nodes already failing when a person last reset the breaker were seen by that person:
        # only failures since then count towards tripping it again.
        self._floor_ns: int = saved.get("floor_ns", 0)
        self._failures: list[tuple[int, str]] = [
            (int(t), str(n)) for t, n in json.loads(state.get("failures") or "[]")
        ]

    def record_failure(self, node: str, now: int) -> str:
        """Count a node that needs taking out; the trip reason when this trips the breaker."""
        window_ns = self._rails.breaker_window_s * 1e9
        failures = [(t, n) for t, n in self._failures if now - t <= window_ns]
        if not any(n == node for _, n in failures):
            failures.append((now, node))
        if failures != self._failures:  # a node held back pass after pass writes nothing
            self._failures = failures
            self._state.put("failures", json.dumps(failures))
        failing = {n for t, n in self._failures if t > self._floor_ns}
        if len(failing) < self._rails.breaker_nodes:
            return ""
        reason = (
            f"{len(failing)} nodes failed within {self._rails.breaker_window_s:g} s "
            f"(limit {self._rails.breaker_nodes}): {', '.join(sorted(failing))}"
        )
        self.tripped, self.reason, self.since_ns = True, reason, now
        self._save()
        return reason

    def reset(self, now: int) -> str:
        """Reset by a person; returns what it was tripped for."""
        was = self.reason
        self.tripped, self.reason, self.since_ns, self._floor_ns = False, "", 0, now
        self._save()
        return was

    def _save(self) -> None:
        self._state.put(
            "breaker",
            json.dumps(
                {
                    "tripped": self.tripped,
                    "reason": self.reason,
                    "since_ns": self.since_ns,
                    "floor_ns": self._floor_ns,
                }
            ),
        )


@dataclass(frozen=True)
class SchedulerView:
    """Whether this pass could read the scheduler, and why not."""

    readable: bool = True
    error: str = ""


class Gate:
    def __init__(
        self,
        rails: Rails,
        breaker: Breaker,
        cordoned_in_scheduler: Callable[[], frozenset[str]],
        capacity: CapacityGuard,
    ) -> None:
        """cordoned_in_scheduler: nodes the scheduler last showed cordoned (by anyone), counted
        out of service whatever our records say (a process killed between its cordon and its
        record of it); asked only when a cordon is checked against the cap. capacity: the
        serving pools' floor, asked before a drain starts."""
        self.rails = rails
        self.breaker = breaker
        self.capacity = capacity
        self._cordoned_in_scheduler = cordoned_in_scheduler
        self.fleet_size = 0

    def cap(self) -> int:
        by_fraction = math.floor(self.rails.max_out_of_service_fraction * self.fleet_size)
        return max(1, min(self.rails.max_out_of_service, by_fraction))

    def check(
        self, step: Step, wf: Workflow, workflows: dict[str, Workflow], view: SchedulerView
    ) -> Hold | None:
        """None to go ahead, else what holds the step back."""
        if self.breaker.tripped:
            return Hold(HoldKind.BREAKER, "breaker tripped (`gpufleet breaker reset`)")
        if self.rails.dry_run:
            return Hold(HoldKind.DRY_RUN, f"dry-run: would {step}")
        if step in SCHEDULER_STEPS and not view.readable:
            return Hold(HoldKind.SCHEDULER, f"the scheduler cannot be read: {view.error[:300]}")
        if step is Step.CORDON:
            out_nodes = {w.node for w in workflows.values() if w.state in OUT_OF_SERVICE}
            counted = (out_nodes | self._cordoned_in_scheduler()) - {wf.node}
            if not wf.may_wait:
                # An urgent finding always has a slot, as a person's cordon does: nodes held
                # for serving capacity do not count against the cap for it (docs/repair.md), so
                # repairs held by pools cannot keep an urgent fault in service.
                counted -= waiting_nodes(workflows)
            out = len(counted)
            cap = self.cap()
            if out >= cap:
                return Hold(HoldKind.CAP, f"{out} nodes are out of service, the cap is {cap}")
        if (
            step is Step.DRAIN
            and wf.state != Health.DRAINING
            and any(w.state == Health.DRAINING for w in workflows.values() if w.node != wf.node)
        ):
            return Hold(HoldKind.DRAIN_SLOT, "waiting for the drain slot (one drain at a time)")
        if step is Step.DRAIN and wf.state == Health.CORDONED:
            held = self.capacity.check(wf, workflows)
            if held is not None:
                return Hold(*held)
        return None
