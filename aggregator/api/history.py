"""The Fleet API's history: a metric over time (grouped at fleet scale), and the stored events."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc

from gpufleet.aggregator.api.answers import AnswerBytes
from gpufleet.aggregator.api.base import Refused, RpcGate, rpc
from gpufleet.aggregator.auth.tokens import Principal
from gpufleet.aggregator.fleet.events import DEFAULT_EVENTS, EVENT_KINDS, MAX_EVENTS, EventQuery, read_events
from gpufleet.aggregator.fleet.rollups import read_as_stored, route
from gpufleet.aggregator.ingest.schema import METRICS, TAGS
from gpufleet.aggregator.store import HistoryQuery, Store, StoreError
from gpufleet.aggregator.workloads.summary import OWNER_DIMENSIONS, OWNER_METRICS, owner_measurement
from gpufleet.protos import fleet_pb2
from gpufleet.protos.names import aggregate_name

MAX_BUCKETS = 20_000
_NICE_STEPS_S = [1, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400]


class HistoryApi:
    """A metric's history and the stored events, read from the store."""

    def __init__(self, gate: RpcGate, store: Store) -> None:
        self._gate = gate
        self._store = store

    @rpc("viewer")
    async def QueryHistory(self, request: fleet_pb2.HistoryRequest, principal: Principal) -> Any:
        metric = METRICS.get(request.metric)
        if metric is None:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"unknown metric {request.metric!r}; known metrics: "
                f"{', '.join(METRICS)} (`gpufleet metrics` describes them)",
            )
        if request.aggregate not in fleet_pb2.Aggregate.values():
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"unknown aggregate {request.aggregate}")
        start, end = _time_range(request.start_unix_ns, request.end_unix_ns, 3600)
        step = request.step_ns or default_step_ns(end - start)
        if step < 0:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"step {step} ns must be positive")
        if (end - start) / step > MAX_BUCKETS:
            raise Refused(
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
        if any(t in OWNER_DIMENSIONS for t in group_by):
            return await self._by_owner(request, metric.name, metric.unit, metric.help, group_by)
        tags = TAGS[metric.measurement]
        unknown = [t for t in group_by if t not in tags]
        if unknown:
            raise Refused(
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
            raise Refused(grpc.StatusCode.UNAVAILABLE, f"history query failed: {exc}") from exc
        return fleet_pb2.HistoryResponse(
            metric=metric.name,
            measurement=measurement,  # where the answer came from: raw, or a roll-up tier
            unit=metric.unit,
            help=metric.help,
            aggregate=request.aggregate or fleet_pb2.AGGREGATE_MEAN,
            step_ns=step,
            start_unix_ns=start,
            end_unix_ns=end,
            series=[
                fleet_pb2.Series(tags=s.tags, times_unix_ns=s.times_unix_ns, values=s.values) for s in series
            ],
        )

    async def _by_owner(
        self, request: fleet_pb2.HistoryRequest, name: str, unit: str, help_: str, group_by: tuple[str, ...]
    ) -> fleet_pb2.HistoryResponse:
        """A GPU metric grouped by an owner (account, namespace, team, partition): the owner
        series the workloads write (aggregator/workloads/summary.py owner_points), never a tag
        on GPU points."""
        if len(group_by) != 1 or name not in OWNER_METRICS:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"grouped by an owner, history has {', '.join(OWNER_METRICS[:-1])}, one owner dimension "
                f"at a time ({', '.join(OWNER_DIMENSIONS)}); asked: {name} by {', '.join(group_by)}",
            )
        filters = [f for f in ("nodes", "gpus", "clusters", "engines", "models") if getattr(request, f)]
        if filters:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"grouped by {group_by[0]}, history is the owner's GPUs fleet-wide: drop --{filters[0][:-1]}",
            )
        start, end = _time_range(request.start_unix_ns, request.end_unix_ns, 3600)
        step = request.step_ns or default_step_ns(end - start)
        if step <= 0 or (end - start) / step > MAX_BUCKETS:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"step {step} ns gives too many buckets")
        measurement = owner_measurement(group_by[0])
        aggregate = aggregate_name(request.aggregate)
        try:
            series = await asyncio.to_thread(
                self._store.query_history,
                HistoryQuery(measurement, name, start, end, step, aggregate, {}, group_by=group_by),
            )
        except StoreError as exc:
            raise Refused(grpc.StatusCode.UNAVAILABLE, f"history query failed: {exc}") from exc
        return fleet_pb2.HistoryResponse(
            metric=name,
            measurement=measurement,
            unit=unit,
            help=f"{help_} (each owner's running GPUs: docs/workloads.md)",
            aggregate=request.aggregate or fleet_pb2.AGGREGATE_MEAN,
            step_ns=step,
            start_unix_ns=start,
            end_unix_ns=end,
            series=[
                fleet_pb2.Series(tags=s.tags, times_unix_ns=s.times_unix_ns, values=s.values) for s in series
            ],
        )

    @rpc("viewer")
    async def QueryEvents(self, request: fleet_pb2.EventsRequest, principal: Principal) -> Any:
        start, end = _time_range(request.start_unix_ns, request.end_unix_ns, 24 * 3600)
        unknown = [k for k in request.kinds if k not in EVENT_KINDS]
        if unknown:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"unknown event kind {', '.join(map(repr, unknown))}; kinds: {', '.join(EVENT_KINDS)}",
            )
        limit = request.limit or DEFAULT_EVENTS
        if limit > MAX_EVENTS:
            raise Refused(
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
            raise Refused(grpc.StatusCode.UNAVAILABLE, f"events query failed: {exc}") from exc
        # The newest `limit`, and of those as many as fit ANSWER_BYTES, newest first: an event's
        # text is a node's words (up to 4 KiB each), so 1,000 of one node's could pass 4 MiB.
        answer, kept = AnswerBytes(), 0
        for event in reversed(events[-limit:]):
            if not answer.fits(event):
                break
            kept += 1
        return fleet_pb2.EventsResponse(
            events=events[len(events) - kept :],
            truncated=len(events) > kept,
            start_unix_ns=start,
            end_unix_ns=end,
        )


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
        raise Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"start ({start}) must be before end ({end}), both nanoseconds since 1970, not before it",
        )
    return start, end
