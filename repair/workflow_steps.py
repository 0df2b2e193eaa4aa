"""A node's way through the workflow once a finding is ready: cordoned, drained, the repair
ladder's steps (each through the action ledger), validated and returned to service, each step
past the rails first."""

from __future__ import annotations

import logging

from gpufleet.protos import vocabulary_pb2
from gpufleet.repair.backends.base import AUTOMATION_PREFIX, Backend, BackendError, NotOurs
from gpufleet.repair.engine_drain import EngineDrain
from gpufleet.repair.evaluator import Evaluator
from gpufleet.repair.health import Health, Step
from gpufleet.repair.incidents import IncidentDesk, workloads_hit, workloads_text
from gpufleet.repair.model import Finding, NodeSnapshot
from gpufleet.repair.observe import SchedulerWatch
from gpufleet.repair.outcome import CLEARED, OK, STARTED, Outcome, Status, failed, repaired
from gpufleet.repair.policy import Policy
from gpufleet.repair.rails import Breaker, SchedulerView
from gpufleet.repair.state import RepairState, Workflow
from gpufleet.repair.step_runner import StepRunner, reset_target
from gpufleet.repair.workflow_moves import WorkflowMoves

log = logging.getLogger("gpufleet.repair")
WAITS_NAMED = 5  # a drain's detail names at most this many of the workloads it waits for


class WorkflowSteps:
    """The automation's way through one node's workflow, a step a pass (the controller calls
    in_service or out_of_service for each node it reconciles)."""

    def __init__(
        self,
        policy: Policy,
        state: RepairState,
        backend: Backend,
        desk: IncidentDesk,
        breaker: Breaker,
        scheduler: SchedulerWatch,
        engines: EngineDrain,
        evaluator: Evaluator,
        steps: StepRunner,
        moves: WorkflowMoves,
    ) -> None:
        self.policy = policy
        self.state = state
        self.backend = backend
        self.desk = desk
        self.breaker = breaker
        self.scheduler = scheduler
        self.engines = engines
        self.evaluator = evaluator
        self.steps = steps
        self.moves = moves

    async def _take_out(self, wf: Workflow, ready: list[Finding], view: SchedulerView, now: int) -> None:
        incident = self.desk.note(wf, ready)
        if not self.breaker.tripped:
            tripped = self.breaker.record_failure(wf.node, now)
            if tripped:
                self.desk.breaker_tripped(tripped, now)
        worst = max(ready, key=lambda f: f.severity_rank)
        where = f" on GPU {worst.gpu}" if worst.gpu is not None else ""
        reason = f"{AUTOMATION_PREFIX} {worst.code}{where}: {worst.reason} [{incident.id}]"
        # Its drain may wait for serving capacity only if every finding behind it may (the cap
        # reads it too: an urgent cordon always has a slot, repair/rails.py).
        wf.may_wait = all(f.may_wait for f in ready)
        if self.moves.held(wf, Step.CORDON, view, now, reason):
            self.moves.move(wf, Health.WAITING, wf.detail)
            return
        # Audited before the scheduler is changed: a process killed in between leaves a row.
        self.desk.audit(wf, Step.CORDON, reason, STARTED, now)
        try:
            await self.backend.cordon(wf.node, reason, automation=True)
        except NotOurs as exc:
            self.moves.handed_over(wf, exc.reason, now, f"cordoned by a person: {exc.reason}")
            return
        except BackendError as exc:
            self.desk.audit(wf, Step.CORDON, reason, failed(str(exc)), now)
            self.moves.move(wf, Health.WAITING, f"cordon failed, retrying: {exc}")
            return
        finally:
            self.scheduler.forget(wf.node)  # changed (or maybe changed): read it again
        self.desk.audit(wf, Step.CORDON, reason, OK, now)
        wf.cordoned_by_us = True
        wf.ladder = list(worst.ladder)
        wf.step = 0
        wf.step_key = ""
        wf.gpus = sorted({f.gpu for f in ready if f.gpu is not None})
        days = self.policy.workflow["repeat_offender_days"]
        recent = self.state.incidents_since(wf.node, now - int(days * 86400e9))
        lemon = recent >= self.policy.workflow["repeat_offender_incidents"]
        if lemon and self.policy.workflow["lemon_quarantine"]:
            # A lemon node (docs/architecture.md "Lemon nodes"): its faults keep coming back, so
            # the ladder is not tried again; a person decides.
            self.desk.audit(wf, "quarantine", f"lemon node: {recent} incidents in {days:g} days", OK, now)
            self.moves.move(
                wf,
                Health.QUARANTINED,
                f"lemon node: {recent} incidents in {days:g} days; a person decides",
            )
            return
        self.moves.move(wf, Health.CORDONED, reason)

    async def _drain(self, wf: Workflow, view: SchedulerView, now: int) -> None:
        """One drain check; the rails were asked by the caller. Its engines first leave rotation
        and finish their requests (repair/engine_drain.py): nothing is evicted before."""
        if not await self.engines.done(wf, self.moves.workflows):
            return
        try:
            progress = await self.backend.drain(wf.node)
        except BackendError as exc:
            if not wf.detail.startswith("drain check failed"):
                log.warning(
                    "drain of %s failed, retrying each pass: %s", wf.node, exc, extra={"node": wf.node}
                )
            wf.detail = f"drain check failed, retrying: {exc}"
            return
        if not progress.done:
            # Whose work the drain waits for, as the scheduler says (the workload ledger's
            # allocations on the node): what the node page, `gpufleet nodes` and the repairs read.
            snap = self.moves.snapshot(wf.node)
            on_node = snap.workloads if snap is not None else ()
            waits = workloads_text(workloads_hit(on_node[:WAITS_NAMED], [])) if on_node else ""
            more = f" and {len(on_node) - WAITS_NAMED} more" if len(on_node) > WAITS_NAMED else ""
            wf.detail = progress.detail + (f"; waits for {waits}{more}" if waits else "")
            return
        self.desk.audit(wf, Step.DRAIN, progress.detail, OK, now)
        self.moves.move(wf, Health.REPAIRING, "drained")
        await self._repair(wf, self.moves.snapshot(wf.node), view, now)

    def _skipped(self, wf: Workflow) -> str:
        """The ladder's steps this incident skipped for want of a command, and the setting that
        would run each: what the node page says beside "quarantined" (issue 55: a reboot the demo
        skipped said nothing on screen)."""
        skipped = [
            f"{step} skipped: no repair_{step}_command set"
            for i, step in enumerate(wf.ladder)
            if (o := self.state.action_outcome(f"{wf.incident_id}:{i}:{step}")) is not None
            and o.status is Status.SKIPPED
            and o.detail.startswith("no ")
        ]
        return f" ({'; '.join(skipped)})" if skipped else ""

    async def _repair(self, wf: Workflow, snap: NodeSnapshot | None, view: SchedulerView, now: int) -> None:
        if wf.step >= len(wf.ladder):
            self.desk.audit(wf, "quarantine", "every repair step was tried", OK, now)
            self.moves.move(
                wf, Health.QUARANTINED, f"repair steps exhausted{self._skipped(wf)}; a person decides"
            )
            return
        step = wf.ladder[wf.step]
        key = f"{wf.incident_id}:{wf.step}:{step}"
        outcome = self.state.action_outcome(key)
        if outcome is None:
            target = reset_target(wf) if step is Step.RESET_GPU else wf.node
            if self.moves.held(wf, step, view, now, target):
                return
            self.steps.begin(wf, step, key, snap, now)
            return
        if outcome.status is Status.STARTED:
            self.steps.check_running(wf, step, key, now)
            return
        if step is Step.TICKET:
            said = f"hardware ticket: {str(outcome)[:200]}" if outcome.status is not Status.SKIPPED else ""
            self.moves.move(
                wf, Health.QUARANTINED, said or f"quarantined{self._skipped(wf)}; a person decides"
            )
            return
        if not outcome.ok:
            wf.step += 1
            wf.detail = f"{step} failed ({str(outcome)[:200]}); next step"
            await self._repair(wf, snap, view, now)
            return
        if step is Step.REBOOT:
            if snap is not None and snap.boot_id != wf.boot_id_at_step and snap.connected:
                why = f"node came back after reboot (boot {snap.boot_id})"
                self.moves.start_validation(wf, why, now, view)
            elif now - wf.step_started_ns > self.policy.workflow["reboot_timeout_s"] * 1e9:
                self.desk.audit(wf, Step.REBOOT, "the collector did not come back", failed("timeout"), now)
                wf.step += 1
            else:
                wf.detail = "waiting for the node to come back from the reboot"
            return
        self.moves.start_validation(wf, f"{step} done", now, view)

    async def _validate(
        self, wf: Workflow, snap: NodeSnapshot | None, cordon: list[Finding], view: SchedulerView, now: int
    ) -> None:
        bad = [f for f in cordon if f.seen_ns >= wf.validate_since_ns]
        step = wf.ladder[wf.step] if wf.step < len(wf.ladder) else "repair"
        if bad:
            found = ", ".join(f"{f.code} ({f.evidence})" for f in bad)
            self.desk.audit(wf, Step.VALIDATE, f"after {step}: {found}", Outcome(Status.FAILED), now)
            wf.step += 1
            self.moves.move(wf, Health.REPAIRING, f"{step} did not fix it: {bad[0].code}")
            return
        validate_ns = self.policy.workflow["validate_s"] * 1e9
        if snap is None or snap.liveness != vocabulary_pb2.LIVENESS_REPORTING:
            wf.detail = "waiting for the node's collector to report"
            return
        if now - wf.validate_since_ns < validate_ns or snap.sample_time_ns < wf.validate_since_ns:
            return
        why = f"clean for {validate_ns / 1e9:g} s after {step}"
        if self.moves.held(wf, Step.UNCORDON, view, now, why):
            return
        self.desk.audit(wf, Step.UNCORDON, why, STARTED, now)
        try:
            await self.backend.uncordon(wf.node, automation=True)
        except NotOurs as exc:
            self.moves.handed_over(wf, exc.reason, now, f"a person re-cordoned it: {exc.reason}")
            return
        except BackendError as exc:
            wf.detail = f"uncordon failed, retrying: {exc}"
            self.desk.audit(wf, Step.UNCORDON, why, failed(str(exc)), now)
            return
        finally:
            self.scheduler.forget(wf.node)
        self.desk.audit(wf, Step.UNCORDON, why, OK, now)
        wf.cordoned_by_us = False
        self.desk.close(wf, repaired(step), now)
        self.moves.move(wf, Health.HEALTHY, "")

    async def in_service(
        self,
        wf: Workflow,
        cordon: list[Finding],
        ready: list[Finding],
        notable: list[Finding],
        view: SchedulerView,
        now: int,
    ) -> None:
        """A node in service: take it out for a finding that persisted, else say what it waits
        for, watch what is notable, or close what cleared by itself."""
        if ready:
            await self._take_out(wf, ready, view, now)
            return
        wf.held = None  # nothing is due: no step is held back
        if cordon:
            worst = cordon[0]
            left = self.evaluator.left_s(worst, now)
            self.moves.move(wf, Health.SUSPECT, f"{worst.code} must persist {left:.0f} s more before action")
        elif notable:
            self.desk.note(wf, notable)
            self.moves.move(wf, Health.HEALTHY, f"watching: {', '.join(f.code for f in notable)}")
        else:
            self.desk.close(wf, CLEARED, now)
            self.moves.move(wf, Health.HEALTHY, "")
        # A node just cordoned drains from the next pass: every cordon due now goes out first.

    async def out_of_service(
        self, wf: Workflow, snap: NodeSnapshot | None, cordon: list[Finding], view: SchedulerView, now: int
    ) -> None:
        """The next step of a node the automation took out: drain, repair, validate."""
        if wf.may_wait and any(not f.may_wait for f in cordon):
            wf.may_wait = False  # an urgent finding came while it waited: it waits no longer
        if wf.state == Health.CORDONED:
            if self.moves.held(wf, Step.DRAIN, view, now, "start moving workloads off"):
                return
            self.desk.audit(wf, Step.DRAIN, "start moving workloads off", STARTED, now)
            self.moves.move(wf, Health.DRAINING, "draining")
            await self._drain(wf, view, now)
        elif wf.state == Health.DRAINING:
            if self.moves.held(wf, Step.DRAIN, view, now, "move workloads off"):
                return
            await self._drain(wf, view, now)
        elif wf.state == Health.REPAIRING:
            await self._repair(wf, snap, view, now)
        elif wf.state == Health.VALIDATING:
            await self._validate(wf, snap, cordon, view, now)
