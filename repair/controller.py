"""The repair controller: a level-triggered reconciler (docs/architecture.md "Repair").

Each pass reads the nodes' snapshots and the scheduler's view, evaluates the health rules
(repair/evaluator.py) and moves each node's workflow one safe step:

  healthy → suspect (a finding waits out its window) → cordoned → draining → repairing
  (the finding's ladder: reset_gpu, reboot, ticket) → validating (clean signals for
  validate_s) → healthy; or quarantined for a person (ladder exhausted, ticket opened,
  lemon node). waiting: the node needs action but a rail holds it back.

Every automatic step passes one gate (repair/rails.py: breaker, dry-run, a readable
scheduler, the cap, one drain at a time); a held step is audited once and the workflow stays
where it stood until the rail lets it go. A person's cordon or uncordon always wins: seen in
the scheduler's view, and checked again by the backend right before it acts.

Incidents, the audit log and alerts are repair/incidents.py; the ladder's non-idempotent steps
(through the action ledger, never repeated after a restart) are repair/ladder.py."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from gpufleet.protos import ingest_pb2, vocabulary_pb2
from gpufleet.repair.alerts.dispatcher import AlertDispatcher
from gpufleet.repair.backends.base import AUTOMATION_PREFIX, Backend, BackendError, NotOurs, Observed
from gpufleet.repair.evaluator import Evaluator, finding_id
from gpufleet.repair.health import BY_AUTOMATION, OUT_OF_SERVICE, WATCHED, Health, Step
from gpufleet.repair.hooks import HookRunner, run_hook
from gpufleet.repair.incidents import AUTOMATION, IncidentDesk
from gpufleet.repair.ladder import Hooks, StepRunner, reset_target
from gpufleet.repair.model import Finding, NodeSnapshot
from gpufleet.repair.observe import SchedulerWatch
from gpufleet.repair.outcome import OK, STARTED, Outcome, Status, failed
from gpufleet.repair.policy import Policy
from gpufleet.repair.rails import Breaker, Gate, Rails, SchedulerView
from gpufleet.repair.state import Fenced, HeldStep, RepairState, Workflow

log = logging.getLogger("gpufleet.repair")
_YIELD_EVERY = 64  # nodes evaluated between two returns to the event loop in one pass

__all__ = ["AUTOMATION", "Hooks", "Rails", "RepairController", "RepairRefused"]


class RepairRefused(Exception):
    """A manual action that cannot be done; kind is not_found, invalid or failed."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class RepairController:
    def __init__(
        self,
        policy: Policy,
        state: RepairState,
        backend: Backend,
        rails: Rails,
        hooks: Hooks,
        dispatcher: AlertDispatcher,
        snapshots: Callable[[set[str] | None], list[NodeSnapshot]],
        send_command: Callable[[str, ingest_pb2.Command], bool],
        on_action: Callable[[str, str, Outcome], None] = lambda node, action, outcome: None,
        observe_interval_s: float = 15.0,
        liveness: Callable[[], dict[str, int]] | None = None,
        clock: Callable[[], int] = time.time_ns,
        hook_runner: HookRunner = run_hook,
    ) -> None:
        """clock: the time every decision is made at (ns); `gpufleet replay` runs the same
        controller on a virtual one (repair/replay/). hook_runner: how reboot and ticket
        commands are carried out (replay: simulated)."""
        self.policy = policy
        self.clock = clock
        self.state = state
        self.backend = backend
        self.rails = rails
        self.alerts = dispatcher
        self._snapshots = snapshots
        # Every known node's liveness now (cheap: no snapshot is built); None: take it from the
        # snapshots, which builds one per node.
        self._liveness = liveness or (lambda: {s.node: s.liveness for s in snapshots(None)})
        self._full_pass_s = observe_interval_s
        self._seen_liveness: dict[str, int] = {}  # as each node's last evaluation saw it
        self.desk = IncidentDesk(state, dispatcher, on_action, clock)
        self.breaker = Breaker(state, rails)
        self.scheduler = SchedulerWatch(backend, observe_interval_s)
        self.gate = Gate(rails, self.breaker, self.scheduler.cordoned)
        self.evaluator = Evaluator(policy, state)
        self.steps = StepRunner(policy, state, hooks, self.desk, send_command, self.poke, clock, hook_runner)
        dispatcher.restore_breaker(self.breaker.tripped)
        self.workflows: dict[str, Workflow] = state.workflows()
        self.gate.fleet_size = len(self.workflows)
        self.findings: dict[str, list[Finding]] = {}  # active findings per node, last pass
        self._wake = asyncio.Event()
        self._dirty: set[str] | None = set()  # nodes poked since the last pass; None: all
        self._lock = asyncio.Lock()
        self.passes = 0
        self.pass_errors = 0  # passes that raised (logged with the traceback, counted)
        self.last_pass_s = 0.0
        self.fenced = ""  # why this controller stopped: a newer leader holds the lease

    # --- what the Fleet API and metrics read ------------------------------------------------
    @property
    def breaker_tripped(self) -> bool:
        return self.breaker.tripped

    @property
    def breaker_reason(self) -> str:
        return self.breaker.reason

    @property
    def breaker_since_ns(self) -> int:
        return self.breaker.since_ns

    def first_seen_ns(self, f: Finding) -> int:
        return self.evaluator.first_seen_ns(f)

    def out_of_service(self) -> int:
        return sum(1 for w in self.workflows.values() if w.state in OUT_OF_SERVICE)

    def cap(self) -> int:
        return self.gate.cap()

    @property
    def scheduler_reads(self) -> int:
        return self.scheduler.reads

    # --- running ----------------------------------------------------------------------
    def poke(self, node: str | None = None) -> None:
        """Run a pass now instead of at the next interval: for one node (an XID, or its health
        signals changed) or, with no node, for the whole fleet."""
        if node is None:
            self._dirty = None
        elif self._dirty is not None:
            self._dirty.add(node)
        self._wake.set()

    def take_poked(self) -> set[str]:
        """The nodes poked since the last call (every known node for a fleet-wide poke), for a
        caller that runs the passes itself (repair/replay/engine.py)."""
        dirty, self._dirty = self._dirty, set()
        self._wake.clear()
        return set(self.workflows) if dirty is None else dirty

    def needs_attention(self, liveness: dict[str, int]) -> set[str]:
        """Nodes evaluated on every tick, whatever their reports say: a workflow under way or
        an incident open (steps, windows and timeouts run on the clock), a finding waiting out
        its persistence window, or a liveness that changed since the node was last evaluated
        (liveness: every known node's now)."""
        nodes = {
            n
            for n, wf in self.workflows.items()
            if wf.state != Health.HEALTHY or wf.incident_id or wf.held or wf.suppressed
        }
        nodes.update(n for n, found in self.findings.items() if found)
        nodes.update(n for n, lv in liveness.items() if self._seen_liveness.get(n) != lv)
        return nodes

    async def run(self, stop: asyncio.Event, interval_s: float = 1.0) -> None:
        """Work proportional to change (docs/architecture.md "Repair at fleet scale"): a full
        pass over every node each repair_observe_interval_s (when the scheduler's whole-fleet
        view is read again); every interval_s between them, a pass over just the nodes that
        changed or need attention (`needs_attention`); and as soon as a node is poked (an XID,
        or one of the health fields the rules read changed), a pass over that node."""
        next_full = next_tick = 0.0
        while not stop.is_set():
            self._wake.clear()
            only, self._dirty = self._dirty, set()
            now = time.monotonic()
            full = now >= next_full
            if full:
                only, next_tick = None, now + interval_s
            elif now >= next_tick:
                next_tick = now + interval_s
                known = self._liveness()
                # The cap's fraction is of the fleet as it is now, not as the last full pass saw
                # it (at start that pass may have seen no node at all).
                self.gate.fleet_size = len(known.keys() | self.workflows.keys())
                if only is not None:
                    only |= self.needs_attention(known)
            try:
                if only is None or only:
                    await self.pass_once(only)
            except Fenced as exc:
                # Another replica leads now: this one must not act again (docs/architecture.md
                # "Control plane and replicas"). The refusal is in the audit log.
                self.fenced = str(exc)
                log.error("repair stopped on this replica: %s", exc)
                break
            except Exception:  # a bug in one pass must not stop repairs for good
                self.pass_errors += 1
                log.exception("repair pass failed (%d so far); retrying next interval", self.pass_errors)
            if full:
                # From the pass's end: the next full pass finds the whole-fleet read due again
                # (repair/observe.py counts its interval from the end of the read).
                next_full = time.monotonic() + max(self._full_pass_s, interval_s)
            if self._wake.is_set():
                continue
            waiters = [asyncio.create_task(self._wake.wait()), asyncio.create_task(stop.wait())]
            await asyncio.wait(
                waiters,
                timeout=max(0.0, min(next_full, next_tick) - time.monotonic()),
                return_when=asyncio.FIRST_COMPLETED,
            )
            for w in waiters:
                w.cancel()
        self.steps.close()

    def on_command_result(self, node: str, result: ingest_pb2.CommandResult) -> None:
        self.steps.on_command_result(node, result)

    # --- one pass -----------------------------------------------------------------------
    async def pass_once(self, only: set[str] | None = None) -> None:
        """Reconcile every node, or only the nodes in `only`."""
        async with self._lock:
            if self.state.epoch is not None:
                # A leader's pass starts by proving it still leads: a drain check (evictions,
                # on Kubernetes) is an action, and no write comes before it.
                self.state.check_fence("a repair pass")
            now = self.clock()
            started = time.monotonic()
            snaps = {s.node: s for s in self._snapshots(only)}
            nodes = sorted(set(snaps) | (set(self.workflows) if only is None else only & set(self.workflows)))
            if only is None:
                self.gate.fleet_size = len(nodes)
            watched = [n for n in nodes if n in self.workflows and self.workflows[n].state in WATCHED]
            view, fresh = await self.scheduler.read(nodes, only is None, watched)
            for i, node in enumerate(nodes):
                if i % _YIELD_EVERY == _YIELD_EVERY - 1:
                    # A full pass over thousands of nodes must not hold the event loop: acks and
                    # reports go on between slices of it (the pass works on its snapshots).
                    await asyncio.sleep(0)
                wf = self.workflows.get(node) or Workflow(node)
                snap = snaps.get(node)
                findings = self.evaluator.evaluate(wf, snap, now) if snap else []
                self.findings[node] = findings
                if snap is not None:
                    self._seen_liveness[node] = snap.liveness
                # A shallow copy is enough: the controller replaces a workflow's lists, never
                # changes them in place.
                before = dict(vars(wf))
                seen = self.scheduler.get(node) if node in fresh or wf.state not in WATCHED else None
                await self._reconcile(wf, snap, findings, seen, view, now)
                changed = vars(wf) != before
                if changed or node not in self.workflows:
                    self.workflows[node] = wf
                    # Only a change is written (one fsync each): a node seen for the first time
                    # and still healthy is the default, and 2,000 of them appearing at once
                    # must not hold the event loop for 2,000 fsyncs.
                    if changed:
                        self.state.save(wf)
            self.passes += 1
            self.last_pass_s = time.monotonic() - started

    # --- the state machine ---------------------------------------------------------------
    async def _reconcile(
        self,
        wf: Workflow,
        snap: NodeSnapshot | None,
        findings: list[Finding],
        seen: Observed | None,
        view: SchedulerView,
        now: int,
    ) -> None:
        if seen is not None and self._person_acted(wf, seen, findings, now):
            return
        if wf.state == Health.HUMAN_CORDONED:
            return
        cordon = [f for f in findings if f.cordon]
        ready = [f for f in cordon if self.evaluator.persisted(f, now)]
        notable = [f for f in findings if f.severity != "info" and self.evaluator.persisted(f, now)]
        if wf.state in (Health.HEALTHY, Health.SUSPECT, Health.WAITING):
            if ready:
                await self._take_out(wf, ready, view, now)
                return
            wf.held = None  # nothing is due: no step is held back
            if cordon:
                worst = cordon[0]
                left = self.evaluator.left_s(worst, now)
                self._move(wf, Health.SUSPECT, f"{worst.code} must persist {left:.0f} s more before action")
            elif notable:
                self.desk.note(wf, notable)
                self._move(wf, Health.HEALTHY, f"watching: {', '.join(f.code for f in notable)}")
            else:
                self.desk.close(wf, "cleared by itself", now)
                self._move(wf, Health.HEALTHY, "")
            # A node just cordoned drains from the next pass: every cordon due now goes out first.
            return
        if wf.incident_id and notable:
            self.desk.note(wf, notable)  # add what else was found while out of service
        if wf.state == Health.CORDONED:
            if self._held(wf, Step.DRAIN, view, now, "start moving workloads off"):
                return
            self.desk.audit(wf, Step.DRAIN, "start moving workloads off", STARTED, now)
            self._move(wf, Health.DRAINING, "draining")
            await self._drain(wf, view, now)
        elif wf.state == Health.DRAINING:
            if self._held(wf, Step.DRAIN, view, now, "move workloads off"):
                return
            await self._drain(wf, view, now)
        elif wf.state == Health.REPAIRING:
            await self._repair(wf, snap, view, now)
        elif wf.state == Health.VALIDATING:
            await self._validate(wf, snap, cordon, view, now)

    def _held(self, wf: Workflow, step: Step, view: SchedulerView, now: int, what: str) -> bool:
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

    def _person_acted(self, wf: Workflow, seen: Observed, findings: list[Finding], now: int) -> bool:
        """React to what people did in the scheduler; True when nothing else is to be done."""
        if wf.state in BY_AUTOMATION and wf.cordoned_by_us:
            if not seen.cordoned:
                self.desk.observed(
                    wf, "uncordon", "a person returned the node to service outside gpufleet", now
                )
                self._cancel(wf, findings, "cancelled: a person uncordoned the node", now)
                return True
            if not seen.ours:
                self._handed_over(wf, seen.reason, now, f"a person re-cordoned it: {seen.reason}")
                return True
            return False
        if wf.state == Health.HUMAN_CORDONED:
            if not seen.cordoned:
                self.desk.observed(wf, "uncordon", "a person returned the node to service", now)
                self._cancel(wf, findings, "", now)
                return True
            wf.detail = seen.reason
            return True
        if seen.cordoned and not seen.ours:
            self._handed_over(wf, seen.reason, now, f"cordoned by a person: {seen.reason}")
            return True
        if seen.cordoned and seen.ours and not wf.cordoned_by_us:
            # Ours, but this aggregator has no record of it: an earlier process cordoned it
            # and died before saving that. Adopt it rather than leave it out of service.
            self._adopt(wf, seen, findings, now)
            return True
        return False

    def _adopt(self, wf: Workflow, seen: Observed, findings: list[Finding], now: int) -> None:
        self.desk.observed(
            wf, "cordon", f"a cordon of ours this process has no record of: {seen.reason}", now
        )
        wf.cordoned_by_us = True
        cordon = [f for f in findings if f.cordon]
        if cordon:  # still failing: carry on with the repair it was cordoned for
            self.desk.note(wf, cordon)
            worst = max(cordon, key=lambda f: f.severity_rank)
            wf.ladder, wf.step, wf.step_key = list(worst.ladder), 0, ""
            wf.gpus = sorted({f.gpu for f in cordon if f.gpu is not None})
            self._move(wf, Health.CORDONED, seen.reason)
        else:  # nothing wrong any more: validate it back into service
            wf.ladder, wf.step = [], 0
            self._validating(wf, "adopted after a restart", now)

    def _handed_over(self, wf: Workflow, reason: str, now: int, audit_reason: str) -> None:
        """A person has the node: stop, close any incident as theirs, keep hands off."""
        self.desk.observed(wf, "cordon", audit_reason, now)
        self.desk.close(wf, f"taken over by a person: {reason}", now, handed_to_person=True)
        wf.cordoned_by_us = False
        wf.held = None
        self._move(wf, Health.HUMAN_CORDONED, reason)

    async def _take_out(self, wf: Workflow, ready: list[Finding], view: SchedulerView, now: int) -> None:
        incident = self.desk.note(wf, ready)
        if not self.breaker.tripped:
            tripped = self.breaker.record_failure(wf.node, now)
            if tripped:
                self.desk.breaker_tripped(tripped, now)
        worst = max(ready, key=lambda f: f.severity_rank)
        where = f" on GPU {worst.gpu}" if worst.gpu is not None else ""
        reason = f"{AUTOMATION_PREFIX} {worst.code}{where}: {worst.reason} [{incident.id}]"
        if self._held(wf, Step.CORDON, view, now, reason):
            self._move(wf, Health.WAITING, wf.detail)
            return
        # Audited before the scheduler is changed: a process killed in between leaves a row.
        self.desk.audit(wf, Step.CORDON, reason, STARTED, now)
        try:
            await self.backend.cordon(wf.node, reason, automation=True)
        except NotOurs as exc:
            self._handed_over(wf, exc.reason, now, f"cordoned by a person: {exc.reason}")
            return
        except BackendError as exc:
            self.desk.audit(wf, Step.CORDON, reason, failed(str(exc)), now)
            self._move(wf, Health.WAITING, f"cordon failed, retrying: {exc}")
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
            self._move(
                wf,
                Health.QUARANTINED,
                f"lemon node: {recent} incidents in {days:g} days; a person decides",
            )
            return
        self._move(wf, Health.CORDONED, reason)

    async def _drain(self, wf: Workflow, view: SchedulerView, now: int) -> None:
        """One drain check; the rails were asked by the caller."""
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
            wf.detail = progress.detail
            return
        self.desk.audit(wf, Step.DRAIN, progress.detail, OK, now)
        self._move(wf, Health.REPAIRING, "drained")
        await self._repair(wf, self._snapshot(wf.node), view, now)

    def _snapshot(self, node: str) -> NodeSnapshot | None:
        return next(iter(self._snapshots({node})), None)

    async def _repair(self, wf: Workflow, snap: NodeSnapshot | None, view: SchedulerView, now: int) -> None:
        if wf.step >= len(wf.ladder):
            self.desk.audit(wf, "quarantine", "every repair step was tried", OK, now)
            self._move(wf, Health.QUARANTINED, "repair steps exhausted; a person decides")
            return
        step = Step(wf.ladder[wf.step])
        key = f"{wf.incident_id}:{wf.step}:{step}"
        outcome = self.state.action_outcome(key)
        if outcome is None:
            target = reset_target(wf) if step is Step.RESET_GPU else wf.node
            if self._held(wf, step, view, now, target):
                return
            self.steps.begin(wf, step, key, snap, now)
            return
        if outcome.status is Status.STARTED:
            self.steps.check_running(wf, step, key, now)
            return
        if step is Step.TICKET:
            self._move(wf, Health.QUARANTINED, f"hardware ticket: {str(outcome)[:200]}")
            return
        if not outcome.ok:
            wf.step += 1
            wf.detail = f"{step} failed ({str(outcome)[:200]}); next step"
            await self._repair(wf, snap, view, now)
            return
        if step is Step.REBOOT:
            if snap is not None and snap.boot_id != wf.boot_id_at_step and snap.connected:
                self._start_validation(wf, f"node came back after reboot (boot {snap.boot_id})", now, view)
            elif now - wf.step_started_ns > self.policy.workflow["reboot_timeout_s"] * 1e9:
                self.desk.audit(wf, Step.REBOOT, "the collector did not come back", failed("timeout"), now)
                wf.step += 1
            else:
                wf.detail = "waiting for the node to come back from the reboot"
            return
        self._start_validation(wf, f"{step} done", now, view)

    def _start_validation(self, wf: Workflow, why: str, now: int, view: SchedulerView) -> None:
        if not self._held(wf, Step.VALIDATE, view, now, why):
            self._validating(wf, why, now)

    def _validating(self, wf: Workflow, why: str, now: int) -> None:
        wf.validate_since_ns = now
        self._move(
            wf,
            Health.VALIDATING,
            f"{why}; waiting {self.policy.workflow['validate_s']:g} s for clean signals",
        )

    async def _validate(
        self, wf: Workflow, snap: NodeSnapshot | None, cordon: list[Finding], view: SchedulerView, now: int
    ) -> None:
        bad = [f for f in cordon if f.seen_ns >= wf.validate_since_ns]
        step = wf.ladder[wf.step] if wf.step < len(wf.ladder) else "repair"
        if bad:
            found = ", ".join(f"{f.code} ({f.evidence})" for f in bad)
            self.desk.audit(wf, Step.VALIDATE, f"after {step}: {found}", Outcome(Status.FAILED), now)
            wf.step += 1
            self._move(wf, Health.REPAIRING, f"{step} did not fix it: {bad[0].code}")
            return
        validate_ns = self.policy.workflow["validate_s"] * 1e9
        if snap is None or snap.liveness != vocabulary_pb2.LIVENESS_REPORTING:
            wf.detail = "waiting for the node's collector to report"
            return
        if now - wf.validate_since_ns < validate_ns or snap.sample_time_ns < wf.validate_since_ns:
            return
        why = f"clean for {validate_ns / 1e9:g} s after {step}"
        if self._held(wf, Step.UNCORDON, view, now, why):
            return
        self.desk.audit(wf, Step.UNCORDON, why, STARTED, now)
        try:
            await self.backend.uncordon(wf.node, automation=True)
        except NotOurs as exc:
            self._handed_over(wf, exc.reason, now, f"a person re-cordoned it: {exc.reason}")
            return
        except BackendError as exc:
            wf.detail = f"uncordon failed, retrying: {exc}"
            self.desk.audit(wf, Step.UNCORDON, why, failed(str(exc)), now)
            return
        finally:
            self.scheduler.forget(wf.node)
        self.desk.audit(wf, Step.UNCORDON, why, OK, now)
        wf.cordoned_by_us = False
        self.desk.close(wf, f"repaired by {step}", now)
        self._move(wf, Health.HEALTHY, "")

    def _cancel(self, wf: Workflow, findings: list[Finding], outcome: str, now: int) -> None:
        """A person returned the node to service: stop, and do not re-cordon for what they saw."""
        # Findings already overridden stay so (they are not in `findings`: filtered out).
        wf.suppressed = sorted(set(wf.suppressed) | {finding_id(f) for f in findings})
        wf.cleared_before_ns = now
        wf.cordoned_by_us = False
        wf.held = None
        self.desk.close(wf, outcome or "cancelled: a person returned the node to service", now)
        self._move(wf, Health.HEALTHY, "")

    def _move(self, wf: Workflow, state: Health, detail: str) -> None:
        wf.detail = detail
        if wf.state == state:
            return
        log.info("%s → %s %s", wf.state, state, detail, extra={"node": wf.node, "incident": wf.incident_id})
        wf.state = state
        self.desk.moved(wf)

    # --- manual actions (Fleet API) ----------------------------------------------------------
    async def cordon(self, node: str, reason: str, actor: str) -> Workflow:
        async with self._lock:
            wf = self._known(node)
            now = self.clock()
            text = f"gpufleet-manual [{actor}]: {reason}"
            try:
                await self.backend.cordon(node, text, automation=False)
            except BackendError as exc:
                self.desk.audit(wf, "cordon", reason, failed(str(exc)), now, actor=actor)
                raise RepairRefused("failed", f"cordon {node} failed: {exc}") from exc
            finally:
                self.scheduler.forget(node)
            self.desk.audit(wf, "cordon", reason, OK, now, actor=actor)
            if wf.state in BY_AUTOMATION or wf.incident_id:
                self.desk.close(wf, f"taken over by {actor}: {reason}", now, handed_to_person=True)
            wf.cordoned_by_us = False
            wf.held = None
            self._move(wf, Health.HUMAN_CORDONED, text)
            self._save(wf)
            return wf

    async def uncordon(self, node: str, reason: str, actor: str) -> Workflow:
        async with self._lock:
            wf = self._known(node)
            now = self.clock()
            try:
                await self.backend.uncordon(node, automation=False)
            except BackendError as exc:
                self.desk.audit(wf, "uncordon", reason, failed(str(exc)), now, actor=actor)
                raise RepairRefused("failed", f"uncordon {node} failed: {exc}") from exc
            finally:
                self.scheduler.forget(node)
            self.desk.audit(wf, "uncordon", reason, OK, now, actor=actor)
            self._cancel(wf, self.findings.get(node, []), f"cancelled by {actor}: {reason}", now)
            self._save(wf)
            return wf

    async def reset_breaker(self, reason: str, actor: str) -> None:
        async with self._lock:
            now = self.clock()
            was = self.breaker.reset(now)
            self.desk.breaker_reset(actor, reason, was, now)
        self.poke()

    def _known(self, node: str) -> Workflow:
        if node not in self.workflows and not self._snapshots({node}):
            raise RepairRefused(
                "not_found", f"node {node!r} is not known to this aggregator; `gpufleet nodes` lists them"
            )
        return self.workflows.get(node) or Workflow(node)

    def _save(self, wf: Workflow) -> None:
        self.workflows[wf.node] = wf
        self.state.save(wf)
