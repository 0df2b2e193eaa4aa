"""Bad input on the ingest stream: each is refused with a precise gRPC status and message,
counted in the aggregator's own /metrics, logged with the node's name, and the aggregator
keeps serving everyone else (a real simulated collector streams throughout)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import AggregatorHandle, Cluster, RawStream, hello, report, wait_until

from gpufleet.aggregator.store import EmbeddedStore


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, AggregatorHandle]]:
    cluster = Cluster(tmp_path_factory.mktemp("badinput"))
    agg = cluster.aggregator("aggregator", 0, 0, None, "--max-report-bytes", "8192")
    cluster.collector("good-node", agg.ingest, "--interval-s", "0.2", "--sim-gpus", "8")
    try:
        yield cluster, agg
    finally:
        cluster.stop_all()


def stream_for(cluster: Cluster, agg: AggregatorHandle, node: str, boot_id: str = "boot-1") -> RawStream:
    s = RawStream(agg.ingest, cluster.secrets.collector_token(node))
    s.send(hello(node, boot_id=boot_id))
    assert s.recv().WhichOneof("body") == "welcome"
    return s


def stream_error(s: RawStream) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        while True:
            s.recv()
    return info.value


def good_seqs(agg: AggregatorHandle) -> int:
    store = EmbeddedStore(Path(agg.data_dir) / "store.sqlite3", retention_s=86400)
    try:
        return len(store.query_points("collector", 0, time.time_ns() + 10**12, {"node": ["good-node"]}))
    finally:
        store.close()


def test_missing_credential_is_unauthenticated(env: tuple[Cluster, AggregatorHandle]) -> None:
    _, agg = env
    before = agg.metric_value("gpufleet_ingest_rejections_total", reason="unauthenticated")
    s = RawStream(agg.ingest, token=None)
    s.send(hello("node-a"))
    err = stream_error(s)
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "Bearer" in err.details()
    assert agg.metric_value("gpufleet_ingest_rejections_total", reason="unauthenticated") == before + 1


def test_credential_of_another_node_is_refused(env: tuple[Cluster, AggregatorHandle]) -> None:
    cluster, agg = env
    s = RawStream(agg.ingest, cluster.secrets.collector_token("node-b"))
    s.send(hello("node-impostor"))
    err = stream_error(s)
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "'node-impostor'" in err.details() and "collector-token" in err.details()
    wait_until(lambda: "node=node-impostor" in agg.proc.log(), 5, "the refusal to be logged with the node")


def test_unknown_protocol_version_is_failed_precondition(env: tuple[Cluster, AggregatorHandle]) -> None:
    cluster, agg = env
    s = RawStream(agg.ingest, cluster.secrets.collector_token("node-c"))
    s.send(hello("node-c", protocol_version=9))
    err = stream_error(s)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "protocol version 9" in err.details()
    assert agg.metric_value("gpufleet_ingest_rejections_total", reason="protocol_version") >= 1


@pytest.mark.parametrize("after_hello", [False, True])
def test_undecodable_bytes_end_the_stream_with_invalid_argument(
    env: tuple[Cluster, AggregatorHandle], after_hello: bool
) -> None:
    cluster, agg = env
    before = agg.metric_value("gpufleet_ingest_rejections_total", reason="malformed")
    s = (
        stream_for(cluster, agg, "node-d")
        if after_hello
        else RawStream(agg.ingest, cluster.secrets.collector_token("node-d"))
    )
    s.send(b"\xff\xff\xff\xff not protobuf")
    err = stream_error(s)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "is not a gpufleet.v1.CollectorMessage" in err.details()
    assert agg.metric_value("gpufleet_ingest_rejections_total", reason="malformed") == before + 1


BAD_REPORTS = [
    (
        "nan",
        {"util_gpu_pct": float("nan")},
        grpc.StatusCode.INVALID_ARGUMENT,
        "util_gpu_pct=nan, which is not a finite number",
        "bad_value",
    ),
    (
        "negative",
        {"power_w": -4.0},
        grpc.StatusCode.INVALID_ARGUMENT,
        "power_w=-4.0, which is outside 0..5000 W",
        "bad_value",
    ),
    ("absurd", {"temp_gpu_c": 900.0}, grpc.StatusCode.INVALID_ARGUMENT, "temp_gpu_c=900.0", "bad_value"),
    (
        "hbm_over_total",
        {"hbm_used_bytes": 90 << 30},
        grpc.StatusCode.INVALID_ARGUMENT,
        "hbm_used_bytes=96636764160 above hbm_total_bytes=85899345920",
        "bad_value",
    ),
    (
        "index_out_of_range",
        {"index": 8},
        grpc.StatusCode.INVALID_ARGUMENT,
        "GPU index 8; the node declared 8 GPU(s) (indices 0..7)",
        "gpu_index",
    ),
    ("duplicate_index", {"index": 1}, grpc.StatusCode.INVALID_ARGUMENT, "GPU index 1 twice", "gpu_index"),
    (
        "oversized",
        {"model": "x" * 9000},
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "the limit is 8192",
        "oversized",
    ),
]


@pytest.mark.parametrize("name,override,code,text,reason", BAD_REPORTS, ids=[b[0] for b in BAD_REPORTS])
def test_bad_report_is_rejected_alone_and_the_stream_goes_on(
    env: tuple[Cluster, AggregatorHandle],
    name: str,
    override: dict[str, object],
    code: grpc.StatusCode,
    text: str,
    reason: str,
) -> None:
    cluster, agg = env
    node = f"node-{name}"
    before = agg.metric_value("gpufleet_ingest_rejections_total", reason=reason)
    s = stream_for(cluster, agg, node)
    s.send(report(node, 1, **override))
    msg = s.recv()
    assert msg.WhichOneof("body") == "reject"
    assert msg.reject.seq == 1 and msg.reject.code == code.value[0]
    assert f"node '{node}': report seq 1" in msg.reject.message and text in msg.reject.message
    s.send(report(node, 2))
    assert list(s.recv().ack.seqs) == [2], "the next good report on the same stream is accepted"
    s.close()
    assert agg.metric_value("gpufleet_ingest_rejections_total", reason=reason) == before + 1
    wait_until(
        lambda: f"node={node}" in agg.proc.log() and f"reason={reason}" in agg.proc.log(),
        5,
        "the rejection to be logged with the node",
    )


def test_report_for_another_node_is_permission_denied(env: tuple[Cluster, AggregatorHandle]) -> None:
    cluster, agg = env
    s = stream_for(cluster, agg, "node-e")
    s.send(report("node-victim", 1))
    msg = s.recv()
    assert msg.reject.code == grpc.StatusCode.PERMISSION_DENIED.value[0]
    assert "authenticated as 'node-e'" in msg.reject.message
    s.close()


def test_report_from_the_future_is_rejected(env: tuple[Cluster, AggregatorHandle]) -> None:
    cluster, agg = env
    s = stream_for(cluster, agg, "node-f")
    future = report("node-f", 1)
    future.report.time_unix_ns += 3600 * 10**9
    s.send(future)
    msg = s.recv()
    assert msg.reject.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "Check the node's clock" in msg.reject.message
    s.close()


def test_second_live_collector_for_a_node_is_refused(env: tuple[Cluster, AggregatorHandle]) -> None:
    cluster, agg = env
    first = stream_for(cluster, agg, "node-g", boot_id="boot-A")
    first.send(report("node-g", 1, boot_id="boot-A"))
    assert list(first.recv().ack.seqs) == [1]
    second = RawStream(agg.ingest, cluster.secrets.collector_token("node-g"))
    second.send(hello("node-g", boot_id="boot-B"))
    err = stream_error(second)
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "already streaming" in err.details() and "boot-B" in err.details()
    first.send(report("node-g", 2, boot_id="boot-A"))
    assert list(first.recv().ack.seqs) == [2], "the first collector is not disturbed"
    first.close()


def test_the_same_collector_reconnecting_takes_over(env: tuple[Cluster, AggregatorHandle]) -> None:
    cluster, agg = env
    old = stream_for(cluster, agg, "node-h", boot_id="boot-A")
    new = stream_for(cluster, agg, "node-h", boot_id="boot-A")
    err = stream_error(old)
    assert err.code() == grpc.StatusCode.ABORTED and "superseded" in err.details()
    new.send(report("node-h", 1, boot_id="boot-A"))
    assert list(new.recv().ack.seqs) == [1]
    new.close()


def test_everyone_else_was_served_throughout(env: tuple[Cluster, AggregatorHandle]) -> None:
    cluster, agg = env
    before = good_seqs(agg)
    wait_until(lambda: good_seqs(agg) >= before + 5, 15, "the good collector's reports to keep landing")
    assert agg.proc.alive()
    assert "rejected" not in (cluster.tmp / "good-node.log").read_text()
