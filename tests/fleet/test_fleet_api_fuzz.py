"""Property-based tests over the whole QueryEvents and grouped QueryHistory requests, through real
gRPC against a real aggregator (in this process's event loop thread) over a store holding known
points: every request is answered with exactly the right events or series, or refused with
INVALID_ARGUMENT and a message; never another status, never a wrong answer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.aggregator.store import EmbeddedStore, Point
from gpufleet.protos import fleet_pb2, fleet_pb2_grpc
from gpufleet.protos.names import HISTORY_EVENT_KINDS
from harness.in_process import InProcessAggregator

S = 1_000_000_000
T0 = 1_790_000_000 * S
NODES = ["fz-a", "fz-b", "fz-c"]
CLUSTERS = {"fz-a": "east", "fz-b": "east", "fz-c": "west"}
MAX_EVENTS = 20_000


def stored_points() -> list[Point]:
    points = []
    for i in range(60):
        node = NODES[i % 3]
        t = T0 + i * 10 * S
        gpu = str(i % 4)
        kind = ("xid", "gpu_lost", "gpu_recovered", "engine_unreadable")[i % 4]
        tags = {"node": node, "cluster": CLUSTERS[node], "kind": kind, "source": "nvml", "gpu": gpu}
        fields = {"xid": (79, 13, 48)[i % 3] if kind == "xid" else 0, "message": f"m{i}", "count": 1 + i % 5}
        points.append(Point("event", tags, fields, t))
        if i % 5 == 0:
            htags = {
                "node": node,
                "cluster": CLUSTERS[node],
                "gpu": gpu,
                "code": "xid_79",
                "severity": "critical",
            }
            points.append(
                Point("health", htags, {"reason": "r", "evidence": "e", "incident_id": "inc"}, t + 1)
            )
        if i % 7 == 0:
            rtags = {"node": node, "cluster": CLUSTERS[node], "action": "cordon", "by": "automation"}
            points.append(
                Point("repair", rtags, {"actor": "automation", "outcome": "ok", "reason": "x"}, t + 2)
            )
        for g in range(4):
            gtags = {
                "node": node,
                "gpu": str(g),
                "uuid": f"GPU-{node}-{g}",
                "model": "H100",
                "cluster": CLUSTERS[node],
            }
            points.append(Point("gpu", gtags, {"util_gpu_pct": float((i + g) % 100)}, t))
    return points


POINTS = stored_points()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[fleet_pb2_grpc.FleetStub, tuple]]:
    tmp = tmp_path_factory.mktemp("fleetfuzz")
    store = EmbeddedStore(Path(tmp) / "data" / "store.sqlite3", retention_s=86400 * 3650)
    store.write(POINTS)
    store.close()
    agg = InProcessAggregator(tmp, retention_s=86400 * 3650)
    channel = grpc.insecure_channel(agg.fleet)
    try:
        yield (
            fleet_pb2_grpc.FleetStub(channel),
            agg.secrets.metadata(),
        )
    finally:
        channel.close()
        agg.close()


def expected_events(r: fleet_pb2.EventsRequest, start: int, end: int) -> list[tuple[int, str, str]]:
    kinds = set(r.kinds or HISTORY_EVENT_KINDS)
    out = []
    for p in POINTS:
        if p.measurement == "gpu" or not start <= p.time_unix_ns < end:
            continue
        kind = p.tags["kind"] if p.measurement == "event" else p.measurement
        if kind not in kinds or (r.xids and (kind != "xid" or p.fields["xid"] not in r.xids)):
            continue
        if (r.nodes and p.tags["node"] not in r.nodes) or (
            r.clusters and p.tags["cluster"] not in r.clusters
        ):
            continue
        if r.gpus and ("gpu" not in p.tags or int(p.tags["gpu"]) not in r.gpus):
            continue
        out.append((p.time_unix_ns, p.tags["node"], kind))
    return sorted(out)


names = st.sampled_from([*NODES, "", "nope", "fz-a ", "ä", "x" * 300])
events_requests = st.builds(
    fleet_pb2.EventsRequest,
    start_unix_ns=st.one_of(
        st.just(0), st.integers(T0 - 100 * S, T0 + 700 * S), st.integers(-(2**63), 2**63 - 1)
    ),
    end_unix_ns=st.one_of(
        st.just(0), st.integers(T0 - 100 * S, T0 + 700 * S), st.integers(-(2**63), 2**63 - 1)
    ),
    nodes=st.lists(names, max_size=3),
    gpus=st.lists(st.integers(0, 2**32 - 1) | st.integers(0, 5), max_size=3),
    xids=st.lists(st.sampled_from([79, 13, 48, 0, 2**32 - 1]), max_size=2),
    kinds=st.lists(st.sampled_from([*HISTORY_EVENT_KINDS, "XID", "", "unspecified", "health "]), max_size=3),
    clusters=st.lists(st.sampled_from(["east", "west", "", "north"]), max_size=2),
    limit=st.one_of(st.just(0), st.integers(1, 40), st.integers(MAX_EVENTS - 1, 2**32 - 1)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(r=events_requests)
def test_query_events_answers_exactly_or_refuses(fleet: tuple, r: fleet_pb2.EventsRequest) -> None:
    stub, meta = fleet
    try:
        resp = stub.QueryEvents(r, metadata=meta, timeout=30)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (exc.code(), exc.details())
        bad_kind = any(k not in HISTORY_EVENT_KINDS for k in r.kinds)
        too_many = r.limit > MAX_EVENTS
        assert bad_kind or too_many or exc.details().startswith("start ("), exc.details()
        return
    assert all(k in HISTORY_EVENT_KINDS for k in r.kinds) and r.limit <= MAX_EVENTS
    assert resp.start_unix_ns < resp.end_unix_ns
    if r.start_unix_ns:
        assert resp.start_unix_ns == r.start_unix_ns
    if r.end_unix_ns:
        assert resp.end_unix_ns == r.end_unix_ns
    want = expected_events(r, resp.start_unix_ns, resp.end_unix_ns)
    limit = r.limit or 1000
    got = [(e.time_unix_ns, e.node, e.kind) for e in resp.events]
    assert got == want[-limit:], "the newest `limit` matching events, oldest first"
    assert resp.truncated == (len(want) > limit)


group_names = st.sampled_from(
    ["cluster", "model", "node", "gpu", "uuid", "engine", "port", "kind", "", "Node"]
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(group_by=st.lists(group_names, max_size=4), aggregate=st.sampled_from([1, 2, 3, 4, 5, 6]))
def test_grouped_history_answers_every_group_or_refuses(
    fleet: tuple, group_by: list[str], aggregate: int
) -> None:
    stub, meta = fleet
    request = fleet_pb2.HistoryRequest(
        metric="util_gpu_pct",
        start_unix_ns=T0,
        end_unix_ns=T0 + 600 * S,
        step_ns=60 * S,
        aggregate=aggregate,
        group_by=group_by,
    )
    allowed = {"cluster", "model", "node", "gpu", "uuid"}
    try:
        resp = stub.QueryHistory(request, metadata=meta, timeout=30)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (exc.code(), exc.details())
        assert not set(group_by) <= allowed and "cannot group util_gpu_pct by" in exc.details()
        return
    assert set(group_by) <= allowed
    wanted = list(dict.fromkeys(group_by))
    gpu_points = [p for p in POINTS if p.measurement == "gpu"]
    if not wanted:
        assert len(resp.series) == len({(p.tags["node"], p.tags["gpu"]) for p in gpu_points})
        return
    groups = {tuple(p.tags[t] for t in wanted) for p in gpu_points}
    assert sorted(tuple(s.tags[t] for t in wanted) for s in resp.series) == sorted(groups)
    assert all(set(s.tags) == set(wanted) for s in resp.series)
    if aggregate == fleet_pb2.AGGREGATE_COUNT:
        # Every sample in the range is in exactly one group's count.
        assert sum(sum(s.values) for s in resp.series) == len(gpu_points)


times = st.one_of(st.just(0), st.integers(T0 - 100 * S, T0 + 700 * S), st.integers(-(2**63), 2**63 - 1))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    start=times,
    end=times,
    step=st.one_of(st.just(0), st.integers(-(2**63), 2**63 - 1), st.integers(1, 600 * S)),
    group_by=st.lists(st.sampled_from(["cluster", "node", "model"]), max_size=2),
)
def test_history_over_any_range_answers_or_refuses(
    fleet: tuple, start: int, end: int, step: int, group_by: list[str]
) -> None:
    """Any range and step on the wire: data within the range, or INVALID_ARGUMENT saying why."""
    stub, meta = fleet
    request = fleet_pb2.HistoryRequest(
        metric="util_gpu_pct", start_unix_ns=start, end_unix_ns=end, step_ns=step, group_by=group_by
    )
    try:
        resp = stub.QueryHistory(request, metadata=meta, timeout=30)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (exc.code(), exc.details())
        assert exc.details().startswith(("start (", "step ")) or "buckets; the limit is" in exc.details()
        return
    assert 0 <= resp.start_unix_ns < resp.end_unix_ns and resp.step_ns > 0
    for s in resp.series:
        assert all(resp.start_unix_ns - resp.step_ns < t < resp.end_unix_ns for t in s.times_unix_ns)
