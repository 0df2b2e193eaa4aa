"""What people do, and the automation's answer: a person's cordon, uncordon and breaker reset
through gpufleet (audited under their name), and what a person did in the scheduler outside it
(a person's cordon always wins; the automation hands the node over and keeps its hands off)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from gpufleet.repair.backends.base import Backend, BackendError, Observed
from gpufleet.repair.health import BY_AUTOMATION, Health, HoldKind
from gpufleet.repair.incidents import IncidentDesk
from gpufleet.repair.model import Finding
from gpufleet.repair.observe import SchedulerWatch
from gpufleet.repair.outcome import OK, cancelled, failed, taken_over
from gpufleet.repair.rails import Breaker
from gpufleet.repair.state import Workflow
from gpufleet.repair.workflow_moves import WorkflowMoves

log = logging.getLogger("gpufleet.repair")


class PersonActions:
    """What people do through gpufleet (cordon, uncordon, proceed, reset the breaker: each
    audited under their name, under the controller's lock so no pass runs meanwhile) and the
    automation's answer to what they did in the scheduler outside it (`person_acted`)."""

    def __init__(
        self,
        backend: Backend,
        desk: IncidentDesk,
        scheduler: SchedulerWatch,
        breaker: Breaker,
        moves: WorkflowMoves,
        findings: dict[str, list[Finding]],
        lock: asyncio.Lock,
        clock: Callable[[], int],
        poke: Callable[[str | None], None],
    ) -> None:
        self.backend = backend
        self.desk = desk
        self.scheduler = scheduler
        self.breaker = breaker
        self.moves = moves
        self.findings = findings  # each node's findings at the last pass (the controller's)
        self._lock = lock  # the controller's: a pass and a person's action never interleave
        self.clock = clock
        self.poke = poke

    def person_acted(self, wf: Workflow, seen: Observed, findings: list[Finding], now: int) -> bool:
        """React to what people did in the scheduler; True when nothing else is to be done."""
        if wf.state in BY_AUTOMATION and wf.cordoned_by_us:
            if not seen.cordoned:
                self.desk.observed(
                    wf, "uncordon", "a person returned the node to service outside gpufleet", now
                )
                self.moves.cancel(wf, findings, cancelled("a person uncordoned the node"), now)
                return True
            if not seen.ours:
                self.moves.handed_over(wf, seen.reason, now, f"a person re-cordoned it: {seen.reason}")
                return True
            return False
        if wf.state == Health.HUMAN_CORDONED:
            if not seen.cordoned:
                self.desk.observed(wf, "uncordon", "a person returned the node to service", now)
                self.moves.cancel(wf, findings, None, now)
                return True
            wf.detail = seen.reason
            return True
        if seen.cordoned and not seen.ours:
            self.moves.handed_over(wf, seen.reason, now, f"cordoned by a person: {seen.reason}")
            return True
        if seen.cordoned and seen.ours and not wf.cordoned_by_us:
            # Ours, but this aggregator has no record of it: an earlier process cordoned it
            # and died before saving that. Adopt it rather than leave it out of service.
            self._adopt(wf, seen, findings, now)
            return True
        return False

    def _adopt(self, wf: Workflow, seen: Observed, findings: list[Finding], now: int) -> None:
        if not wf.incident_id:
            self.desk.take_back(wf)  # the incident it was cordoned for, when still open
        self.desk.observed(
            wf, "cordon", f"a cordon of ours this process has no record of: {seen.reason}", now
        )
        wf.cordoned_by_us = True
        cordon = [f for f in findings if f.cordon]
        if cordon:  # still failing: carry on with the repair it was cordoned for
            self.desk.note(wf, cordon)
            wf.may_wait = all(f.may_wait for f in cordon)
            worst = max(cordon, key=lambda f: f.severity_rank)
            wf.ladder, wf.step, wf.step_key = list(worst.ladder), 0, ""
            wf.gpus = sorted({f.gpu for f in cordon if f.gpu is not None})
            self.moves.move(wf, Health.CORDONED, seen.reason)
        else:  # nothing wrong any more: validate it back into service
            wf.ladder, wf.step = [], 0
            self.moves.validating(wf, "adopted after a restart", now)

    async def _in_scheduler(
        self, wf: Workflow, verb: str, change: Awaitable[None], reason: str, actor: str, now: int
    ) -> None:
        """A person's cordon or uncordon in the scheduler, audited under their name whether it
        was done or failed (a failure is refused to them); the node's view is read again."""
        try:
            await change
        except BackendError as exc:
            self.desk.audit(wf, verb, reason, failed(str(exc)), now, actor=actor)
            raise RepairRefused("failed", f"{verb} {wf.node} failed: {exc}") from exc
        finally:
            self.scheduler.forget(wf.node)
        self.desk.audit(wf, verb, reason, OK, now, actor=actor)

    async def cordon(self, node: str, reason: str, actor: str) -> Workflow:
        async with self._lock:
            wf = self._known(node)
            now = self.clock()
            text = f"gpufleet-manual [{actor}]: {reason}"
            await self._in_scheduler(
                wf, "cordon", self.backend.cordon(node, text, automation=False), reason, actor, now
            )
            if wf.state in BY_AUTOMATION or wf.incident_id:
                self.desk.close(wf, taken_over(reason, by=actor), now, handed_to_person=True)
            wf.cordoned_by_us = False
            wf.held = None
            self.moves.move(wf, Health.HUMAN_CORDONED, text)
            self.moves.save(wf)
            return wf

    async def uncordon(self, node: str, reason: str, actor: str) -> Workflow:
        async with self._lock:
            wf = self._known(node)
            now = self.clock()
            await self._in_scheduler(
                wf, "uncordon", self.backend.uncordon(node, automation=False), reason, actor, now
            )
            self.moves.cancel(wf, self.findings.get(node, []), cancelled(reason, by=actor), now)
            self.moves.save(wf)
            return wf

    async def proceed(self, node: str, reason: str, actor: str) -> Workflow:
        """A person says a drain waiting for serving capacity goes on regardless (audited; the
        pools it takes below their floor are alerted as at risk)."""
        async with self._lock:
            wf = self._known(node)
            if wf.held is None or wf.held.kind is not HoldKind.CAPACITY:
                raise RepairRefused(
                    "invalid",
                    f"{node} is not waiting for capacity (state {wf.state}"
                    + (f": {wf.detail}" if wf.detail else "")
                    + "); `gpufleet breaker status` lists what each node waits for",
                )
            wf.capacity_override = actor
            self.desk.audit(wf, "proceed", reason, OK, self.clock(), actor=actor)
            self.moves.save(wf)
        self.poke(node)
        return wf

    async def reset_breaker(self, reason: str, actor: str) -> None:
        async with self._lock:
            now = self.clock()
            was = self.breaker.reset(now)
            self.desk.breaker_reset(actor, reason, was, now)
        self.poke(None)

    def _known(self, node: str) -> Workflow:
        wf = self.moves.known(node)
        if wf is None:
            raise RepairRefused(
                "not_found", f"node {node!r} is not known to this aggregator; `gpufleet nodes` lists them"
            )
        return wf


class RepairRefused(Exception):
    """A manual action that cannot be done; kind is not_found, invalid or failed."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
