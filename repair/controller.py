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
(through the action ledger, never repeated after a restart) are repair/step_runner.py."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from gpufleet.protos import ingest_pb2
from gpufleet.repair.alerts.dispatcher import AlertDispatcher
from gpufleet.repair.backends.base import Backend, Observed
from gpufleet.repair.capacity import CapacityGuard
from gpufleet.repair.engine_drain import EngineDrain
from gpufleet.repair.evaluator import Evaluator
from gpufleet.repair.health import OUT_OF_SERVICE, WATCHED, Health
from gpufleet.repair.hooks import HookRunner, run_hook
from gpufleet.repair.incidents import AUTOMATION, IncidentDesk
from gpufleet.repair.model import Finding, NodeSnapshot
from gpufleet.repair.observe import SchedulerWatch
from gpufleet.repair.orphan_cleanup import orphan_cleanup
from gpufleet.repair.outcome import Outcome
from gpufleet.repair.person_actions import PersonActions, RepairRefused
from gpufleet.repair.policy import Policy
from gpufleet.repair.rails import Breaker, Gate, Rails, SchedulerView
from gpufleet.repair.serving import ReplicaReading
from gpufleet.repair.state import Fenced, RepairState, StateError, Workflow
from gpufleet.repair.step_runner import Hooks, StepRunner
from gpufleet.repair.waste_desk import WasteDesk
from gpufleet.repair.workflow_moves import WorkflowMoves
from gpufleet.repair.workflow_steps import WorkflowSteps

log = logging.getLogger("gpufleet.repair")
_YIELD_EVERY = 64  # nodes evaluated between two returns to the event loop in one pass

__all__ = ["AUTOMATION", "Hooks", "Rails", "RepairController", "RepairRefused"]


class RepairController:
    """Runs the passes and is what the Fleet API and metrics read; its parts are objects given
    what they use: the moves on a workflow (WorkflowMoves), the automation's steps
    (WorkflowSteps), people's actions (PersonActions), the ladder's steps (StepRunner), incidents
    and audit (IncidentDesk), the rails (Gate, Breaker), the scheduler's view (SchedulerWatch)."""

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
        serving: Callable[[], list[ReplicaReading]] = list,
    ) -> None:
        """clock: the time every decision is made at (ns); `gpufleet replay` runs the same
        controller on a virtual one (repair/replay/). hook_runner: how reboot and ticket
        commands are carried out (replay: simulated). serving: every inference-engine replica
        in the fleet now, for the capacity guard (repair/capacity.py; none: no pools)."""
        self.policy = policy
        self.clock = clock
        self.state = state
        self.backend = backend
        self.rails = rails
        self.alerts = dispatcher
        self._snapshots = snapshots
        # Every known node's liveness now, cheaply (no snapshot built); None: from the snapshots.
        self._liveness = liveness or (lambda: {s.node: s.liveness for s in snapshots(None)})
        self._full_pass_s = observe_interval_s
        self._seen_liveness: dict[str, int] = {}  # as each node's last evaluation saw it
        self.waste = WasteDesk(dispatcher, clock)
        self.desk = IncidentDesk(state, dispatcher, on_action, clock, self.waste.workloads_on)
        self.waste.cleanup = orphan_cleanup(hooks, state, self.desk, rails, clock, hook_runner)
        self.breaker = Breaker(state.kept, rails)
        self.scheduler = SchedulerWatch(backend, observe_interval_s)
        self.capacity = CapacityGuard(policy.serving, serving, self.desk, clock)
        self.gate = Gate(rails, self.breaker, self.scheduler.cordoned, self.capacity)
        self.engines = EngineDrain(policy.serving, backend, self.desk, self.capacity, clock)
        self.evaluator = Evaluator(policy, state.kept)
        self.steps = StepRunner(policy, state, hooks, self.desk, send_command, self.poke, clock, hook_runner)
        dispatcher.restore_breaker(self.breaker.tripped)
        self.workflows: dict[str, Workflow] = state.workflows()
        self.gate.fleet_size = len(self.workflows)
        self.findings: dict[str, list[Finding]] = {}  # active findings per node, last pass
        # The node snapshots the findings were made from (a full pass replaces them, a pass over
        # some nodes updates theirs): what /metrics' GPU health reads, never the live view.
        self.last_snapshots: dict[str, NodeSnapshot] = {}
        self._wake = asyncio.Event()
        self._dirty: set[str] | None = set()  # nodes poked since the last pass; None: all
        self._lock = asyncio.Lock()
        self.moves = WorkflowMoves(policy, state, self.desk, self.gate, self.workflows, snapshots)
        self.workflow_steps = WorkflowSteps(
            policy,
            state,
            backend,
            self.desk,
            self.breaker,
            self.scheduler,
            self.engines,
            self.evaluator,
            self.steps,
            self.moves,
        )
        self.person_actions = PersonActions(
            backend,
            self.desk,
            self.scheduler,
            self.breaker,
            self.moves,
            self.findings,
            self._lock,
            clock,
            self.poke,
        )
        self.passes = 0
        self.pass_errors = 0  # passes that raised (logged with the traceback, counted)
        self._store_failing = False  # the last pass failed on the store (logged at the first)
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
        # A copy first: the Fleet API reads this from another thread than the passes run on.
        return sum(1 for w in list(self.workflows.values()) if w.state in OUT_OF_SERVICE)

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
            if not await self._guarded_pass(only):
                break
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

    async def _guarded_pass(self, only: set[str] | None) -> bool:
        """One pass (none for an empty `only`); False once fenced: this controller stops."""
        try:
            if only is None or only:
                await self.pass_once(only)
        except Fenced as exc:
            # Another replica leads now: this one must not act again (docs/architecture.md
            # "Control plane and replicas"). The refusal is in the audit log.
            self.fenced = str(exc)
            log.error("repair stopped on this replica: %s", exc)
            return False
        except StateError as exc:  # the store is down or hangs: said once, until it answers
            self.pass_errors += 1
            if not self._store_failing:
                log.error("repair pass stopped: %s; retrying every interval, nothing acts meanwhile", exc)
            self._store_failing = True
        except Exception:  # a bug in one pass must not stop repairs for good
            self.pass_errors += 1
            log.exception("repair pass failed (%d so far); retrying next interval", self.pass_errors)
        else:
            if self._store_failing:
                log.warning("repair passes run again: the control plane answers")
            self._store_failing = False
        return True

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
            self.capacity.new_pass()
            snaps = {s.node: s for s in self._snapshots(only)}
            if only is None:
                self.last_snapshots = snaps
            else:
                self.last_snapshots.update(snaps)
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
                findings = self.waste.route(node, findings, snap, self.evaluator, now)
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
            await self.waste.passed(None if only is not None else set(snaps), now, self.breaker.tripped)
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
        if seen is not None and self.person_actions.person_acted(wf, seen, findings, now):
            return
        if wf.state == Health.HUMAN_CORDONED:
            return
        cordon = [f for f in findings if f.cordon]
        ready = [f for f in cordon if self.evaluator.persisted(f, now)]
        notable = [f for f in findings if f.severity != "info" and self.evaluator.persisted(f, now)]
        if wf.state in (Health.HEALTHY, Health.SUSPECT, Health.WAITING):
            await self.workflow_steps.in_service(wf, cordon, ready, notable, view, now)
            return
        if wf.incident_id and notable:
            self.desk.note(wf, notable)  # add what else was found while out of service
        await self.workflow_steps.out_of_service(wf, snap, cordon, view, now)

    # --- a person's actions (Fleet API) ----------------------------------------------------
    async def cordon(self, node: str, reason: str, actor: str) -> Workflow:
        return await self.person_actions.cordon(node, reason, actor)

    async def uncordon(self, node: str, reason: str, actor: str) -> Workflow:
        return await self.person_actions.uncordon(node, reason, actor)

    async def proceed(self, node: str, reason: str, actor: str) -> Workflow:
        return await self.person_actions.proceed(node, reason, actor)

    async def reset_breaker(self, reason: str, actor: str) -> None:
        await self.person_actions.reset_breaker(reason, actor)
