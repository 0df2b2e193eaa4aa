"""The Fleet API's repair: incidents, the audit log, repair status, a person's cordon, uncordon and
proceed, the breaker, and a policy replay (what only the repair leader does is forwarded to it:
leader.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any

import grpc

from gpufleet.aggregator.api.base import Refused, RpcGate, UserNames, rpc
from gpufleet.aggregator.api.repair_view import RepairView
from gpufleet.aggregator.auth.tokens import Principal
from gpufleet.aggregator.fleet.replay_source import history_from_store
from gpufleet.aggregator.loop_thread import LoopClosed
from gpufleet.aggregator.store import Store, StoreError
from gpufleet.protos import fleet_pb2
from gpufleet.protos.names import health_value
from gpufleet.repair.controller import RepairController, RepairRefused
from gpufleet.repair.health import Health
from gpufleet.repair.policy import Policy, PolicyError, load_policy_text
from gpufleet.repair.replay.engine import replay
from gpufleet.repair.replay.report import compare, summarize
from gpufleet.repair.state import AuditRecord, Incident, RepairState, StateError

if TYPE_CHECKING:
    from gpufleet.aggregator.repair_wiring import RepairWiring

log = logging.getLogger("gpufleet.aggregator.fleet")


class RepairApi:
    """Incidents, the audit log, repair status, people's actions, the breaker, a policy replay."""

    def __init__(self, gate: RpcGate, view: RepairView, store: Store, show_user_names: bool = False) -> None:
        self._users = UserNames(show_user_names)
        self._gate = gate
        self._view = view
        self._store = store
        self._replay_lock = asyncio.Lock()

    @property
    def _wiring(self) -> RepairWiring | None:
        return self._view.wiring

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
            sees = self._users.sees(principal)
            return [_incident_pb(i, records.audit_log(incident_id=i.id, limit=100), sees) for i in incidents]

        incidents = await self._view.read_records(read)
        return fleet_pb2.ListIncidentsResponse(incidents=incidents, server_time_unix_ns=time.time_ns())

    @rpc("viewer")
    async def ListAudit(self, request: fleet_pb2.ListAuditRequest, principal: Principal) -> Any:
        entries = await self._view.read_records(lambda r: r.audit_log(request.node, request.limit or 200))
        return fleet_pb2.ListAuditResponse(
            entries=[_audit_pb(e) for e in entries], server_time_unix_ns=time.time_ns()
        )

    @rpc("viewer", forward=True)
    async def GetRepairStatus(self, request: fleet_pb2.RepairStatusRequest, principal: Principal) -> Any:
        return self._repair_status(await self._view.controller())

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
        repair = await self._view.controller()
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
        repair = await self._view.controller()
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


def _incident_workload_pb(w: dict[str, Any], sees_users: bool) -> fleet_pb2.IncidentWorkload:
    return fleet_pb2.IncidentWorkload(
        workload=str(w.get("workload", "")),
        name=str(w.get("name", "")),
        **UserNames.fields(str(w.get("user", "")), sees_users),
        account=str(w.get("account", "")),
        namespace=str(w.get("namespace", "")),
        team=str(w.get("team", "")),
        gpus=[int(g) for g in w.get("gpus", ())],
        hit=bool(w.get("hit")),
    )


def _incident_pb(i: Incident, actions: list[AuditRecord], sees_users: bool = False) -> fleet_pb2.Incident:
    return fleet_pb2.Incident(
        id=i.id,
        node=i.node,
        open=i.open,
        state=health_value(i.state),
        opened_unix_ns=i.opened_ns,
        closed_unix_ns=i.closed_ns,
        outcome=str(i.outcome or ""),
        findings=[f.to_proto() for f in i.findings],
        actions=[_audit_pb(a) for a in actions],
        attempts=i.attempts,
        workloads=[_incident_workload_pb(w, sees_users) for w in i.workloads],
    )
