"""Incidents, the audit log and the alerts that follow them: what the repair controller tells
people. One incident per node's trouble, from its first notable finding to its close; one
alert identity per incident (firing through its states, then resolved)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gpufleet.repair.alerts.base import Alert
from gpufleet.repair.alerts.dispatcher import AlertDispatcher
from gpufleet.repair.evaluator import finding_id
from gpufleet.repair.health import Health
from gpufleet.repair.model import Finding, WorkloadOnNode
from gpufleet.repair.outcome import OK, IncidentOutcome, Outcome, Status
from gpufleet.repair.state import AuditRecord, Incident, RepairState, StateError, Workflow

log = logging.getLogger("gpufleet.repair")

AUTOMATION = "automation"


def workloads_hit(on_node: tuple[WorkloadOnNode, ...], findings: list[Finding]) -> list[dict[str, object]]:
    """The workloads on the node at the fault, each with its owner and whether the fault hit it
    (a finding on one of its GPUs, or one of the whole node)."""
    faulted = {f.gpu for f in findings}
    whole_node = None in faulted
    return [
        {
            "workload": w.key,
            "name": w.name,
            "user": w.owner.user,
            "account": w.owner.account,
            "namespace": w.owner.namespace,
            "team": w.owner.team,
            "gpus": list(w.gpus),
            "hit": whole_node or bool(faulted.intersection(w.gpus)),
        }
        for w in on_node
    ]


def workloads_text(workloads: list[dict[str, object]]) -> str:
    """One line naming them, those the fault hit first: `slurm:42 (alice, llm-train) hit`."""
    ordered = sorted(workloads, key=lambda w: not w.get("hit"))
    parts = []
    for w in ordered:
        owner = ", ".join(str(w[k]) for k in ("user", "account", "namespace", "team") if w.get(k))
        parts.append(f"{w['workload']} ({owner or 'owner unknown'}){' hit' if w.get('hit') else ''}")
    return "; ".join(parts)


class IncidentDesk:
    def __init__(
        self,
        state: RepairState,
        alerts: AlertDispatcher,
        on_action: Callable[[str, str, Outcome], None],
        clock: Callable[[], int] = time.time_ns,
        workloads_on: Callable[[str], tuple[WorkloadOnNode, ...]] = lambda node: (),
    ) -> None:
        self._workloads_on = workloads_on
        self._state = state
        self._clock = clock
        self.alerts = alerts
        self._on_action = on_action

    # --- the audit log ----------------------------------------------------------------
    def audit(
        self, wf: Workflow, action: str, reason: str, outcome: Outcome, now: int, actor: str = AUTOMATION
    ) -> None:
        self.audit_node(wf.node, wf.incident_id, action, reason, outcome, now, actor)

    def audit_node(
        self,
        node: str,
        incident_id: str,
        action: str,
        reason: str,
        outcome: Outcome,
        now: int,
        actor: str = AUTOMATION,
    ) -> None:
        """One audit row, logged and counted (gpufleet_repair_actions): a workflow's step, or an
        action of no workflow (an orphan's cleanup, repair/orphan_cleanup.py)."""
        outcome = outcome.trimmed()
        self._state.audit(AuditRecord(now, actor, node, action, reason, outcome, incident_id))
        log.warning(
            "%s %s by %s: %s (%s)",
            action,
            node,
            actor,
            reason,
            outcome,
            extra={"node": node, "incident": incident_id, "action": action},
        )
        self._on_action(node, action, outcome)

    def observed(self, wf: Workflow, action: str, reason: str, now: int) -> None:
        """Audit what a person did in the scheduler, as gpufleet saw it there."""
        self.audit(wf, action, reason, Outcome(Status.OBSERVED), now, actor="scheduler")

    # --- incidents --------------------------------------------------------------------
    def take_back(self, wf: Workflow) -> Incident | None:
        """An open incident of this node that its workflow does not hold: an earlier process
        opened it (and queued its alert), maybe cordoned for it, and died before saving the
        workflow. Taken back, so the repair goes on under it and its alert resolves, instead of
        a second incident (note, and a cordon of ours adopted after a restart). None: none."""
        held = [i for i in self._state.incidents(open_only=True, node=wf.node, limit=5) if i.node == wf.node]
        if not held:
            return None
        incident = held[0]
        wf.incident_id = incident.id
        log.warning(
            "incident %s taken back: opened by an earlier process, its workflow not saved",
            incident.id,
            extra={"node": wf.node, "incident": incident.id},
        )
        return incident

    def note(self, wf: Workflow, findings: list[Finding]) -> Incident:
        """The node's open incident with these findings in it, opened if there is none."""
        incident = self._state.incident(wf.incident_id) if wf.incident_id else None
        if incident is None or not incident.open:
            incident = self.take_back(wf)
        if incident is None:
            incident = self._state.open_incident(wf.node, findings, wf.state, self._clock())
            incident.workloads = workloads_hit(self._workloads_on(wf.node), findings)
            if incident.workloads:
                self._state.put_incident(incident)
            wf.incident_id = incident.id
            log.warning(
                "incident %s opened: %s",
                incident.id,
                "; ".join(f"{f.code}: {f.evidence}" for f in findings),
                extra={"node": wf.node, "incident": incident.id},
            )
            self.alert(incident, "firing", wf)
            return incident
        known = {finding_id(f) for f in incident.findings}
        new = [f for f in findings if finding_id(f) not in known]
        if new:
            incident.findings += new
            self._state.put_incident(incident)
        return incident

    def close(self, wf: Workflow, outcome: IncidentOutcome, now: int, handed_to_person: bool = False) -> None:
        if not wf.incident_id:
            return
        if wf.capacity_alert:
            self.capacity(wf, "resolved", f"incident closed: {outcome}", now)
        wf.may_wait, wf.capacity_wait_since_ns, wf.capacity_override = False, 0, ""
        wf.engines_leaving_ns, wf.engines_drained = 0, False
        wf.cleared_before_ns = now  # the XIDs behind this incident are dealt with
        incident = self._state.incident(wf.incident_id)
        wf.incident_id = ""
        wf.ladder, wf.step, wf.step_key, wf.gpus = [], 0, "", []
        if incident is None or not incident.open:
            return
        incident.closed_ns = now
        incident.outcome = outcome
        incident.state = Health.HUMAN_CORDONED if handed_to_person else Health.HEALTHY
        self._state.put_incident(incident)
        log.warning(
            "incident %s closed: %s", incident.id, outcome, extra={"node": wf.node, "incident": incident.id}
        )
        self.alert(incident, "resolved", wf)

    def resolve_closed(self, workflows: dict[str, Workflow]) -> list[str]:
        """After a start: resolve the alerts still out for incidents that are closed. Closing an
        incident and queueing its resolve are two writes; a process killed between them left
        the page open (a chaos run found it). Run once the dispatcher is started (a resolve is
        queued in each sink's outbox); the keys resolved."""
        resolved = []
        try:
            for key in sorted(self.alerts.outstanding()):
                incident_id, _, part = key.partition("/")
                incident = self._state.incident(incident_id)  # None: the breaker's own alert
                if incident is None or incident.open:
                    continue
                if part:  # the incident's serving-capacity alert
                    summary = f"incident closed: {incident.outcome or ''}"
                    details = {"incident": incident_id, "kind": "serving_capacity"}
                    node, state, when = incident.node, incident.state, self._clock()
                    self.alerts.notify(Alert(key, "resolved", node, state, "warning", summary, when, details))
                else:
                    self.alert(incident, "resolved", workflows.get(incident.node) or Workflow(incident.node))
                resolved.append(key)
        except StateError as exc:  # the next start looks again
            log.warning("cannot look for closed incidents with alerts still out: %s", exc)
        for key in resolved:
            log.warning("alert %s resolved at start: its incident closed before the last stop", key)
        return resolved

    def moved(self, wf: Workflow) -> None:
        """The workflow changed state: its open incident follows, and its alert says so."""
        incident = self._state.incident(wf.incident_id) if wf.incident_id else None
        if incident is not None and incident.open:
            incident.state = wf.state
            incident.attempts = wf.step
            self._state.put_incident(incident)
            self.alert(incident, "firing", wf)

    def summary(self, wf: Workflow) -> str:
        incident = self._state.incident(wf.incident_id) if wf.incident_id else None
        return "; ".join(f"{f.code}: {f.evidence}" for f in (incident.findings if incident else []))[:500]

    # --- alerts -----------------------------------------------------------------------
    def alert(self, incident: Incident, status: str, wf: Workflow) -> None:
        worst = max(incident.findings, key=lambda f: f.severity_rank, default=None)
        if status == "resolved":
            summary = str(incident.outcome or "")
        elif worst:
            where = f" on GPU {worst.gpu}" if worst.gpu is not None else ""
            summary = f"{worst.code}{where}: {worst.reason}"
            hit = [w for w in incident.workloads if w.get("hit")]
            if hit:
                summary += f"; work hit: {workloads_text(hit)}"
        else:
            summary = wf.detail
        self.alerts.notify(
            Alert(
                key=incident.id,
                status=status,
                node=incident.node,
                state=incident.state,
                severity=worst.severity if worst else "warning",
                summary=summary,
                time_ns=self._clock(),
                details={
                    "findings": [f.to_json() for f in incident.findings],
                    "detail": wf.detail,
                    "outcome": str(incident.outcome or ""),
                    "closure": incident.outcome.closure.value if incident.outcome else "",
                    "opened_unix_ns": incident.opened_ns,
                    "workloads": incident.workloads,
                },
            )
        )

    def capacity(self, wf: Workflow, status: str, summary: str, now: int, severity: str = "warning") -> None:
        """The incident's serving-capacity alert (repair/capacity.py): a repair waiting too long
        for capacity, or an urgent one that takes a pool below its floor; one identity per
        incident, resolved when the wait ends or the incident closes."""
        if status == "resolved" and not wf.capacity_alert:
            return
        wf.capacity_alert = status == "firing"
        self.alerts.notify(
            Alert(
                key=f"{wf.incident_id}/capacity",
                status=status,
                node=wf.node,
                state=wf.state,
                severity=severity,
                summary=summary,
                time_ns=now,
                details={"detail": wf.detail, "incident": wf.incident_id, "kind": "serving_capacity"},
            )
        )

    def breaker_tripped(self, reason: str, now: int) -> None:
        self._state.audit(AuditRecord(now, AUTOMATION, "", "breaker_trip", reason, OK, ""))
        log.error(
            "circuit breaker tripped: %s; all automatic action halted until `gpufleet breaker reset`", reason
        )
        self._on_action("", "breaker_trip", OK)
        self.alerts.breaker(
            Alert("breaker", "firing", "", "tripped", "critical", f"repair breaker tripped: {reason}", now)
        )

    def breaker_reset(self, actor: str, reason: str, was: str, now: int) -> None:
        self._state.audit(AuditRecord(now, actor, "", "breaker_reset", reason, OK, ""))
        log.warning("circuit breaker reset by %s: %s", actor, reason)
        self.alerts.breaker(
            Alert(
                "breaker",
                "resolved",
                "",
                "reset",
                "critical",
                f"repair breaker reset by {actor}: {reason} (was: {was})",
                now,
            )
        )
