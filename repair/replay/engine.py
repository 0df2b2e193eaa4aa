"""Run the real repair controller over a fault history on a virtual clock (docs/architecture.md
"Policy replay").

The same RepairController, Evaluator, rails, ladder, incident desk and action ledger the
aggregator runs, with: a virtual clock; backend "none" (gpufleet's own records are the
scheduler); a control-plane state in memory; no alert sinks; every rail on (breaker, cap,
one drain at a time). What the world does in answer is simulated here, and stated:

- a GPU reset answers after `reset_s`: it fails when the GPU is lost (fallen off the bus, as
  a real reset does), else succeeds and clears what a reset clears on that GPU (volatile ECC
  counts, a pending row remap or page retirement, a lost GPU, inactive links). Replaying the
  store's own history the recorded samples already hold what the live reset did, so nothing
  is cleared and the reset answers when the recorded GPU looks clean (or fails at
  reset_timeout_s, as the live one would have);
- a reboot (a configured reboot command) comes back after `reboot_s` with a new boot id and
  every GPU cleared; a ticket opens at once. Replaying the store, commands the aggregator has
  not configured are skipped, as live;
- a person returns a quarantined node after `technician_s` (the part replaced), and resets a
  tripped breaker after `breaker_reset_s` (0: never; a tripped breaker then holds every
  automatic step to the end of the replay, as it would live);
- serving pools (a trace's engine signals): each pool's demand, the sum of its replicas' traced
  readings, is spread over the replicas whose nodes serve now, as a router would spread it, so
  a replica leaving raises the others' KV-cache usage (at most 1: a full cache). The capacity
  guard reads these, and the replay measures each pool's time below its floor and the time each
  repair waited for capacity (`ReplayRun.serving`).

Passes run when an input arrives (as the health watch pokes the live controller at a report),
every `tick_s` for a node with a step under way, and at the times a finding's persistence
window or an XID's look-back ends; a step held by a rail is retried every `held_retry_s`.
Nothing else changes a node between them, so no pass is skipped that could have acted."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import threading
import time
from dataclasses import dataclass

from gpufleet.protos import ingest_pb2, vocabulary_pb2
from gpufleet.repair.alerts.dispatcher import AlertDispatcher
from gpufleet.repair.backends.none import NoBackend
from gpufleet.repair.controller import RepairController
from gpufleet.repair.health import OUT_OF_SERVICE, Health, HoldKind
from gpufleet.repair.model import NodeSnapshot
from gpufleet.repair.outcome import Status
from gpufleet.repair.policy import Policy
from gpufleet.repair.replay.history import FaultHistory, FaultInput
from gpufleet.repair.replay.serving import ReplayServing, ServingFigures
from gpufleet.repair.replay.world import ReplayConfig, SimulatedWorld
from gpufleet.repair.rules import TIME_DEPENDENT
from gpufleet.repair.state import RepairState
from gpufleet.repair.state_sqlite import sqlite_state
from gpufleet.repair.step_runner import Hooks

TECHNICIAN = "replay-technician"
OPERATOR = "replay-operator"


@dataclass
class ReplayRun:
    """What a replay did: its audit log and incidents are in `state` (in memory)."""

    history: FaultHistory
    policy: Policy
    config: ReplayConfig
    state: RepairState
    passes: int = 0
    wall_s: float = 0.0
    serving: ServingFigures | None = None  # None: the history has no engine readings


_quiet = threading.local()


class _ReplayLogFilter(logging.Filter):
    """Drops the repair library's log lines made by a replay (thousands of audit rows a second
    of virtual time), whatever thread it runs on; the live controller's lines are untouched."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(_quiet, "on", False)


_FILTER = _ReplayLogFilter()
for _name in ("gpufleet.repair", "gpufleet.repair.alerts"):
    logging.getLogger(_name).addFilter(_FILTER)


class ReplayEngine:
    def __init__(self, policy: Policy, history: FaultHistory, config: ReplayConfig | None = None) -> None:
        self.policy, self.history = policy, history
        self.config = config or ReplayConfig()
        self.now = history.start_ns
        self.state = sqlite_state(":memory:")
        self.state.migrate()
        self._heap: list[tuple[int, int, str, object]] = []
        self._order = itertools.count()
        self._wake_at: dict[str, int] = {}
        self._pending_resets: dict[str, tuple[str, int]] = {}  # command id -> (node, gpu)
        self._technician_due: set[str] = set()
        self._held: set[str] = set()  # nodes a rail holds back, woken when it may let go
        self._was: dict[str, Health] = {}  # each node's state after its last pass
        self._breaker_reset_due = False
        self._serving: ReplayServing | None = None  # with engine readings in the history
        # What the controller acts on: the nodes, their faults, and what its actions do to them.
        self.world = SimulatedWorld(policy, history, self.config, self._push, lambda: self.now)
        self._nodes = self.world.nodes
        hooks = (
            Hooks("replay-reboot {node}", "replay-ticket {node}", 600.0)
            if self.config.simulate_hooks
            else self.config.hooks
        )
        dispatcher = AlertDispatcher([], store=self.state.kept)
        self.controller = RepairController(
            policy,
            self.state,
            NoBackend(),
            self.config.rails,
            hooks,
            dispatcher,
            self._snapshots,
            self.world.send_command,
            serving=lambda: self._serving.replicas() if self._serving else [],
            liveness=dict,
            clock=lambda: self.now,
            hook_runner=self.world.run_hook,
        )
        self.controller.gate.fleet_size = len(history.nodes)
        if any(i.model for i in history.inputs):
            self._serving = ReplayServing(
                policy.serving, self._nodes, self.controller.workflows, lambda: self.now
            )

    # --- what the controller sees ------------------------------------------------------------
    def _snapshots(self, only: set[str] | None) -> list[NodeSnapshot]:
        names = self._nodes if only is None else [n for n in only if n in self._nodes]
        out = []
        for name in names:
            node = self._nodes[name]
            silent_s = (self.now - node.silent_since_ns) / 1e9 if not node.reporting else 0.0
            out.append(
                NodeSnapshot(
                    node=name,
                    cluster="replay",
                    liveness=vocabulary_pb2.LIVENESS_REPORTING
                    if node.reporting
                    else vocabulary_pb2.LIVENESS_SILENT,
                    seconds_since_report=silent_s,
                    boot_id=f"boot-{node.boot}",
                    connected=node.reporting,
                    gpu_count=len(node.gpus) if node.nvml_gpus is None else node.nvml_gpus,
                    gpus=dict(node.gpus),
                    events=list(node.events),
                    sample_time_ns=self.now if node.reporting else node.silent_since_ns,
                    gpus_on_pci_bus=node.on_pci_bus,
                )
            )
        return out

    # --- the timeline ------------------------------------------------------------------------
    def _push(self, at_ns: int, kind: str, payload: object) -> None:
        heapq.heappush(self._heap, (at_ns, next(self._order), kind, payload))

    def _wake(self, node: str, at_ns: int) -> None:
        if at_ns <= self.now:
            at_ns = self.now + 1
        current = self._wake_at.get(node)
        if current is not None and self.now < current <= at_ns:
            return
        self._wake_at[node] = at_ns
        self._push(at_ns, "wake", node)

    def _release_held(self, only: HoldKind | None = None) -> None:
        """A rail may let go: every held node (or those `only` that rail holds) is looked at
        once more, now."""
        for node in sorted(self._held):
            wf = self.controller.workflows.get(node)
            if only is not None and (wf is None or wf.held is None or wf.held.kind is not only):
                continue
            self._held.discard(node)
            self._wake_at.pop(node, None)
            self._wake(node, self.now + 1)

    def _next_wake(self, name: str) -> int | None:
        """When this node next needs a pass with no new input (None: not until one comes)."""
        c = self.controller
        wf = c.workflows.get(name)
        state = wf.state if wf else Health.HEALTHY
        if state in (Health.QUARANTINED, Health.HUMAN_CORDONED):
            return None
        if wf is not None and wf.held:
            # Held by a rail: the cap and the drain slot let go when another node comes back
            # or moves on, the breaker when a person resets it; each wakes every held node
            # (`_after_pass`). Dry-run holds for good. The retry is a backstop.
            self._held.add(name)
            return self.now + int(self.config.held_retry_s * 1e9)
        tick = self.now + int(self.config.tick_s * 1e9)
        if state == Health.VALIDATING and wf is not None:
            # Clean signals must last validate_s: nothing to decide before (an input that
            # fails validation is its own pass).
            return max(tick, wf.validate_since_ns + int(self.policy.workflow["validate_s"] * 1e9))
        if state == Health.REPAIRING and wf is not None and wf.step_key and wf.step < len(wf.ladder):
            # A step under way ends with its answer (a reset's result, a reboot's return: each
            # is its own pass) or its timeout, which is all time alone can bring. Once its
            # outcome is recorded, the next tick moves on (as the live controller's does), but
            # a reboot that went ahead waits for the node to come back (an answer too).
            step = wf.ladder[wf.step]
            outcome = self.state.action_outcome(wf.step_key)
            if outcome is None or outcome.status is Status.STARTED or (step == "reboot" and outcome.ok):
                timeout_s = self.policy.workflow[
                    "reboot_timeout_s" if step == "reboot" else "reset_timeout_s"
                ]
                return max(tick, wf.step_started_ns + int(timeout_s * 1e9) + 1)
        if state not in (Health.HEALTHY, Health.SUSPECT):
            return tick
        times = self._finding_times(name) + _window_times(self.controller, self.policy, name, self.now)
        return min(times) if times else None

    def _finding_times(self, name: str) -> list[int]:
        """When the node's findings change with time alone: a window met, an XID out of the
        look-back, a rate to look at again."""
        c = self.controller
        times = []
        lookback_ns = int(self.policy.workflow["xid_lookback_s"] * 1e9)
        for f in c.findings.get(name, []):
            if f.window_s and not c.evaluator.persisted(f, self.now):
                times.append(c.first_seen_ns(f) + int(f.window_s * 1e9))
            if f.code.startswith("xid_"):
                times.append(f.seen_ns + lookback_ns + 1)  # it leaves the look-back: cleared
            elif f.code in TIME_DEPENDENT:
                # A rate falls as time passes with the counter still: looked at again, as the
                # live controller's full passes do.
                times.append(self.now + int(max(self.config.tick_s, f.window_s / 4) * 1e9))
        return times

    async def run(self) -> ReplayRun:
        started = time.perf_counter()
        _quiet.on = True
        try:
            for i in self.history.inputs:
                self._push(i.time_ns, "input", i)
            passes = 0
            while self._heap:
                at = self._heap[0][0]
                if at > self.history.end_ns:
                    break
                if self._serving:
                    self._serving.until(at)
                self.now = at
                dirty: set[str] = set()
                while self._heap and self._heap[0][0] == at:
                    await self._handle(*heapq.heappop(self._heap)[2:], dirty)
                for _ in range(8):  # a step's answer pokes its node: passes until all is quiet
                    dirty |= self.controller.take_poked()
                    if not dirty:
                        break
                    await self.controller.pass_once(dirty)
                    passes += 1
                    await self.controller.steps.settle()
                    for name in dirty:
                        self._after_pass(name)
                    dirty = set()
                if self._serving:
                    self._serving.look()
            self.now = max(self.now, self.history.end_ns)
            if self._serving:
                self._serving.until(self.now)
                self._serving.end()
        finally:
            _quiet.on = False
        return ReplayRun(
            self.history,
            self.policy,
            self.config,
            self.state,
            passes,
            time.perf_counter() - started,
            self._serving.figures if self._serving else None,
        )

    async def _handle(self, kind: str, payload: object, dirty: set[str]) -> None:
        """One timed input or simulated answer, its node marked for a pass where it changed one."""
        handler = {
            "input": self._on_input,
            "wake": self._on_wake,
            "reset": self._on_reset,
            "rebooted": self._on_rebooted,
            "technician": self._on_technician,
            "breaker_reset": self._on_breaker_reset,
        }[kind]
        await handler(payload, dirty)

    async def _on_input(self, payload: object, dirty: set[str]) -> None:
        assert isinstance(payload, FaultInput)
        if payload.model:
            # A pool's pressure moved: a drain waiting for capacity is looked at again now.
            self.world.apply(payload)
            self._release_held(HoldKind.CAPACITY)
        elif payload.visible:
            self.world.apply(payload)
            dirty.add(payload.node)

    async def _on_wake(self, payload: object, dirty: set[str]) -> None:
        assert isinstance(payload, str)
        if self._wake_at.get(payload) == self.now:
            del self._wake_at[payload]
            dirty.add(payload)

    async def _on_reset(self, payload: object, dirty: set[str]) -> None:
        node, command_id, gpu, ok, detail = payload  # type: ignore[misc]
        if ok and not self.config.from_store:
            self.world.clear(self.world.node(node), [gpu])
        outcome = vocabulary_pb2.COMMAND_OUTCOME_SUCCEEDED if ok else vocabulary_pb2.COMMAND_OUTCOME_FAILED
        self.controller.on_command_result(
            node, ingest_pb2.CommandResult(id=command_id, outcome=outcome, detail=detail)
        )
        dirty.add(node)

    async def _on_rebooted(self, payload: object, dirty: set[str]) -> None:
        assert isinstance(payload, str)
        sim = self.world.node(payload)
        sim.boot += 1
        if not self.config.from_store:
            self.world.clear(sim, list(sim.gpus), reboot=True)
            sim.reporting = True
        dirty.add(payload)

    async def _on_technician(self, payload: object, dirty: set[str]) -> None:
        assert isinstance(payload, str)
        self._technician_due.discard(payload)
        wf = self.controller.workflows.get(payload)
        if wf is not None and wf.state == Health.QUARANTINED:
            sim = self.world.node(payload)
            if not self.config.from_store:
                self.world.clear(sim, list(sim.gpus), reboot=True)  # the part was replaced
                for gpu in sim.gpus.values():
                    gpu.remap_failure = False
            await self.controller.uncordon(payload, "replay: repaired by a technician", TECHNICIAN)
            dirty.add(payload)

    async def _on_breaker_reset(self, payload: object, dirty: set[str]) -> None:
        self._breaker_reset_due = False
        if self.controller.breaker_tripped:
            await self.controller.reset_breaker("replay: a person looked and reset it", OPERATOR)
            self.controller.take_poked()  # the held nodes are what it lets go
            self._release_held()

    def _after_pass(self, name: str) -> None:
        self._held.discard(name)
        if self._serving:
            self._serving.track_wait(name)
        wake = self._next_wake(name)
        if wake is not None:
            self._wake(name, wake)
        wf = self.controller.workflows.get(name)
        state = wf.state if wf else Health.HEALTHY
        was = self._was.get(name, Health.HEALTHY)
        self._was[name] = state
        if was != state and was in (*OUT_OF_SERVICE, Health.DRAINING) and self._held:
            self._release_held()
        cfg = self.config
        if (
            wf is not None
            and wf.state == Health.QUARANTINED
            and cfg.technician_s
            and name not in self._technician_due
        ):
            self._technician_due.add(name)
            self._push(self.now + int(cfg.technician_s * 1e9), "technician", name)
        if self.controller.breaker_tripped and cfg.breaker_reset_s and not self._breaker_reset_due:
            self._breaker_reset_due = True
            self._push(self.now + int(cfg.breaker_reset_s * 1e9), "breaker_reset", None)


def replay(policy: Policy, history: FaultHistory, config: ReplayConfig | None = None) -> ReplayRun:
    """Run a replay to its end (blocking: its own event loop; call from a thread in a server)."""
    return asyncio.run(ReplayEngine(policy, history, config).run())


def _window_times(controller: RepairController, policy: Policy, node: str, now: int) -> list[int]:
    """When a window a rule is filling for the node will be whole (repair/rules/windows.py)."""
    times = []
    for rule_name, rule in controller.evaluator.rules.items():
        entry = policy.rules.get(rule_name)
        whole_at = rule.look_again_at_ns(node, entry) if entry is not None else None
        if whole_at is not None:
            times.append(max(whole_at, now + 1))
    return times
