"""The live fleet view and the Fleet API, as the CLI and dashboard see them."""

from __future__ import annotations

import signal
import time

import grpc
import pytest

from gpufleet.aggregator.fleet.state import FleetState
from gpufleet.protos import fleet_pb2, ingest_pb2, telemetry_pb2, vocabulary_pb2
from harness.fleet_api import bearer
from harness.processes import Cluster, free_port
from harness.waiting import wait_until


def liveness_of(cluster_agg: object, node: str, token: str) -> str:
    stub = cluster_agg.fleet_stub()  # type: ignore[attr-defined]
    nodes = stub.ListNodes(fleet_pb2.ListNodesRequest(), metadata=bearer(token))
    (summary,) = [n for n in nodes.nodes if n.node == node]
    return vocabulary_pb2.Liveness.Name(summary.liveness)


@pytest.mark.slow
def test_a_dead_collector_goes_stale_then_silent_and_survives_a_restart(cluster: Cluster) -> None:
    ingest, fleet = free_port(), free_port()
    agg = cluster.aggregator("aggregator-1", ingest, fleet)
    viewer = cluster.secrets.tokens["viewer"]
    doomed = cluster.collector("doomed", agg.ingest, "--interval-s", "0.2")
    wait_until(lambda: liveness_of(agg, "doomed", viewer) == "LIVENESS_REPORTING", 20, "reporting")
    # Reports stored, not just a hello: the restart below must find the node in the store.
    wait_until(
        lambda: (
            "connected" in doomed.log() and agg.metric_value("gpufleet_ingest_reports_accepted_total") >= 3
        ),
        20,
        "three reports stored",
    )
    doomed.stop(signal.SIGKILL)
    wait_until(lambda: liveness_of(agg, "doomed", viewer) == "LIVENESS_STALE", 10, "stale (3 intervals)")
    wait_until(lambda: liveness_of(agg, "doomed", viewer) == "LIVENESS_SILENT", 10, "silent (10 intervals)")
    agg.proc.stop(signal.SIGTERM)
    agg2 = cluster.aggregator("aggregator-2", ingest, fleet, agg.data_dir)
    # After a restart the node is still known (from the store), with its last GPU values.
    assert liveness_of(agg2, "doomed", viewer) == "LIVENESS_SILENT"
    detail = agg2.fleet_stub().GetNode(fleet_pb2.GetNodeRequest(node="doomed"), metadata=bearer(viewer))
    assert len(detail.summary.gpus) == 8 and detail.summary.gpus[0].HasField("util_gpu_pct")
    assert not detail.summary.connected


@pytest.mark.slow
def test_a_full_replay_buffer_drops_the_oldest_and_says_so(cluster: Cluster) -> None:
    ingest = free_port()
    # No aggregator yet: the collector buffers 5 reports at most and drops older ones.
    col = cluster.collector(
        "buffered",
        f"127.0.0.1:{ingest}",
        "--interval-s",
        "0.1",
        "--buffer-reports",
        "5",
        "--backoff-max-s",
        "0.5",
    )
    wait_until(lambda: col.log().count("replay buffer full") >= 3, 20, "reports to be dropped")
    agg = cluster.aggregator("aggregator", ingest)
    viewer = cluster.secrets.tokens["viewer"]

    def stats() -> telemetry_pb2.CollectorStats | None:
        detail = agg.fleet_stub().GetNode(fleet_pb2.GetNodeRequest(node="buffered"), metadata=bearer(viewer))
        # Reports replayed from the buffer were built before the later drops: the count the
        # aggregator shows grows to the collector's as newer reports arrive.
        return detail.collector_stats if detail.collector_stats.reports_dropped_total >= 3 else None

    wait_until(stats, 20, "a drop count of at least 3 to reach the aggregator")
    assert "dropped unacknowledged report seq 1" in col.log()


def test_fleet_api_needs_a_known_token(cluster: Cluster) -> None:
    agg = cluster.aggregator()
    stub = agg.fleet_stub()
    with pytest.raises(grpc.RpcError) as none:
        stub.ListNodes(fleet_pb2.ListNodesRequest())
    assert none.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as wrong:
        stub.ListNodes(fleet_pb2.ListNodesRequest(), metadata=bearer("nope"))
    assert wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as collector_token:
        stub.ListNodes(
            fleet_pb2.ListNodesRequest(),
            metadata=bearer(cluster.secrets.collector_token("n1")),
        )
    assert collector_token.value.code() == grpc.StatusCode.UNAUTHENTICATED, (
        "a node's token is not a fleet token"
    )
    me = stub.WhoAmI(fleet_pb2.WhoAmIRequest(), metadata=cluster.secrets.metadata())
    assert (me.name, me.role) == ("viewer", "viewer")
    assert agg.metric_value("gpufleet_fleet_requests_total", method="ListNodes", code="UNAUTHENTICATED") == 3


def test_liveness_thresholds_scale_with_the_collector_interval() -> None:
    state = FleetState(stale_after_intervals=3, silent_after_intervals=10)
    state.on_hello(ingest_pb2.Hello(node="n1", boot_id="b", interval_s=2.0), heard_ns=1)
    report = telemetry_pb2.NodeReport(node="n1", boot_id="b", seq=1, time_unix_ns=time.time_ns())
    heard = 1_000 * 10**9
    state.on_report(report, heard)
    live = state.nodes["n1"]
    s = 10**9
    assert state.liveness(live, heard + 5 * s) == vocabulary_pb2.LIVENESS_REPORTING
    assert state.liveness(live, heard + 6 * s) == vocabulary_pb2.LIVENESS_STALE
    assert state.liveness(live, heard + 19 * s) == vocabulary_pb2.LIVENESS_STALE
    assert state.liveness(live, heard + 20 * s) == vocabulary_pb2.LIVENESS_SILENT


def test_an_older_replayed_report_does_not_overwrite_newer_live_values() -> None:
    state = FleetState()
    state.on_hello(
        ingest_pb2.Hello(node="n1", boot_id="b", interval_s=1.0, gpus=[telemetry_pb2.GpuIdentity(index=0)])
    )
    new = telemetry_pb2.NodeReport(node="n1", boot_id="b", seq=5, time_unix_ns=2_000)
    new.gpus.add(index=0, util_gpu_pct=90.0)
    old = telemetry_pb2.NodeReport(node="n1", boot_id="b", seq=4, time_unix_ns=1_000)
    old.gpus.add(index=0, util_gpu_pct=10.0)
    state.on_report(new, 5)
    state.on_report(old, 6)
    assert state.nodes["n1"].gpus[0].util_gpu_pct == 90.0 and state.nodes["n1"].last_seq == 5


def test_a_replayed_report_does_not_list_its_events_twice() -> None:
    state = FleetState()
    state.on_hello(
        ingest_pb2.Hello(node="n1", boot_id="b", interval_s=1.0, gpus=[telemetry_pb2.GpuIdentity(index=0)])
    )
    report = telemetry_pb2.NodeReport(node="n1", boot_id="b", seq=1, time_unix_ns=1_000)
    report.events.add(kind=vocabulary_pb2.EVENT_KIND_GPU_LOST, gpu_index=0, time_unix_ns=1_000)
    state.on_report(report, 5)
    state.on_report(report, 6)  # the collector replays it after a reconnect
    assert len(state.nodes["n1"].events) == 1


def test_a_collector_that_just_connected_is_not_silent() -> None:
    state = FleetState()
    state.on_hello(ingest_pb2.Hello(node="n1", boot_id="b", interval_s=1.0), heard_ns=1_000 * 10**9)
    assert state.liveness(state.nodes["n1"], 1_000 * 10**9 + 10**8) == vocabulary_pb2.LIVENESS_REPORTING


def test_a_late_restore_does_not_overwrite_a_node_that_already_reported() -> None:
    from gpufleet.aggregator.store import Point

    state = FleetState()
    state.on_hello(
        ingest_pb2.Hello(node="n1", boot_id="new", interval_s=1.0, gpus=[telemetry_pb2.GpuIdentity(index=0)])
    )
    live = telemetry_pb2.NodeReport(node="n1", boot_id="new", seq=3, time_unix_ns=2_000)
    live.gpus.add(index=0, util_gpu_pct=90.0)
    state.on_report(live, 5)
    state.restore(
        [
            Point("collector", {"node": "n1"}, {"seq": 40, "boot_id": "old"}, 1_000),
            Point("collector", {"node": "n2"}, {"seq": 9, "boot_id": "b2"}, 1_000),
        ],
        [Point("gpu", {"node": "n1", "gpu": "0"}, {"util_gpu_pct": 10.0}, 1_000)],
    )
    assert (state.nodes["n1"].boot_id, state.nodes["n1"].last_seq) == ("new", 3)
    assert state.nodes["n1"].gpus[0].util_gpu_pct == 90.0
    assert state.nodes["n2"].last_seq == 9, "a node not yet heard from is restored"
