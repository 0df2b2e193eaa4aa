"""The Fleet API: the only way the dashboard and the CLI see the fleet."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from gpufleet.aggregator.auth.tokens import Authenticator, AuthError, Principal, bearer
from gpufleet.aggregator.fleet.events import DEFAULT_EVENTS, EVENT_KINDS, MAX_EVENTS, EventQuery, read_events
from gpufleet.aggregator.fleet.replay_source import history_from_store
from gpufleet.aggregator.fleet.rollups import read_as_stored, route
from gpufleet.aggregator.fleet.state import FleetState
from gpufleet.aggregator.ingest.schema import METRICS, TAGS
from gpufleet.aggregator.metrics import AggregatorMetrics
from gpufleet.aggregator.store import HistoryQuery, Store, StoreError
from gpufleet.common.net import is_loopback
from gpufleet.common.redact import redact
from gpufleet.protos import fleet_pb2, fleet_pb2_grpc
from gpufleet.protos.credentials import TOKEN_ID_RE
from gpufleet.protos.names import aggregate_name, health_value
from gpufleet.repair.controller import RepairController, RepairRefused
from gpufleet.repair.health import Health
from gpufleet.repair.policy import Policy, PolicyError, load_policy_text
from gpufleet.repair.replay.engine import replay
from gpufleet.repair.replay.report import compare, summarize
from gpufleet.repair.state import AuditRecord, Incident, RepairState, StateError, Workflow

if TYPE_CHECKING:
    from gpufleet.aggregator.repair_wiring import RepairWiring
    from gpufleet.aggregator.replication.control_plane import ControlPlane

log = logging.getLogger("gpufleet.aggregator.fleet")

MAX_BUCKETS = 20_000
_FORWARDED = "x-gpufleet-forwarded-by"  # set on a repair call a replica passed to the leader
NODES_PAGE = 500  # ListNodes: nodes a page by default
NODES_PAGE_MAX = 2000
NODES_PAGE_BYTES = 3 << 20  # ... and a page stops once it is this big (a client takes 4 MiB)


def _channel(address: str, tls_ca: bytes | None, server_name: str = "") -> grpc.aio.Channel:
    if tls_ca is not None:
        options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
        return grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(tls_ca), options=options)
    return grpc.aio.insecure_channel(address)


_NICE_STEPS_S = [1, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400]


def default_step_ns(span_ns: int, target_buckets: int = 300) -> int:
    """The smallest 'round' step that gives at most about target_buckets buckets."""
    want_s = span_ns / target_buckets / 1e9
    for step in _NICE_STEPS_S:
        if step >= want_s:
            return step * 1_000_000_000
    return int(want_s) * 1_000_000_000


def _time_range(start_ns: int, end_ns: int, default_span_s: int) -> tuple[int, int]:
    """A history range from a request: end 0 is now, start 0 is default_span_s before the end.
    Refused unless 0 <= start < end (times are nanoseconds since 1970: a negative one, which
    the wire allows, would also take the default start past what a store's integers hold)."""
    end = end_ns or time.time_ns()
    start = start_ns or end - default_span_s * 1_000_000_000
    if not 0 <= start < end:
        raise _Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"start ({start}) must be before end ({end}), both nanoseconds since 1970, not before it",
        )
    return start, end


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _rpc(
    role: str, forward: bool = False
) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """Authenticate, require role, count and log; turn _Refused into its gRPC status. forward:
    on a replica that is not the repair leader, the leader answers (`_on_leader`)."""

    def wrap(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def method(self: FleetService, request: Any, context: grpc.aio.ServicerContext) -> Any:
            name = fn.__name__
            try:
                principal = self._authorize(context, role)
                result = await self._on_leader(name, request, context) if forward else None
                if result is None:
                    result = await fn(self, request, principal)
            except _Refused as r:
                self._metrics.fleet_requests.labels(method=name, code=r.code.name).inc()
                message = redact(r.message)  # a store's URL or DSN never reaches a client with its password
                log.info("fleet %s refused: %s", name, message, extra={"code": r.code.name})
                await context.abort(r.code, message)
            self._metrics.fleet_requests.labels(method=name, code="OK").inc()
            return result

        method.__name__ = fn.__name__
        return method

    return wrap


class FleetService(fleet_pb2_grpc.FleetServicer):
    def __init__(
        self,
        auth: Authenticator,
        fleet: FleetState,
        store: Store,
        metrics: AggregatorMetrics,
        status: Callable[[], fleet_pb2.AggregatorStatus] | None = None,
        repair: RepairWiring | None = None,
        shared: ControlPlane | None = None,
    ) -> None:
        self._wiring = repair
        self._shared = shared
        self._auth = auth
        self._fleet = fleet
        self._store = store
        self._metrics = metrics
        self._status = status or fleet_pb2.AggregatorStatus
        self._replay_lock = asyncio.Lock()
        self._lemon_counts: tuple[dict[str, int], int] = ({}, 0)
        self._lemon_read_at = -1e9
        # Replicas serve with TLS when configured: the leader is dialled trusting the same
        # certificate (one certificate for every replica, or a chain its file completes).
        self._tls_ca: bytes | None = None
        if shared is not None and shared.tls_cert:
            self._tls_ca = Path(shared.tls_cert).read_bytes()

    def _authorize(self, context: grpc.aio.ServicerContext, role: str) -> Principal:
        try:
            principal = self._auth.check_fleet(bearer(context.invocation_metadata()))
        except AuthError as exc:
            raise _Refused(grpc.StatusCode.UNAUTHENTICATED, str(exc)) from exc
        if not principal.has_role(role):
            raise _Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"token {principal.name!r} has role {principal.role}; this needs {role}",
            )
        return principal

    @_rpc("viewer")
    async def WhoAmI(self, request: fleet_pb2.WhoAmIRequest, principal: Principal) -> Any:
        return fleet_pb2.WhoAmIResponse(name=principal.name, role=principal.role)

    @_rpc("viewer")
    async def ListNodes(self, request: fleet_pb2.ListNodesRequest, principal: Principal) -> Any:
        """The fleet a page at a time, in name order (docs/security.md "Bounded per-node
        state"): at most page_size nodes and about NODES_PAGE_BYTES, so no fleet and no node's
        reports can make the answer bigger than a client takes. A GPU's process list is left
        out here (GetNode has it)."""
        if request.page_size > NODES_PAGE_MAX:
            raise _Refused(
                grpc.StatusCode.INVALID_ARGUMENT, f"page_size {request.page_size} is over {NODES_PAGE_MAX}"
            )
        limit = request.page_size or NODES_PAGE
        now = time.time_ns()
        clusters = set(request.clusters)
        wanted = set(request.liveness)
        nodes: list[fleet_pb2.NodeSummary] = []
        total, size, next_token = 0, 0, ""
        for name in sorted(self._fleet.nodes):
            live = self._fleet.nodes[name]
            if clusters and live.cluster not in clusters:
                continue
            if wanted and self._fleet.liveness(live, now) not in wanted:
                continue
            total += 1
            if name <= request.page_token or next_token:
                continue
            if len(nodes) >= limit or (nodes and size >= NODES_PAGE_BYTES):
                next_token = nodes[-1].node
                continue
            summary = self._with_health(self._viewer_summary(self._fleet.summary(live, now)))
            size += summary.ByteSize()
            nodes.append(summary)
        return fleet_pb2.ListNodesResponse(
            nodes=nodes, server_time_unix_ns=now, next_page_token=next_token, total_nodes=total
        )

    @staticmethod
    def _viewer_summary(summary: fleet_pb2.NodeSummary, processes: bool = False) -> fleet_pb2.NodeSummary:
        """What a viewer sees of a node: its collector's boot id only as a digest (the id is
        what a stream of this node presents: docs/security.md "Masking faults")."""
        if summary.boot_id:
            summary.boot_id = "b-" + hashlib.sha256(summary.boot_id.encode()).hexdigest()[:12]
        if not processes:
            for gpu in summary.gpus:
                gpu.ClearField("processes")
        return summary

    @_rpc("viewer")
    async def GetNode(self, request: fleet_pb2.GetNodeRequest, principal: Principal) -> Any:
        live = self._fleet.nodes.get(request.node)
        if live is None:
            raise _Refused(
                grpc.StatusCode.NOT_FOUND,
                f"node {request.node!r} is not known to this aggregator "
                f"({len(self._fleet.nodes)} nodes are); `gpufleet nodes` lists them",
            )
        detail = self._fleet.detail(live)
        self._with_health(self._viewer_summary(detail.summary, processes=True))
        return detail

    @_rpc("viewer")
    async def GetStatus(self, request: fleet_pb2.StatusRequest, principal: Principal) -> Any:
        return self._status()

    @_rpc("viewer")
    async def ListMetrics(self, request: fleet_pb2.ListMetricsRequest, principal: Principal) -> Any:
        return fleet_pb2.ListMetricsResponse(
            metrics=[
                fleet_pb2.MetricInfo(name=m.name, measurement=m.measurement, unit=m.unit, help=m.help)
                for m in METRICS.values()
            ]
        )

    @_rpc("viewer")
    async def QueryHistory(self, request: fleet_pb2.HistoryRequest, principal: Principal) -> Any:
        metric = METRICS.get(request.metric)
        if metric is None:
            raise _Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"unknown metric {request.metric!r}; known metrics: "
                f"{', '.join(METRICS)} (`gpufleet metrics` describes them)",
            )
        if request.aggregate not in fleet_pb2.Aggregate.values():
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"unknown aggregate {request.aggregate}")
        start, end = _time_range(request.start_unix_ns, request.end_unix_ns, 3600)
        step = request.step_ns or default_step_ns(end - start)
        if step < 0:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"step {step} ns must be positive")
        if (end - start) / step > MAX_BUCKETS:
            raise _Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{(end - start) / 1e9:.0f} s at a {step / 1e9:g} s step is "
                f"{(end - start) // step} buckets; the limit is {MAX_BUCKETS}. "
                "Use a larger step.",
            )
        filters = {
            "node": list(request.nodes),
            "gpu": [str(g) for g in request.gpus],
            "cluster": list(request.clusters),
            "engine": list(request.engines),
            "model": list(request.models),
        }
        wanted = {k: v for k, v in filters.items() if v}
        group_by = tuple(dict.fromkeys(request.group_by))  # in the order asked, once each
        tags = TAGS[metric.measurement]
        unknown = [t for t in group_by if t not in tags]
        if unknown:
            raise _Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"cannot group {metric.name} by {', '.join(map(repr, unknown))}: "
                f"{metric.measurement} series have the tags {', '.join(tags)}",
            )
        aggregate = aggregate_name(request.aggregate)
        measurement, field = route(metric.measurement, metric.name, aggregate, start, end, step)
        try:
            series = await asyncio.to_thread(
                self._store.query_history,
                HistoryQuery(
                    measurement,
                    field,
                    start,
                    end,
                    step,
                    aggregate,
                    wanted,
                    read_as_stored(measurement, step),
                    group_by,
                ),
            )
            if not series and measurement != metric.measurement:
                # No roll-up for this range (yet): answer from raw data.
                measurement = metric.measurement
                series = await asyncio.to_thread(
                    self._store.query_history,
                    HistoryQuery(
                        measurement, metric.name, start, end, step, aggregate, wanted, group_by=group_by
                    ),
                )
        except StoreError as exc:
            raise _Refused(grpc.StatusCode.UNAVAILABLE, f"history query failed: {exc}") from exc
        return fleet_pb2.HistoryResponse(
            metric=metric.name,
            measurement=measurement,  # where the answer came from: raw, or a roll-up tier
            unit=metric.unit,
            aggregate=request.aggregate or fleet_pb2.AGGREGATE_MEAN,
            step_ns=step,
            start_unix_ns=start,
            end_unix_ns=end,
            series=[
                fleet_pb2.Series(tags=s.tags, times_unix_ns=s.times_unix_ns, values=s.values) for s in series
            ],
        )

    @_rpc("viewer")
    async def QueryEvents(self, request: fleet_pb2.EventsRequest, principal: Principal) -> Any:
        start, end = _time_range(request.start_unix_ns, request.end_unix_ns, 24 * 3600)
        unknown = [k for k in request.kinds if k not in EVENT_KINDS]
        if unknown:
            raise _Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"unknown event kind {', '.join(map(repr, unknown))}; kinds: {', '.join(EVENT_KINDS)}",
            )
        limit = request.limit or DEFAULT_EVENTS
        if limit > MAX_EVENTS:
            raise _Refused(
                grpc.StatusCode.INVALID_ARGUMENT, f"limit {limit} is over {MAX_EVENTS}; narrow the range"
            )
        query = EventQuery(
            start,
            end,
            nodes=tuple(request.nodes),
            gpus=tuple(request.gpus),
            xids=tuple(request.xids),
            kinds=tuple(request.kinds),
            clusters=tuple(request.clusters),
        )
        try:
            events = await asyncio.to_thread(read_events, self._store, query)
        except StoreError as exc:
            raise _Refused(grpc.StatusCode.UNAVAILABLE, f"events query failed: {exc}") from exc
        return fleet_pb2.EventsResponse(
            events=events[-limit:], truncated=len(events) > limit, start_unix_ns=start, end_unix_ns=end
        )

    # --- repair -----------------------------------------------------------------------
    @property
    def _repair(self) -> RepairController | None:
        """The repair controller running here: on one box always; with replicas, only on the
        leader (the other replicas forward repair actions to it: `_on_leader`)."""
        return self._wiring.controller if self._wiring else None

    def _workflows(self) -> dict[str, Workflow]:
        if self._repair is not None:
            return self._repair.workflows
        return self._shared.workflows if self._shared else {}

    def _with_health(self, summary: fleet_pb2.NodeSummary) -> fleet_pb2.NodeSummary:
        wf = self._workflows().get(summary.node)
        summary.health = health_value(wf.state if wf else Health.HEALTHY)
        summary.health_detail = wf.detail if wf else ""
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
        node (0: repair is off). One query for the whole fleet, reused for 5 s."""
        now = time.monotonic()
        if now - self._lemon_read_at < 5.0:
            return self._lemon_counts
        self._lemon_read_at = now
        if self._wiring is None:
            self._lemon_counts = ({}, 0)
            return self._lemon_counts
        workflow = self._wiring.policy.workflow
        since = time.time_ns() - int(workflow["repeat_offender_days"] * 86400e9)
        try:
            counts = self._repair_records().incident_counts_since(since)
        except (_Refused, StateError) as exc:
            log.warning("cannot count recent incidents for the lemon-node flag: %s", exc)
            counts = {}
        self._lemon_counts = (counts, int(workflow["repeat_offender_incidents"]))
        return self._lemon_counts

    def _controller(self) -> RepairController:
        if self._repair is None:
            raise _Refused(grpc.StatusCode.UNIMPLEMENTED, "repair is not running in this aggregator")
        return self._repair

    def _repair_records(self) -> RepairState:
        """Incidents and audit: the controller's, or (on a replica that does not lead) the
        shared store's, which hold the same."""
        if self._repair is not None:
            return self._repair.state
        if self._shared is not None:
            return self._shared.state
        raise _Refused(grpc.StatusCode.UNIMPLEMENTED, "repair is not running in this aggregator")

    async def _on_leader(self, name: str, request: Any, context: grpc.aio.ServicerContext) -> Any | None:
        """On a replica that does not lead: the answer of the leader to the same call, with the
        caller's credentials (every replica shares the secrets file). None: this one leads."""
        if self._repair is not None or self._shared is None:
            return None
        holder, address = self._shared.leader_address()
        if any(k == _FORWARDED for k, _ in context.invocation_metadata()):
            raise _Refused(
                grpc.StatusCode.UNAVAILABLE,
                f"replica {self._shared.replica} was forwarded a repair call but is not the leader "
                f"(the lease is moving); try again in a few seconds",
            )
        if not address:
            raise _Refused(
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
            raise _Refused(
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
            raise _Refused(
                exc.code(), f"{exc.details()} (answered by the repair leader {holder} at {address})"
            ) from exc

    @_rpc("viewer")
    async def ReplayPolicy(self, request: fleet_pb2.ReplayRequest, principal: Principal) -> Any:
        """A policy replay over this aggregator's store (docs/architecture.md "Policy replay"):
        read-only, one at a time, in a worker thread (its own event loop): ingest and the
        live controller go on meanwhile."""
        if self._wiring is None:
            raise _Refused(grpc.StatusCode.FAILED_PRECONDITION, "repair is not configured on this aggregator")
        now = time.time_ns()
        end = request.end_unix_ns or now
        max_days = self._wiring.replay_max_days
        if not 0 < request.start_unix_ns < end:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "give a start before the end (--since, --until)")
        if end - request.start_unix_ns > max_days * 86400e9:
            raise _Refused(
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
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        if self._replay_lock.locked():
            raise _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, "a replay is running; try again when it ends")
        async with self._replay_lock:
            log.info("replaying %d policy(ies) over the store for %s", len(policies), principal.name)
            try:
                reports = await asyncio.to_thread(self._replay, request.start_unix_ns, end, policies)
            except StoreError as exc:
                raise _Refused(
                    grpc.StatusCode.UNAVAILABLE, f"cannot read the store's history: {exc}"
                ) from exc
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

    @_rpc("viewer")
    async def ListIncidents(self, request: fleet_pb2.ListIncidentsRequest, principal: Principal) -> Any:
        records = self._repair_records()
        incidents = records.incidents(request.open_only, request.node, request.limit or 100)
        return fleet_pb2.ListIncidentsResponse(
            incidents=[_incident_pb(i, records.audit_log(incident_id=i.id, limit=100)) for i in incidents]
        )

    @_rpc("viewer")
    async def ListAudit(self, request: fleet_pb2.ListAuditRequest, principal: Principal) -> Any:
        entries = self._repair_records().audit_log(request.node, request.limit or 200)
        return fleet_pb2.ListAuditResponse(entries=[_audit_pb(e) for e in entries])

    @_rpc("viewer", forward=True)
    async def GetRepairStatus(self, request: fleet_pb2.RepairStatusRequest, principal: Principal) -> Any:
        return self._repair_status()

    def _repair_status(self) -> fleet_pb2.RepairStatus:
        repair = self._controller()
        nodes = []
        for name in sorted(repair.workflows):
            wf = repair.workflows[name]
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
        repair = self._controller()
        if not request.node:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{action} needs a node name")
        if not request.reason.strip():
            raise _Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{action} {request.node} needs a reason (--reason TEXT): it goes in the audit log",
            )
        try:
            wf = await getattr(repair, action)(request.node, request.reason.strip(), principal.name)
        except StateError as exc:  # fenced (no longer the leader) or the store is down
            raise _Refused(grpc.StatusCode.UNAVAILABLE, f"{action} {request.node} not done: {exc}") from exc
        except RepairRefused as exc:
            code = {"not_found": grpc.StatusCode.NOT_FOUND, "invalid": grpc.StatusCode.INVALID_ARGUMENT}.get(
                exc.kind, grpc.StatusCode.FAILED_PRECONDITION
            )
            raise _Refused(code, str(exc)) from exc
        return fleet_pb2.CordonResponse(state=health_value(wf.state), detail=wf.detail)

    @_rpc("operator", forward=True)
    async def Cordon(self, request: fleet_pb2.CordonRequest, principal: Principal) -> Any:
        return await self._manual("cordon", request, principal)

    @_rpc("operator", forward=True)
    async def Uncordon(self, request: fleet_pb2.CordonRequest, principal: Principal) -> Any:
        return await self._manual("uncordon", request, principal)

    @_rpc("operator")
    async def RevokeCollectorToken(self, request: fleet_pb2.RevokeTokenRequest, principal: Principal) -> Any:
        """Put one collector token on the revocation list in the control plane (every replica
        reads it within seconds: aggregator/server.py `revocation_loop`); audited."""
        if not TOKEN_ID_RE.fullmatch(request.token_id):
            raise _Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"token id {request.token_id[:80]!r} is not one: `gpufleet auth collector-token` prints it",
            )
        if not request.reason.strip():
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "a revocation needs a reason (--reason TEXT)")
        records = self._repair_records()
        try:
            added = await asyncio.to_thread(
                records.revoke_collector_token,
                request.token_id,
                request.node,
                principal.name,
                request.reason.strip()[:300],
            )
            revoked = await asyncio.to_thread(records.revoked_collector_tokens)
        except StateError as exc:
            raise _Refused(grpc.StatusCode.UNAVAILABLE, f"revocation not recorded: {exc}") from exc
        log.warning(
            "collector token %s revoked by %s: %s",
            request.token_id,
            principal.name,
            request.reason.strip(),
            extra={"node": request.node},
        )
        return fleet_pb2.RevokeTokenResponse(newly_revoked=added, revoked_total=len(revoked))

    @_rpc("operator", forward=True)
    async def ResetBreaker(self, request: fleet_pb2.ResetBreakerRequest, principal: Principal) -> Any:
        if not request.reason.strip():
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "breaker reset needs a reason (--reason TEXT)")
        try:
            await self._controller().reset_breaker(request.reason.strip(), principal.name)
        except StateError as exc:
            raise _Refused(grpc.StatusCode.UNAVAILABLE, f"breaker reset not done: {exc}") from exc
        return self._repair_status()


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
