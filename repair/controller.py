"""The repair controller: a level-triggered reconciler (DESIGN.md "Repair").

Each pass reads every node's snapshot and the scheduler's view, evaluates the health rules,
and moves each node's workflow one safe step:

  healthy → suspect (a finding waits out its window) → cordoned → draining → repairing
  (the finding's ladder: reset_gpu, reboot, ticket) → validating (clean signals for
  validate_s) → healthy; or quarantined for a person (ladder exhausted, ticket opened,
  repeat offender). waiting: the node needs action but a safety rail holds it back.

Safety rails: a cap on nodes out of service (absolute and a fraction of the fleet), a circuit
breaker (too many nodes failing within a window halts all automatic action until a person
resets it), dry-run, one drain at a time, never uncordoning what the automation did not
cordon, and a person's cordon or uncordon always winning.

Non-idempotent steps (GPU reset, reboot, ticket) go through the action ledger in RepairState:
recorded before they are carried out, so a restart never repeats one."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpufleet.protos import ingest_pb2, vocabulary_pb2
from gpufleet.repair.alerts.base import Alert
from gpufleet.repair.alerts.dispatcher import AlertDispatcher
from gpufleet.repair.backends.base import AUTOMATION_PREFIX, Backend, BackendError, Observed
from gpufleet.repair.hooks import run_hook
from gpufleet.repair.model import Finding, NodeSnapshot
from gpufleet.repair.policy import Policy
from gpufleet.repair.rules import RULES
from gpufleet.repair.state import AuditRecord, Incident, RepairState, Workflow

log = logging.getLogger("gpufleet.repair")

AUTOMATION = "automation"
OUT_OF_SERVICE = {"cordoned", "draining", "repairing", "validating", "quarantined", "human_cordoned"}
AUTO_OUT = OUT_OF_SERVICE - {"human_cordoned"}


class RepairRefused(Exception):
    """A manual action that cannot be done; kind is not_found, invalid or failed."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class Rails:
    dry_run: bool = False
    max_out_of_service: int = 10
    max_out_of_service_fraction: float = 0.1
    breaker_nodes: int = 5
    breaker_window_s: float = 600.0


@dataclass
class Hooks:
    reboot_command: str = ""
    ticket_command: str = ""
    timeout_s: float = 600.0


@dataclass
class _Pending:
    """A reset command in flight: GPU index → outcome (None until the collector answers)."""

    results: dict[int, str | None] = field(default_factory=dict)


def _finding_id(f: Finding) -> str:
    return f"{'-' if f.gpu is None else f.gpu}:{f.code}"


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
        on_action: Callable[[str, str, str], None] = lambda node, action, outcome: None,
    ) -> None:
        self.policy = policy
        self.state = state
        self.backend = backend
        self.rails = rails
        self.hooks = hooks
        self.alerts = dispatcher
        self._snapshots = snapshots
        self._send_command = send_command
        self._on_action = on_action
        self.rules = {name: factory() for name, factory in RULES.items()}
        self.workflows: dict[str, Workflow] = state.workflows()
        self.findings: dict[str, list[Finding]] = {}  # active findings per node, last pass
        self._first_seen: dict[tuple[str, int | None, str], int] = {}
        self._pending: dict[str, _Pending] = {}  # ledger key → reset results
        self._hook_tasks: dict[str, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._dirty: set[str] | None = set()  # nodes poked since the last pass; None: all
        self._fleet_size = 0
        self._lock = asyncio.Lock()
        self.passes = 0
        self.pass_errors = 0  # passes that raised (logged with the traceback, counted)
        self.last_pass_s = 0.0
        breaker = json.loads(state.get("breaker") or "{}")
        self.breaker_tripped: bool = breaker.get("tripped", False)
        self.breaker_reason: str = breaker.get("reason", "")
        self.breaker_since_ns: int = breaker.get("since_ns", 0)
        self._breaker_floor_ns: int = breaker.get("floor_ns", 0)
        self._failures: list[tuple[int, str]] = [tuple(x) for x in json.loads(state.get("failures") or "[]")]

    # --- running ----------------------------------------------------------------------
    def poke(self, node: str | None = None) -> None:
        """Run a pass now instead of at the next interval: for one node (an XID, or its health
        signals changed) or, with no node, for the whole fleet."""
        if node is None:
            self._dirty = None
        elif self._dirty is not None:
            self._dirty.add(node)
        self._wake.set()

    async def run(self, stop: asyncio.Event, interval_s: float = 1.0) -> None:
        """A full pass every interval_s; between them, passes over just the nodes poked."""
        next_full = 0.0
        while not stop.is_set():
            self._wake.clear()
            only, self._dirty = self._dirty, set()
            if time.monotonic() >= next_full:
                only, next_full = None, time.monotonic() + interval_s
            try:
                await self.pass_once(only)
            except Exception:  # a bug in one pass must not stop repairs for good
                self.pass_errors += 1
                log.exception("repair pass failed (%d so far); retrying next interval", self.pass_errors)
            if self._wake.is_set():
                continue
            waiters = [asyncio.create_task(self._wake.wait()), asyncio.create_task(stop.wait())]
            await asyncio.wait(
                waiters, timeout=max(0.0, next_full - time.monotonic()), return_when=asyncio.FIRST_COMPLETED
            )
            for w in waiters:
                w.cancel()
        for task in self._hook_tasks.values():
            task.cancel()

    def on_command_result(self, node: str, result: ingest_pb2.CommandResult) -> None:
        key, _, gpu = result.id.rpartition("#")
        pending = self._pending.get(key)
        if pending is None or not gpu.isdigit():
            log.warning("result of unknown command %s ignored", result.id, extra={"node": node})
            return
        outcome = vocabulary_pb2.CommandOutcome.Name(result.outcome).removeprefix("COMMAND_OUTCOME_").lower()
        pending.results[int(gpu)] = "ok" if outcome == "succeeded" else f"{outcome}: {result.detail[:300]}"
        self.poke(node)

    # --- one pass -----------------------------------------------------------------------
    async def pass_once(self, only: set[str] | None = None) -> None:
        """Reconcile every node, or only the nodes in `only`."""
        async with self._lock:
            now = time.time_ns()
            started = time.monotonic()
            snaps = {s.node: s for s in self._snapshots(only)}
            nodes = sorted(set(snaps) | (set(self.workflows) if only is None else only & set(self.workflows)))
            observed: dict[str, Observed] | None = None
            if self.backend.observes:
                try:
                    observed = await self.backend.observe(nodes)
                except BackendError as exc:
                    log.warning("cannot read the scheduler's view this pass: %s", exc)
            if only is None:
                self._fleet_size = len(nodes)
            for node in nodes:
                wf = self.workflows.get(node) or Workflow(node)
                snap = snaps.get(node)
                findings = self._evaluate(wf, snap, now) if snap else []
                self.findings[node] = findings
                # A shallow copy is enough: the controller replaces a workflow's lists, never
                # changes them in place.
                before = dict(vars(wf))
                await self._reconcile(
                    wf, snap, findings, None if observed is None else observed.get(node), now
                )
                if vars(wf) != before or node not in self.workflows:
                    self.workflows[node] = wf
                    self.state.save(wf)
            self.passes += 1
            self.last_pass_s = time.monotonic() - started

    def _evaluate(self, wf: Workflow, snap: NodeSnapshot, now: int) -> list[Finding]:
        found: list[Finding] = []
        for name, rule in self.rules.items():
            entry = self.policy.rules.get(name)
            if entry is not None and not entry.enabled:
                continue
            found += rule.evaluate(snap, entry or self.policy.buckets["IGNORE"], self.policy, now)
        active_ids = {_finding_id(f) for f in found}
        wf.suppressed = [s for s in wf.suppressed if s in active_ids]  # cleared once: no longer overridden
        found = [
            f for f in found if _finding_id(f) not in wf.suppressed and f.seen_ns >= wf.cleared_before_ns
        ]
        keys = {f.key for f in found}
        for key in [k for k in self._first_seen if k[0] == snap.node and k not in keys]:
            del self._first_seen[key]
        for f in found:
            self._first_seen.setdefault(f.key, min(f.seen_ns or now, now))
        return found

    def first_seen_ns(self, f: Finding) -> int:
        """When this finding was first seen active (its persistence window's start)."""
        return self._first_seen.get(f.key, f.seen_ns)

    def _persisted(self, f: Finding, now: int) -> bool:
        return now - self._first_seen.get(f.key, now) >= f.window_s * 1e9

    # --- the state machine ---------------------------------------------------------------
    async def _reconcile(
        self,
        wf: Workflow,
        snap: NodeSnapshot | None,
        findings: list[Finding],
        seen: Observed | None,
        now: int,
    ) -> None:
        if seen is not None and self._person_acted(wf, seen, findings, now):
            return
        cordon = [f for f in findings if f.cordon]
        ready = [f for f in cordon if self._persisted(f, now)]
        notable = [f for f in findings if f.severity != "info" and self._persisted(f, now)]
        if wf.state in ("healthy", "suspect", "waiting"):
            if ready:
                await self._take_out(wf, ready, now)
            elif cordon:
                worst = cordon[0]
                left = worst.window_s - (now - self._first_seen[worst.key]) / 1e9
                self._move(wf, "suspect", f"{worst.code} must persist {left:.0f} s more before action")
            elif notable:
                self._incident(wf, notable, now)
                self._move(wf, "healthy", f"watching: {', '.join(f.code for f in notable)}")
            else:
                self._close(wf, "cleared by itself", now)
                self._move(wf, "healthy", "")
            # A node just cordoned drains from the next pass: every cordon due now goes out first.
            return
        if wf.incident_id and notable:
            self._incident(wf, notable, now)  # add what else was found while out of service
        if wf.state == "cordoned":
            if any(w.state == "draining" for w in self.workflows.values() if w.node != wf.node):
                wf.detail = "waiting for the drain slot (one drain at a time)"
                return
            self._audit(wf, "drain", "start moving workloads off", "ok", now)
            self._move(wf, "draining", "draining")
            await self._drain(wf, now)
        elif wf.state == "draining":
            await self._drain(wf, now)
        elif wf.state == "repairing":
            await self._repair(wf, snap, now)
        elif wf.state == "validating":
            await self._validate(wf, snap, cordon, seen, now)

    def _person_acted(self, wf: Workflow, seen: Observed, findings: list[Finding], now: int) -> bool:
        """React to what people did in the scheduler; True when nothing else is to be done."""
        if wf.state in AUTO_OUT and wf.cordoned_by_us:
            if not seen.cordoned:
                self._observed(wf, "uncordon", "a person returned the node to service outside gpufleet", now)
                self._cancel(wf, findings, "cancelled: a person uncordoned the node", now)
                return True
            if not seen.ours:
                self._observed(wf, "cordon", f"a person re-cordoned it: {seen.reason}", now)
                self._close(wf, f"taken over by a person: {seen.reason}", now)
                wf.cordoned_by_us = False
                self._move(wf, "human_cordoned", seen.reason)
                return True
            return False
        if wf.state == "human_cordoned":
            if not seen.cordoned:
                self._observed(wf, "uncordon", "a person returned the node to service", now)
                self._cancel(wf, findings, "", now)
                return True
            wf.detail = seen.reason
            return True
        if seen.cordoned and not seen.ours:
            self._observed(wf, "cordon", f"cordoned by a person: {seen.reason}", now)
            self._move(wf, "human_cordoned", seen.reason)
            return True
        return False

    async def _take_out(self, wf: Workflow, ready: list[Finding], now: int) -> None:
        incident = self._incident(wf, ready, now)
        if self.breaker_tripped:
            self._move(
                wf, "waiting", "automatic action halted: the breaker is tripped (`gpufleet breaker reset`)"
            )
            return
        if not any(node == wf.node for _, node in self._failures):
            self._failures.append((now, wf.node))
        self._failures = [(t, n) for t, n in self._failures if now - t <= self.rails.breaker_window_s * 1e9]
        self.state.put("failures", json.dumps(self._failures))
        # Nodes already failing when a person last reset the breaker were seen by that person:
        # only failures since then count towards tripping it again.
        failing = {n for t, n in self._failures if t > self._breaker_floor_ns}
        if len(failing) >= self.rails.breaker_nodes:
            self._trip(
                f"{len(failing)} nodes failed within {self.rails.breaker_window_s:g} s "
                f"(limit {self.rails.breaker_nodes}): {', '.join(sorted(failing))}",
                now,
            )
            self._move(
                wf, "waiting", "automatic action halted: the breaker is tripped (`gpufleet breaker reset`)"
            )
            return
        out, cap = self.out_of_service(), self.cap()
        if out >= cap:
            self._move(wf, "waiting", f"{out} nodes are out of service, the cap is {cap}")
            return
        worst = max(ready, key=lambda f: f.severity_rank)
        where = f" on GPU {worst.gpu}" if worst.gpu is not None else ""
        reason = f"{AUTOMATION_PREFIX} {worst.code}{where}: {worst.reason} [{incident.id}]"
        if self.rails.dry_run:
            if wf.detail != "dry-run: would cordon":
                self._audit(wf, "cordon", reason, "dry-run", now)
            self._move(wf, "waiting", "dry-run: would cordon")
            return
        try:
            await self.backend.cordon(wf.node, reason, automation=True)
        except BackendError as exc:
            self._audit(wf, "cordon", reason, f"failed: {exc}", now)
            self._move(wf, "waiting", f"cordon failed, retrying: {exc}")
            return
        self._audit(wf, "cordon", reason, "ok", now)
        wf.cordoned_by_us = True
        wf.ladder = list(worst.ladder)
        wf.step = 0
        wf.step_key = ""
        wf.gpus = sorted({f.gpu for f in ready if f.gpu is not None})
        days = self.policy.workflow["repeat_offender_days"]
        recent = self.state.incidents_since(wf.node, now - int(days * 86400e9))
        if recent >= self.policy.workflow["repeat_offender_incidents"]:
            self._audit(wf, "quarantine", f"repeat offender: {recent} incidents in {days:g} days", "ok", now)
            self._move(
                wf, "quarantined", f"repeat offender: {recent} incidents in {days:g} days; a person decides"
            )
            return
        self._move(wf, "cordoned", reason)

    async def _drain(self, wf: Workflow, now: int) -> None:
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
        self._audit(wf, "drain", progress.detail, "ok", now)
        self._move(wf, "repairing", "drained")
        await self._repair(wf, self._snapshot(wf.node), now)

    def _snapshot(self, node: str) -> NodeSnapshot | None:
        return next(iter(self._snapshots({node})), None)

    async def _repair(self, wf: Workflow, snap: NodeSnapshot | None, now: int) -> None:
        if wf.step >= len(wf.ladder):
            self._audit(wf, "quarantine", "every repair step was tried", "ok", now)
            self._move(wf, "quarantined", "repair steps exhausted; a person decides")
            return
        step = wf.ladder[wf.step]
        key = f"{wf.incident_id}:{wf.step}:{step}"
        outcome = self.state.action_outcome(key)
        if outcome is None:
            self._begin(wf, step, key, snap, now)
            return
        if outcome == "":
            self._check_running(wf, step, key, now)
            return
        if step == "ticket":
            self._move(wf, "quarantined", f"hardware ticket: {outcome[:200]}")
            return
        if not outcome.startswith("ok"):
            wf.step += 1
            wf.detail = f"{step} failed ({outcome[:200]}); next step"
            await self._repair(wf, snap, now)
            return
        if step == "reboot":
            if snap is not None and snap.boot_id != wf.boot_id_at_step and snap.connected:
                self._start_validation(wf, f"node came back after reboot (boot {snap.boot_id})", now)
            elif now - wf.step_started_ns > self.policy.workflow["reboot_timeout_s"] * 1e9:
                self._audit(wf, "reboot", "the collector did not come back", "failed: timeout", now)
                wf.step += 1
            else:
                wf.detail = "waiting for the node to come back from the reboot"
            return
        self._start_validation(wf, f"{step} done", now)

    def _begin(self, wf: Workflow, step: str, key: str, snap: NodeSnapshot | None, now: int) -> None:
        wf.step_key, wf.step_started_ns = key, now
        wf.boot_id_at_step = snap.boot_id if snap else ""
        if step == "reset_gpu":
            if not wf.gpus:
                self.state.begin_action(key)
                self.state.finish_action(key, "skipped: the finding is not about one GPU")
                return
            uuids = {i: g.uuid for i, g in (snap.gpus.items() if snap else [])}
            self.state.begin_action(key)  # before sending: a restart must not send it again
            pending = self._pending[key] = _Pending()
            for gpu in wf.gpus:
                command = ingest_pb2.Command(
                    id=f"{key}#{gpu}",
                    reason=f"gpufleet {wf.incident_id}",
                    reset_gpu=ingest_pb2.ResetGpu(gpu_index=gpu, gpu_uuid=uuids.get(gpu, "")),
                )
                sent = self._send_command(wf.node, command)
                pending.results[gpu] = None if sent else "failed: the node's collector is not connected"
            self._audit(wf, "reset_gpu", f"GPU(s) {', '.join(map(str, wf.gpus))}", "started", now)
            wf.detail = f"resetting GPU(s) {', '.join(map(str, wf.gpus))}"
            self._check_running(wf, step, key, now)
            return
        template = self.hooks.reboot_command if step == "reboot" else self.hooks.ticket_command
        self.state.begin_action(key)
        if not template:
            self.state.finish_action(key, f"skipped: no {step} command configured")
            self._audit(wf, step, f"no repair_{step}_command configured", "skipped", now)
            return
        incident = self.state.incident(wf.incident_id)
        summary = "; ".join(f"{f.code}: {f.evidence}" for f in (incident.findings if incident else []))[:500]
        self._audit(wf, step, summary or step, "started", now)
        wf.detail = f"{step} in progress"

        async def run() -> None:
            result = await run_hook(
                template,
                self.hooks.timeout_s,
                node=wf.node,
                reason=summary,
                incident=wf.incident_id,
                gpus=",".join(map(str, wf.gpus)),
            )
            outcome = ("ok" if result.ok else "failed") + (f": {result.detail}" if result.detail else "")
            self.state.finish_action(key, outcome)
            self._audit(wf, step, summary or step, outcome[:300], time.time_ns())
            self._hook_tasks.pop(key, None)
            self.poke(wf.node)

        self._hook_tasks[key] = asyncio.create_task(run())

    def _check_running(self, wf: Workflow, step: str, key: str, now: int) -> None:
        if key in self._hook_tasks:
            return  # the hook is still running
        pending = self._pending.get(key)
        if step != "reset_gpu" or pending is None:
            # Begun by an aggregator process that died before it learned the outcome. Not
            # repeated: validation will show whether it worked.
            self.state.finish_action(key, "ok: outcome unknown (the aggregator restarted); validating")
            self._audit(wf, step, "resumed after a restart; not repeated", "unknown", now)
            return
        results = pending.results
        if None in results.values():
            if now - wf.step_started_ns > self.policy.workflow["reset_timeout_s"] * 1e9:
                outcome = "failed: no answer from the collector in time"
            else:
                return
        else:
            failed = [f"GPU {g}: {r}" for g, r in results.items() if r != "ok"]
            outcome = f"failed: {'; '.join(failed)}" if failed else "ok"
        self.state.finish_action(key, outcome)
        self._audit(wf, "reset_gpu", f"GPU(s) {', '.join(map(str, wf.gpus))}", outcome[:300], now)
        self._pending.pop(key, None)

    def _start_validation(self, wf: Workflow, why: str, now: int) -> None:
        wf.validate_since_ns = now
        self._move(
            wf, "validating", f"{why}; waiting {self.policy.workflow['validate_s']:g} s for clean signals"
        )

    async def _validate(
        self, wf: Workflow, snap: NodeSnapshot | None, cordon: list[Finding], seen: Observed | None, now: int
    ) -> None:
        bad = [f for f in cordon if f.seen_ns >= wf.validate_since_ns]
        step = wf.ladder[wf.step] if wf.step < len(wf.ladder) else "repair"
        if bad:
            self._audit(
                wf,
                "validate",
                f"after {step}: {', '.join(f'{f.code} ({f.evidence})' for f in bad)}",
                "failed",
                now,
            )
            wf.step += 1
            self._move(wf, "repairing", f"{step} did not fix it: {bad[0].code}")
            return
        validate_ns = self.policy.workflow["validate_s"] * 1e9
        if snap is None or snap.liveness != vocabulary_pb2.LIVENESS_REPORTING:
            wf.detail = "waiting for the node's collector to report"
            return
        if now - wf.validate_since_ns < validate_ns or snap.sample_time_ns < wf.validate_since_ns:
            return
        if seen is not None and seen.cordoned and not seen.ours:
            return  # a person's cordon: _person_acted hands it over next pass
        try:
            await self.backend.uncordon(wf.node)
        except BackendError as exc:
            wf.detail = f"uncordon failed, retrying: {exc}"
            self._audit(wf, "uncordon", "validated clean", f"failed: {exc}", now)
            return
        self._audit(wf, "uncordon", f"clean for {validate_ns / 1e9:g} s after {step}", "ok", now)
        wf.cordoned_by_us = False
        self._close(wf, f"repaired by {step}", now)
        self._move(wf, "healthy", "")

    # --- incidents, audit, alerts ---------------------------------------------------------
    def _incident(self, wf: Workflow, findings: list[Finding], now: int) -> Incident:
        incident = self.state.incident(wf.incident_id) if wf.incident_id else None
        if incident is None or not incident.open:
            incident = self.state.open_incident(wf.node, findings, wf.state)
            wf.incident_id = incident.id
            log.warning(
                "incident %s opened: %s",
                incident.id,
                "; ".join(f"{f.code}: {f.evidence}" for f in findings),
                extra={"node": wf.node, "incident": incident.id},
            )
            self._alert(incident, "firing", wf)
            return incident
        known = {_finding_id(f) for f in incident.findings}
        new = [f for f in findings if _finding_id(f) not in known]
        if new:
            incident.findings += new
            self.state.put_incident(incident)
        return incident

    def _close(self, wf: Workflow, outcome: str, now: int) -> None:
        if not wf.incident_id:
            return
        wf.cleared_before_ns = now  # the XIDs behind this incident are dealt with
        incident = self.state.incident(wf.incident_id)
        wf.incident_id = ""
        wf.ladder, wf.step, wf.step_key, wf.gpus = [], 0, "", []
        if incident is None or not incident.open:
            return
        incident.closed_ns = now
        incident.outcome = outcome
        incident.state = "healthy" if not outcome.startswith("taken over") else "human_cordoned"
        self.state.put_incident(incident)
        log.warning(
            "incident %s closed: %s", incident.id, outcome, extra={"node": wf.node, "incident": incident.id}
        )
        self._alert(incident, "resolved", wf)

    def _cancel(self, wf: Workflow, findings: list[Finding], outcome: str, now: int) -> None:
        """A person returned the node to service: stop, and do not re-cordon for what they saw."""
        # Findings already overridden stay so (they are not in `findings`: filtered out).
        wf.suppressed = sorted(set(wf.suppressed) | {_finding_id(f) for f in findings})
        wf.cleared_before_ns = now
        wf.cordoned_by_us = False
        self._close(wf, outcome or "cancelled: a person returned the node to service", now)
        self._move(wf, "healthy", "")

    def _move(self, wf: Workflow, state: str, detail: str) -> None:
        wf.detail = detail
        if wf.state == state:
            return
        log.info("%s → %s %s", wf.state, state, detail, extra={"node": wf.node, "incident": wf.incident_id})
        wf.state = state
        incident = self.state.incident(wf.incident_id) if wf.incident_id else None
        if incident is not None and incident.open:
            incident.state = state
            incident.attempts = wf.step
            self.state.put_incident(incident)
            self._alert(incident, "firing", wf)

    def _alert(self, incident: Incident, status: str, wf: Workflow) -> None:
        worst = max(incident.findings, key=lambda f: f.severity_rank, default=None)
        summary = (
            incident.outcome
            if status == "resolved"
            else (
                f"{worst.code}"
                + (f" on GPU {worst.gpu}" if worst and worst.gpu is not None else "")
                + f": {worst.reason}"
                if worst
                else wf.detail
            )
        )
        self.alerts.notify(
            Alert(
                key=incident.id,
                status=status,
                node=incident.node,
                state=incident.state,
                severity=worst.severity if worst else "warning",
                summary=summary,
                time_ns=time.time_ns(),
                details={
                    "findings": [f.to_json() for f in incident.findings],
                    "detail": wf.detail,
                    "outcome": incident.outcome,
                },
            )
        )

    def _observed(self, wf: Workflow, action: str, reason: str, now: int) -> None:
        """Audit what a person did in the scheduler, as gpufleet saw it there."""
        self._audit(wf, action, reason, "observed", now, actor="scheduler")

    def _audit(
        self, wf: Workflow, action: str, reason: str, outcome: str, now: int, actor: str = AUTOMATION
    ) -> None:
        self.state.audit(AuditRecord(now, actor, wf.node, action, reason, outcome, wf.incident_id))
        log.warning(
            "%s %s by %s: %s (%s)",
            action,
            wf.node,
            actor,
            reason,
            outcome,
            extra={"node": wf.node, "incident": wf.incident_id, "action": action},
        )
        self._on_action(wf.node, action, outcome)

    # --- rails ------------------------------------------------------------------------
    def out_of_service(self) -> int:
        return sum(1 for w in self.workflows.values() if w.state in OUT_OF_SERVICE)

    def cap(self) -> int:
        by_fraction = math.floor(self.rails.max_out_of_service_fraction * self._fleet_size)
        return max(1, min(self.rails.max_out_of_service, by_fraction))

    def _trip(self, reason: str, now: int) -> None:
        self.breaker_tripped, self.breaker_reason, self.breaker_since_ns = True, reason, now
        self.state.put(
            "breaker",
            json.dumps(
                {"tripped": True, "reason": reason, "since_ns": now, "floor_ns": self._breaker_floor_ns}
            ),
        )
        self.state.audit(AuditRecord(now, AUTOMATION, "", "breaker_trip", reason, "ok", ""))
        log.error(
            "circuit breaker tripped: %s; all automatic action halted until `gpufleet breaker reset`", reason
        )
        self._on_action("", "breaker_trip", "ok")
        self.alerts.breaker(
            Alert("breaker", "firing", "", "tripped", "critical", f"repair breaker tripped: {reason}", now)
        )

    # --- manual actions (Fleet API) ----------------------------------------------------------
    async def cordon(self, node: str, reason: str, actor: str) -> Workflow:
        async with self._lock:
            wf = self._known(node)
            now = time.time_ns()
            text = f"gpufleet-manual [{actor}]: {reason}"
            try:
                await self.backend.cordon(node, text, automation=False)
            except BackendError as exc:
                self._audit(wf, "cordon", reason, f"failed: {exc}", now, actor=actor)
                raise RepairRefused("failed", f"cordon {node} failed: {exc}") from exc
            self._audit(wf, "cordon", reason, "ok", now, actor=actor)
            if wf.state in AUTO_OUT:
                self._close(wf, f"taken over by {actor}: {reason}", now)
            wf.cordoned_by_us = False
            self._move(wf, "human_cordoned", text)
            self._save(wf)
            return wf

    async def uncordon(self, node: str, reason: str, actor: str) -> Workflow:
        async with self._lock:
            wf = self._known(node)
            now = time.time_ns()
            try:
                await self.backend.uncordon(node)
            except BackendError as exc:
                self._audit(wf, "uncordon", reason, f"failed: {exc}", now, actor=actor)
                raise RepairRefused("failed", f"uncordon {node} failed: {exc}") from exc
            self._audit(wf, "uncordon", reason, "ok", now, actor=actor)
            self._cancel(wf, self.findings.get(node, []), f"cancelled by {actor}: {reason}", now)
            self._save(wf)
            return wf

    async def reset_breaker(self, reason: str, actor: str) -> None:
        async with self._lock:
            now = time.time_ns()
            was = self.breaker_reason
            self.breaker_tripped, self.breaker_reason, self.breaker_since_ns = False, "", 0
            self._breaker_floor_ns = now
            self.state.put("breaker", json.dumps({"tripped": False, "floor_ns": now}))
            self.state.audit(AuditRecord(now, actor, "", "breaker_reset", reason, "ok", ""))
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
