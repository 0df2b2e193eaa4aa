"""What the Fleet API knows of repair, for every RPC group: each node's workflow and its GPUs'
states (a GPU in an open incident never reads "ok"), the serving floor, the recent incidents that
make a lemon node, the incident and audit records, and the controller once its term has loaded."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import grpc

from gpufleet.aggregator.api.base import Refused
from gpufleet.protos import fleet_pb2, vocabulary_pb2
from gpufleet.protos.names import health_value
from gpufleet.repair.controller import RepairController
from gpufleet.repair.gpu_health import gpu_states
from gpufleet.repair.health import Health
from gpufleet.repair.policy import Policy, load_policy
from gpufleet.repair.serving import ReplicaReading, ServingFloor
from gpufleet.repair.state import RepairState, StateError, Workflow

if TYPE_CHECKING:
    from gpufleet.aggregator.repair_wiring import RepairWiring
    from gpufleet.aggregator.replication.control_plane import ControlPlane

log = logging.getLogger("gpufleet.aggregator.fleet")
T = TypeVar("T")

_TERM_LOAD_WAIT_S = 10.0  # how long a repair call waits for a new term to load its state


class RepairView:
    def __init__(self, wiring: RepairWiring | None, shared: ControlPlane | None) -> None:
        self.wiring = wiring
        self._shipped: Policy | None = None  # the shipped policy, read once where repair is not wired
        self._shared = shared
        self._lemon_counts: tuple[dict[str, int], int] = ({}, 0)
        self._lemon_read_at = -1e9
        self._lemon_counting: asyncio.Future[None] | None = None  # the replicas' count in flight

    @property
    def repair(self) -> RepairController | None:
        """The repair controller running here: on one box always; with replicas, only on the
        leader (the other replicas forward repair actions to it: leader.py). It runs on its
        term's thread (aggregator/repair_term.py): what is read of it here is its view as of
        now, and what changes it is sent to that thread (RepairApi `_manual`)."""
        return self.wiring.controller if self.wiring else None

    def workflows(self) -> dict[str, Workflow]:
        """Every node's repair workflow as this replica knows it now (the leader's own; a
        follower's as last synced from the control plane)."""
        if self.repair is not None:
            return self.repair.workflows
        return self._shared.workflows if self._shared else {}

    def policy(self) -> Policy:
        """The repair policy (the shipped one where repair is not wired)."""
        if self.wiring is not None:
            return self.wiring.policy
        if self._shipped is None:
            self._shipped = load_policy(None)
        return self._shipped

    def serving_floor(self) -> ServingFloor:
        return self.policy().serving

    def serving_readings(self, gpu_util: bool = True) -> list[ReplicaReading]:
        """Every engine replica, placed in the declared pools (none where repair is not wired:
        nothing places them)."""
        return self.wiring.serving(gpu_util) if self.wiring is not None else []

    def with_health(self, summary: fleet_pb2.NodeSummary) -> fleet_pb2.NodeSummary:
        wf = self.workflows().get(summary.node)
        state = wf.state if wf else Health.HEALTHY
        # Healthy is a judgement of reports: a node none of whose reports was accepted yet (its
        # collector just connected, or everything it sends is refused) has nothing to judge.
        no_data = state == Health.HEALTHY and not summary.last_report_unix_ns
        summary.health = vocabulary_pb2.NODE_HEALTH_NO_DATA if no_data else health_value(state)
        summary.health_detail = wf.detail if wf else ""
        # The findings live where the controller runs (one box, or the leading replica); another
        # replica has the shared workflow, so a GPU in an open incident still never reads "ok".
        findings = self.repair.findings.get(summary.node, []) if self.repair is not None else []
        summary.gpu_states.extend(gpu_states(summary.gpus, findings, wf))
        recent, lemon_at = self.recent_incidents()
        summary.recent_incidents = recent.get(summary.node, 0)
        summary.lemon = bool(lemon_at) and summary.recent_incidents >= lemon_at
        if self._shared is not None and not summary.replica:
            summary.replica = self._shared.replica
        if self.wiring is not None and self.wiring.config_backend != "none":
            scheduler_node = self.wiring.scheduler_names.to_scheduler(summary.node)
            summary.scheduler_node = scheduler_node if scheduler_node != summary.node else ""
        return summary

    def recent_incidents(self) -> tuple[dict[str, int], int]:
        """Incidents per node within the policy's repeat_offender_days, and how many make a lemon
        node (0: repair is off), as last counted (`count_recent_incidents`)."""
        return self._lemon_counts

    async def count_recent_incidents(self) -> None:
        """Count the recent incidents again if the last count is over 5 s old: one query for the
        whole fleet, on a thread. One box: awaited (SQLite on this host). Replicas: in the
        background, the count as last read used meanwhile, so ListNodes never waits on
        PostgreSQL (docs/architecture.md "When the control plane hangs")."""
        now = time.monotonic()
        if now - self._lemon_read_at < 5.0:
            return
        self._lemon_read_at = now
        if self.wiring is None:
            self._lemon_counts = ({}, 0)
            return
        workflow = self.wiring.policy.workflow
        since = time.time_ns() - int(workflow["repeat_offender_days"] * 86400e9)
        lemon_at = int(workflow["repeat_offender_incidents"])

        def count(records: RepairState) -> None:
            try:
                counts = records.incident_counts_since(since)
            except StateError as exc:
                log.warning("cannot count recent incidents for the lemon-node flag: %s", exc)
                counts = {}
            self._lemon_counts = (counts, lemon_at)

        try:
            records = self._shared.reads if self._shared is not None else self.repair_records()
        except Refused:
            self._lemon_counts = ({}, lemon_at)
            return
        counting = asyncio.ensure_future(asyncio.to_thread(count, records))
        if self._shared is None:
            await counting
            return
        self._lemon_counting = counting
        self._lemon_counts = (self._lemon_counts[0], lemon_at)

    async def read_records(self, read: Callable[[RepairState], T]) -> T:
        """Incidents and audit for the Fleet API, on a thread: with replicas, on the control
        plane's read connection (a hung PostgreSQL fails the call after its call timeout and
        holds nothing else); on one box, the controller's SQLite (whose transaction the
        term's thread may hold for an fsync)."""
        records = self._shared.reads if self._shared is not None else self.repair_records()
        try:
            return await asyncio.to_thread(read, records)
        except StateError as exc:
            raise Refused(grpc.StatusCode.UNAVAILABLE, f"the control plane: {exc}") from exc

    async def controller(self) -> RepairController:
        """The controller, once its term has loaded its state (at a start or a new term: a
        moment; with the control plane down, until it answers)."""
        if self.wiring is None or self.wiring.term is None:
            raise Refused(grpc.StatusCode.UNIMPLEMENTED, "repair is not running in this aggregator")
        repair = await self.wiring.wait_controller(_TERM_LOAD_WAIT_S)
        if repair is None:
            raise Refused(
                grpc.StatusCode.UNAVAILABLE,
                f"the repair controller is still loading its state from "
                f"{self.wiring.term.state.describe()} "
                f"after {_TERM_LOAD_WAIT_S:g} s (the control plane is slow or down): try again shortly",
            )
        return repair

    def repair_records(self) -> RepairState:
        """Incidents and audit: the running term's store, or (on a replica that does not lead)
        the shared store's, which hold the same."""
        term = self.wiring.term if self.wiring is not None else None
        if term is not None:
            return term.state
        if self._shared is not None:
            return self._shared.state
        raise Refused(grpc.StatusCode.UNIMPLEMENTED, "repair is not running in this aggregator")
