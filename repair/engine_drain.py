"""Graceful drain of a node's inference engines: the first part of every drain
(docs/repair.md "Graceful drain").

A serving node's drain evicts nothing until its engines have left rotation and finished what
they hold: the backend takes them out of rotation (Kubernetes: the pods' gpufleet.io/in-rotation
label; Slurm and hooks: repair_drain_engine_command), then each pass reads the engines as the
collector last reported them, and the drain goes on once every one reports 0 running and 0
waiting in a report received after they left rotation (or cannot be read: nothing in flight
to wait for), or when the policy's engine_drain_timeout_s has passed. Each of these is an
audit row of action drain_engines: started, then ok (idle after N s) or failed (timeout, with
what was still running), or skipped (the backend cannot take engines out of rotation).

The step's progress is in the workflow (engines_leaving_ns, engines_drained), saved with it:
after a restart or a new leader the wait carries on from when it started, and the engines are
not taken out of rotation twice. A replay (repair/replay/) has no engines: the step is a no-op."""

from __future__ import annotations

from collections.abc import Callable

from gpufleet.repair.backends.base import Backend, BackendError
from gpufleet.repair.capacity import CapacityGuard
from gpufleet.repair.health import Step
from gpufleet.repair.incidents import IncidentDesk
from gpufleet.repair.outcome import OK, STARTED, Outcome, Status, failed
from gpufleet.repair.serving import ServingFloor
from gpufleet.repair.state import Workflow


class EngineDrain:
    def __init__(
        self,
        floor: ServingFloor,
        backend: Backend,
        desk: IncidentDesk,
        capacity: CapacityGuard,
        clock: Callable[[], int],
    ) -> None:
        self._floor, self._backend, self._desk, self._capacity, self._clock = (
            floor,
            backend,
            desk,
            capacity,
            clock,
        )

    async def done(self, wf: Workflow, workflows: dict[str, Workflow]) -> bool:
        """True once the drain may evict: the node's engines are idle, timed out, or there is
        nothing to wait for. Otherwise wf.detail says what it waits for."""
        if wf.engines_drained or not self._floor.graceful_drain:
            return True
        now = self._clock()
        replicas = self._capacity.replicas_on(wf.node, workflows)
        if not wf.engines_leaving_ns:
            if not replicas:
                wf.engines_drained = True  # no engine on the node: a plain drain
                return True
            ports = sorted({r.port for r in replicas})
            what = f"take {len(ports)} engine replica(s) out of rotation: ports {', '.join(map(str, ports))}"
            self._desk.audit(wf, Step.DRAIN_ENGINES, what, STARTED, now)
            try:
                detail = await self._backend.leave_rotation(wf.node, ports)
            except BackendError as exc:
                self._desk.audit(wf, Step.DRAIN_ENGINES, what, failed(str(exc)), now)
                wf.detail = f"taking engines out of rotation failed, retrying: {exc}"[:500]
                return False
            if detail is None:
                why = f"the {self._backend.name} backend cannot take engines out of rotation"
                self._desk.audit(wf, Step.DRAIN_ENGINES, what, Outcome(Status.SKIPPED, why), now)
                wf.engines_drained = True
                return True
            wf.engines_leaving_ns = now
            wf.detail = f"engines leaving rotation: {detail}"[:500]
            return False
        fresh = [r for r in replicas if r.heard_ns > wf.engines_leaving_ns]
        busy = [r for r in replicas if r.busy or r.heard_ns <= wf.engines_leaving_ns]
        waited_s = (now - wf.engines_leaving_ns) / 1e9
        if not busy:
            self._desk.audit(wf, Step.DRAIN_ENGINES, f"engines idle after {waited_s:.0f} s", OK, now)
            wf.engines_drained = True
            return True
        running = sum(r.requests_running or 0 for r in fresh)
        waiting = sum(r.requests_waiting or 0 for r in fresh)
        if waited_s >= self._floor.engine_drain_timeout_s:
            still = f"{running:.0f} running, {waiting:.0f} waiting on {len(busy)} replica(s)"
            self._desk.audit(
                wf,
                Step.DRAIN_ENGINES,
                f"after {waited_s:.0f} s: {still}",
                failed(f"timeout after {self._floor.engine_drain_timeout_s:g} s; evicting"),
                now,
            )
            wf.engines_drained = True
            return True
        left = self._floor.engine_drain_timeout_s - waited_s
        wf.detail = (
            f"waiting for {len(busy)} engine replica(s) to finish: {running:.0f} running, "
            f"{waiting:.0f} waiting ({left:.0f} s left before eviction)"
        )
        return False
