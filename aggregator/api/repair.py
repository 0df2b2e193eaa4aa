"""The Fleet API's repair: incidents, the audit log, repair status, a person's cordon and uncordon,
the breaker, a policy replay, and forwarding what only the repair leader does to it."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from gpufleet.aggregator.api.base import Refused, rpc
from gpufleet.aggregator.auth.tokens import Principal
from gpufleet.aggregator.fleet.replay_source import history_from_store
from gpufleet.aggregator.loop_thread import LoopClosed
from gpufleet.aggregator.store import StoreError
from gpufleet.common.net import is_loopback
from gpufleet.protos import fleet_pb2, fleet_pb2_grpc
from gpufleet.protos.names import health_value
from gpufleet.repair.controller import RepairController, RepairRefused
from gpufleet.repair.gpu_health import gpu_states
from gpufleet.repair.health import Health
from gpufleet.repair.policy import Policy, PolicyError, load_policy_text
from gpufleet.repair.replay.engine import replay
from gpufleet.repair.replay.report import compare, summarize
from gpufleet.repair.serving import ServingFloor
from gpufleet.repair.state import AuditRecord, Incident, RepairState, StateError, Workflow

log = logging.getLogger("gpufleet.aggregator.fleet")
T = TypeVar("T")

_TERM_LOAD_WAIT_S = 10.0  # how long a repair call waits for a new term to load its state
_FORWARDED = "x-gpufleet-forwarded-by"  # set on a repair call a replica passed to the leader


class RepairApi:
    @property
    def _repair(self) -> RepairController | None:
        """The repair controller running here: on one box always; with replicas, only on the
        leader (the other replicas forward repair actions to it: `_on_leader`). It runs on its
        term's thread (aggregator/repair_term.py): what is read of it here is its view as of
        now, and what changes it is sent to that thread (`_manual`)."""
        return self._wiring.controller if self._wiring else None

    def workflows(self) -> dict[str, Workflow]:
        """Every node's repair workflow as this replica knows it now (the leader's own; a
        follower's as last synced from the control plane)."""
        return self._workflows()

    def _workflows(self) -> dict[str, Workflow]:
        if self._repair is not None:
            return self._repair.workflows
        return self._shared.workflows if self._shared else {}

    def _serving_floor(self) -> ServingFloor:
        """The policy's serving floor (the shipped one where repair is not wired)."""
        return self._wiring.policy.serving if self._wiring is not None else ServingFloor()

    def _with_health(self, summary: fleet_pb2.NodeSummary) -> fleet_pb2.NodeSummary:
        wf = self._workflows().get(summary.node)
        summary.health = health_value(wf.state if wf else Health.HEALTHY)
        summary.health_detail = wf.detail if wf else ""
        # The findings live where the controller runs (one box, or the leading replica); another
        # replica has the shared workflow, so a GPU in an open incident still never reads "ok".
        findings = self._repair.findings.get(summary.node, []) if self._repair is not None else []
        summary.gpu_states.extend(gpu_states(summary.gpus, findings, wf))
        recent, lemon_at = self._recent_incidents()
        summary.recent_incidents = recent.get(summary.node, 0)
        summary.lemon = bool(lemon_at) and summary.recent_incidents >= lemon_at
        if self._shared is not None and not summary.replica:
            summary.replica = self._shared.replica
        if self._wiring is not None and self._wiring.config_backend != "none":
            scheduler_node = self._wiring.scheduler_names.to_scheduler(summary.node)
            summary.scheduler_node = scheduler_node if scheduler_node != summary.node else ""
        return summary

    def _recent_incidents(self) -> tuple[dict[str, int], int]:
        """Incidents per node within the policy's repeat_offender_days, and how many make a lemon
        node (0: repair is off), as last counted (`_count_recent_incidents`)."""
        return self._lemon_counts

    async def _count_recent_incidents(self) -> None:
        """Count the recent incidents again if the last count is over 5 s old: one query for the
        whole fleet, on a thread. One box: awaited (SQLite on this host). Replicas: in the
        background, the count as last read used meanwhile, so ListNodes never waits on
        PostgreSQL (docs/architecture.md "When the control plane hangs")."""
        now = time.monotonic()
        if now - self._lemon_read_at < 5.0:
            return
        self._lemon_read_at = now
        if self._wiring is None:
            self._lemon_counts = ({}, 0)
            return
        workflow = self._wiring.policy.workflow
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
            records = self._shared.reads if self._shared is not None else self._repair_records()
        except Refused:
            self._lemon_counts = ({}, lemon_at)
            return
        counting = asyncio.ensure_future(asyncio.to_thread(count, records))
        if self._shared is None:
            await counting
            return
        self._lemon_counting = counting
        self._lemon_counts = (self._lemon_counts[0], lemon_at)

    async def _read_records(self, read: Callable[[RepairState], T]) -> T:
        """Incidents and audit for the Fleet API, on a thread: with replicas, on the control
        plane's read connection (a hung PostgreSQL fails the call after its call timeout and
        holds nothing else); on one box, the controller's SQLite (whose transaction the
        term's thread may hold for an fsync)."""
        records = self._shared.reads if self._shared is not None else self._repair_records()
        try:
            return await asyncio.to_thread(read, records)
        except StateError as exc:
            raise Refused(grpc.StatusCode.UNAVAILABLE, f"the control plane: {exc}") from exc

    async def _controller(self) -> RepairController:
        """The controller, once its term has loaded its state (at a start or a new term: a
        moment; with the control plane down, until it answers)."""
        if self._wiring is None or self._wiring.term is None:
            raise Refused(grpc.StatusCode.UNIMPLEMENTED, "repair is not running in this aggregator")
        repair = await self._wiring.wait_controller(_TERM_LOAD_WAIT_S)
        if repair is None:
            raise Refused(
                grpc.StatusCode.UNAVAILABLE,
                f"the repair controller is still loading its state from "
                f"{self._wiring.term.state.describe()} "
                f"after {_TERM_LOAD_WAIT_S:g} s (the control plane is slow or down): try again shortly",
            )
        return repair

    def _repair_records(self) -> RepairState:
        """Incidents and audit: the running term's store, or (on a replica that does not lead)
        the shared store's, which hold the same."""
        term = self._wiring.term if self._wiring is not None else None
        if term is not None:
            return term.state
        if self._shared is not None:
            return self._shared.state
        raise Refused(grpc.StatusCode.UNIMPLEMENTED, "repair is not running in this aggregator")

    async def _on_leader(self, name: str, request: Any, context: grpc.aio.ServicerContext) -> Any | None:
        """On a replica that does not lead: the answer of the leader to the same call, with the
        caller's credentials (every replica shares the secrets file). None: this one leads."""
        if self._shared is None or (self._wiring is not None and self._wiring.term is not None):
            return None
        holder, address = self._shared.leader_address()
        if any(k == _FORWARDED for k, _ in context.invocation_metadata()):
            raise Refused(
                grpc.StatusCode.UNAVAILABLE,
                f"replica {self._shared.replica} was forwarded a repair call but is not the leader "
                f"(the lease is moving); try again in a few seconds",
            )
        if not address:
            raise Refused(
                grpc.StatusCode.UNAVAILABLE,
                f"no repair leader right now (the lease is "
                f"{self._shared.lease_info.describe() if self._shared.lease_info else 'unknown'}); "
                f"a replica takes it within leader_lease_s: try again in a few seconds",
            )
        if (
            self._tls_ca is None
            and not self._shared.allow_plaintext
            and not is_loopback(address.rpartition(":")[0])
        ):
            raise Refused(
                grpc.StatusCode.UNAVAILABLE,
                f"the repair leader {holder} is at {address}, another host, and this replica has no TLS: "
                "the caller's token is not sent there in clear (set tls_cert, or allow_plaintext)",
            )
        metadata = [(k, v) for k, v in context.invocation_metadata() if k == "authorization"]
        metadata.append((_FORWARDED, self._shared.replica))
        try:
            async with _channel(address, self._tls_ca, self._shared.tls_server_name) as channel:
                stub = fleet_pb2_grpc.FleetStub(channel)
                return await getattr(stub, name)(request, metadata=metadata, timeout=60)
        except grpc.aio.AioRpcError as exc:
            raise Refused(
                exc.code(), f"{exc.details()} (answered by the repair leader {holder} at {address})"
            ) from exc

    @rpc("viewer")
    async def ReplayPolicy(self, request: fleet_pb2.ReplayRequest, principal: Principal) -> Any:
        """A policy replay over this aggregator's store (docs/architecture.md "Policy replay"):
        read-only, one at a time, in a worker thread (its own event loop): ingest and the
        live controller go on meanwhile."""
        if self._wiring is None:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, "repair is not configured on this aggregator")
        now = time.time_ns()
        end = request.end_unix_ns or now
        max_days = self._wiring.replay_max_days
        if not 0 < request.start_unix_ns < end:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "give a start before the end (--since, --until)")
        if end - request.start_unix_ns > max_days * 86400e9:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"a replay reads at most {max_days:g} days of the store (replay_max_days); "
                f"this asks for {(end - request.start_unix_ns) / 86400e9:.1f}",
            )
        try:
            policies = [
                self._replay_policy(request.policy_toml, request.policy_name or "the request's policy")
            ]
            if request.compare:
                policies.append(
                    self._replay_policy(request.compare_toml, request.compare_name or "the compared policy")
                )
        except PolicyError as exc:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        if self._replay_lock.locked():
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, "a replay is running; try again when it ends")
        async with self._replay_lock:
            log.info("replaying %d policy(ies) over the store for %s", len(policies), principal.name)
            try:
                reports = await asyncio.to_thread(self._replay, request.start_unix_ns, end, policies)
            except StoreError as exc:
                raise Refused(grpc.StatusCode.UNAVAILABLE, f"cannot read the store's history: {exc}") from exc
        out = fleet_pb2.ReplayResponse(report_json=json.dumps(reports[0]))
        if len(reports) > 1:
            out.compare_json = json.dumps(reports[1])
            out.difference_json = json.dumps(compare(reports[0], reports[1]))
        return out

    def _replay_policy(self, text: str, name: str) -> Policy:
        assert self._wiring is not None
        return load_policy_text(text, name) if text.strip() else self._wiring.policy

    def _replay(self, start_ns: int, end_ns: int, policies: list[Policy]) -> list[dict[str, Any]]:
        assert self._wiring is not None
        history = history_from_store(self._store, start_ns, end_ns)
        return [summarize(replay(p, history, self._wiring.replay_config())) for p in policies]

    @rpc("viewer")
    async def ListIncidents(self, request: fleet_pb2.ListIncidentsRequest, principal: Principal) -> Any:
        def read(records: RepairState) -> list[fleet_pb2.Incident]:
            incidents = records.incidents(request.open_only, request.node, request.limit or 100)
            return [_incident_pb(i, records.audit_log(incident_id=i.id, limit=100)) for i in incidents]

        return fleet_pb2.ListIncidentsResponse(incidents=await self._read_records(read))

    @rpc("viewer")
    async def ListAudit(self, request: fleet_pb2.ListAuditRequest, principal: Principal) -> Any:
        entries = await self._read_records(lambda r: r.audit_log(request.node, request.limit or 200))
        return fleet_pb2.ListAuditResponse(entries=[_audit_pb(e) for e in entries])

    @rpc("viewer", forward=True)
    async def GetRepairStatus(self, request: fleet_pb2.RepairStatusRequest, principal: Principal) -> Any:
        return self._repair_status(await self._controller())

    def _repair_status(self, repair: RepairController) -> fleet_pb2.RepairStatus:
        nodes = []
        for name in sorted(repair.workflows):  # a copy: the term's thread may add a node
            wf = repair.workflows[name]  # never removed once added
            findings = repair.findings.get(name, [])
            if wf.state is Health.HEALTHY and not findings:
                continue
            nodes.append(
                fleet_pb2.NodeRepairState(
                    node=name,
                    state=health_value(wf.state),
                    incident_id=wf.incident_id,
                    detail=wf.detail,
                    findings=[f.to_proto(repair.first_seen_ns(f)) for f in findings],
                )
            )
        return fleet_pb2.RepairStatus(
            enabled=True,
            dry_run=repair.rails.dry_run,
            backend=repair.backend.name,
            breaker_tripped=repair.breaker_tripped,
            breaker_reason=repair.breaker_reason,
            breaker_tripped_unix_ns=repair.breaker_since_ns,
            out_of_service=repair.out_of_service(),
            out_of_service_cap=repair.cap(),
            nodes=nodes,
        )

    async def _manual(self, action: str, request: fleet_pb2.CordonRequest, principal: Principal) -> Any:
        repair = await self._controller()
        if not request.node:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{action} needs a node name")
        if not request.reason.strip():
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{action} {request.node} needs a reason (--reason TEXT): it goes in the audit log",
            )
        try:
            # On the term's thread: its store calls, its lock against a pass, its backend.
            wf = await self._wiring.on_term(
                getattr(repair, action)(request.node, request.reason.strip(), principal.name)
            )
        except (StateError, LoopClosed) as exc:  # fenced (no longer the leader) or the store is down
            raise Refused(grpc.StatusCode.UNAVAILABLE, f"{action} {request.node} not done: {exc}") from exc
        except RepairRefused as exc:
            code = {"not_found": grpc.StatusCode.NOT_FOUND, "invalid": grpc.StatusCode.INVALID_ARGUMENT}.get(
                exc.kind, grpc.StatusCode.FAILED_PRECONDITION
            )
            raise Refused(code, str(exc)) from exc
        return fleet_pb2.CordonResponse(state=health_value(wf.state), detail=wf.detail)

    @rpc("operator", forward=True)
    async def Cordon(self, request: fleet_pb2.CordonRequest, principal: Principal) -> Any:
        return await self._manual("cordon", request, principal)

    @rpc("operator", forward=True)
    async def Uncordon(self, request: fleet_pb2.CordonRequest, principal: Principal) -> Any:
        return await self._manual("uncordon", request, principal)

    @rpc("operator", forward=True)
    async def Proceed(self, request: fleet_pb2.CordonRequest, principal: Principal) -> Any:
        return await self._manual("proceed", request, principal)

    @rpc("operator", forward=True)
    async def ResetBreaker(self, request: fleet_pb2.ResetBreakerRequest, principal: Principal) -> Any:
        if not request.reason.strip():
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "breaker reset needs a reason (--reason TEXT)")
        repair = await self._controller()
        try:
            await self._wiring.on_term(repair.reset_breaker(request.reason.strip(), principal.name))
        except (StateError, LoopClosed) as exc:
            raise Refused(grpc.StatusCode.UNAVAILABLE, f"breaker reset not done: {exc}") from exc
        return self._repair_status(repair)


def _audit_pb(e: AuditRecord) -> fleet_pb2.AuditEntry:
    return fleet_pb2.AuditEntry(
        time_unix_ns=e.time_ns,
        actor=e.actor,
        node=e.node,
        action=e.action,
        reason=e.reason,
        outcome=str(e.outcome),
        incident_id=e.incident_id,
        status=e.outcome.status.value_pb,
    )


def _incident_pb(i: Incident, actions: list[AuditRecord]) -> fleet_pb2.Incident:
    return fleet_pb2.Incident(
        id=i.id,
        node=i.node,
        open=i.open,
        state=health_value(i.state),
        opened_unix_ns=i.opened_ns,
        closed_unix_ns=i.closed_ns,
        outcome=i.outcome,
        findings=[f.to_proto() for f in i.findings],
        actions=[_audit_pb(a) for a in actions],
        attempts=i.attempts,
    )


def _channel(address: str, tls_ca: bytes | None, server_name: str = "") -> grpc.aio.Channel:
    if tls_ca is not None:
        options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
        return grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(tls_ca), options=options)
    return grpc.aio.insecure_channel(address)
