"""The Fleet API: the only way the dashboard and the CLI see the fleet."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from gpufleet.aggregator.auth import Authenticator, AuthError, Principal, bearer
from gpufleet.aggregator.fleet_state import FleetState
from gpufleet.aggregator.metrics import AggregatorMetrics
from gpufleet.aggregator.rollups import route
from gpufleet.aggregator.schema import METRICS
from gpufleet.aggregator.store import HistoryQuery, Store, StoreError
from gpufleet.protos import fleet_pb2, fleet_pb2_grpc

log = logging.getLogger("gpufleet.aggregator.fleet")

MAX_BUCKETS = 20_000
_AGGREGATES = {
    fleet_pb2.AGGREGATE_UNSPECIFIED: "mean",
    fleet_pb2.AGGREGATE_MEAN: "mean",
    fleet_pb2.AGGREGATE_MAX: "max",
    fleet_pb2.AGGREGATE_MIN: "min",
    fleet_pb2.AGGREGATE_P95: "p95",
    fleet_pb2.AGGREGATE_LAST: "last",
    fleet_pb2.AGGREGATE_COUNT: "count",
}
_NICE_STEPS_S = [1, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400]


def default_step_ns(span_ns: int, target_buckets: int = 300) -> int:
    """The smallest 'round' step that gives at most about target_buckets buckets."""
    want_s = span_ns / target_buckets / 1e9
    for step in _NICE_STEPS_S:
        if step >= want_s:
            return step * 1_000_000_000
    return int(want_s) * 1_000_000_000


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _rpc(role: str) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """Authenticate, require role, count and log; turn _Refused into its gRPC status."""

    def wrap(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def method(self: FleetService, request: Any, context: grpc.aio.ServicerContext) -> Any:
            name = fn.__name__
            try:
                principal = self._authorize(context, role)
                result = await fn(self, request, principal)
            except _Refused as r:
                self._metrics.fleet_requests.labels(method=name, code=r.code.name).inc()
                log.info("fleet %s refused: %s", name, r.message, extra={"code": r.code.name})
                await context.abort(r.code, r.message)
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
    ) -> None:
        self._auth = auth
        self._fleet = fleet
        self._store = store
        self._metrics = metrics
        self._status = status or fleet_pb2.AggregatorStatus

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
        now = time.time_ns()
        clusters = set(request.clusters)
        wanted = set(request.liveness)
        nodes = []
        for name in sorted(self._fleet.nodes):
            summary = self._fleet.summary(self._fleet.nodes[name], now)
            if clusters and summary.cluster not in clusters:
                continue
            if wanted and summary.liveness not in wanted:
                continue
            nodes.append(summary)
        return fleet_pb2.ListNodesResponse(nodes=nodes, server_time_unix_ns=now)

    @_rpc("viewer")
    async def GetNode(self, request: fleet_pb2.GetNodeRequest, principal: Principal) -> Any:
        live = self._fleet.nodes.get(request.node)
        if live is None:
            raise _Refused(
                grpc.StatusCode.NOT_FOUND,
                f"node {request.node!r} is not known to this aggregator "
                f"({len(self._fleet.nodes)} nodes are); `gpufleet nodes` lists them",
            )
        return self._fleet.detail(live)

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
        aggregate = _AGGREGATES.get(request.aggregate)
        if aggregate is None:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"unknown aggregate {request.aggregate}")
        end = request.end_unix_ns or time.time_ns()
        start = request.start_unix_ns or end - 3600 * 1_000_000_000
        if start >= end:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"start ({start}) must be before end ({end})")
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
        measurement, field = route(metric.measurement, metric.name, aggregate, start, end, step)
        try:
            series = await asyncio.to_thread(
                self._store.query_history,
                HistoryQuery(measurement, field, start, end, step, aggregate, wanted),
            )
            if not series and measurement != metric.measurement:
                # No roll-up for this range (yet): answer from raw data.
                measurement = metric.measurement
                series = await asyncio.to_thread(
                    self._store.query_history,
                    HistoryQuery(measurement, metric.name, start, end, step, aggregate, wanted),
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
