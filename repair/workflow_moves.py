"""The moves every part of the repair controller makes on a node's workflow: to a new state, held
back by a rail, cancelled by a person, handed over to a person, into validation; and the
workflows themselves (known, saved). WorkflowSteps (the automation's way through a repair) and
PersonActions (what people do) are each given this object, not the controller's `self`, so
what each touches is in its constructor (docs/architecture.md "Repair")."""

from __future__ import annotations

import logging
from collections.abc import Callable

from gpufleet.repair.evaluator import finding_id
from gpufleet.repair.health import Health, Step
from gpufleet.repair.incidents import IncidentDesk
from gpufleet.repair.model import Finding, NodeSnapshot
from gpufleet.repair.outcome import IncidentOutcome, cancelled, taken_over
from gpufleet.repair.policy import Policy
from gpufleet.repair.rails import Gate, SchedulerView
from gpufleet.repair.state import HeldStep, RepairState, Workflow

log = logging.getLogger("gpufleet.repair")


class WorkflowMoves:
    def __init__(
        self,
        policy: Policy,
        state: RepairState,
        desk: IncidentDesk,
        gate: Gate,
        workflows: dict[str, Workflow],
        snapshots: Callable[[set[str] | None], list[NodeSnapshot]],
    ) -> None:
        self.policy = policy
        self.state = state
        self.desk = desk
        self.gate = gate
        self.workflows = workflows  # every known node's workflow (the controller's, shared)
        self._snapshots = snapshots

    def move(self, wf: Workflow, state: Health, detail: str) -> None:
        wf.detail = detail
        if wf.state == state:
            return
        log.info("%s → %s %s", wf.state, state, detail, extra={"node": wf.node, "incident": wf.incident_id})
        wf.state = state
        self.desk.moved(wf)

    def held(self, wf: Workflow, step: Step, view: SchedulerView, now: int, what: str) -> bool:
        """Ask the rails; a held step is audited once (per step and rail) and said in detail."""
        hold = self.gate.check(step, wf, self.workflows, view)
        if hold is None:
            wf.held = None
            return False
        key = HeldStep(step, hold.kind)
        if wf.held != key:
            wf.held = key
            self.desk.audit(wf, step, what, hold.outcome, now)
        wf.detail = hold.reason
        return True

    def cancel(
        self, wf: Workflow, findings: list[Finding], outcome: IncidentOutcome | None, now: int
    ) -> None:
        """A person returned the node to service: stop, and do not re-cordon for what they saw."""
        # Findings already overridden stay so (they are not in `findings`: filtered out).
        wf.suppressed = sorted(set(wf.suppressed) | {finding_id(f) for f in findings})
        wf.cleared_before_ns = now
        wf.cordoned_by_us = False
        wf.held = None
        self.desk.close(wf, outcome or cancelled("a person returned the node to service"), now)
        self.move(wf, Health.HEALTHY, "")

    def handed_over(self, wf: Workflow, reason: str, now: int, audit_reason: str) -> None:
        """A person has the node: stop, close any incident as theirs, keep hands off."""
        self.desk.observed(wf, "cordon", audit_reason, now)
        self.desk.close(wf, taken_over(reason), now, handed_to_person=True)
        wf.cordoned_by_us = False
        wf.held = None
        self.move(wf, Health.HUMAN_CORDONED, reason)

    def start_validation(self, wf: Workflow, why: str, now: int, view: SchedulerView) -> None:
        if not self.held(wf, Step.VALIDATE, view, now, why):
            self.validating(wf, why, now)

    def validating(self, wf: Workflow, why: str, now: int) -> None:
        wf.validate_since_ns = now
        self.move(
            wf,
            Health.VALIDATING,
            f"{why}; waiting {self.policy.workflow['validate_s']:g} s for clean signals",
        )

    def snapshot(self, node: str) -> NodeSnapshot | None:
        return next(iter(self._snapshots({node})), None)

    def known(self, node: str) -> Workflow | None:
        """The node's workflow (a fresh one for a node seen but never moved); None: unknown."""
        if node not in self.workflows and not self._snapshots({node}):
            return None
        return self.workflows.get(node) or Workflow(node)

    def save(self, wf: Workflow) -> None:
        self.workflows[wf.node] = wf
        self.state.save(wf)
