"""Bad input on the ingest stream: each is refused with a precise gRPC status and message,
counted in the aggregator's own /metrics, logged with the node's name, and the aggregator
keeps serving everyone else (a real simulated collector streams throughout)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gpufleet.aggregator.store import EmbeddedStore
from gpufleet.protos.credentials import node_name_problem
from harness.processes import AggregatorHandle, Cluster
from harness.streams import RawStream, hello, report
from harness.waiting import wait_until


# Every refusal, with reports checked in the main process and in two ingest worker processes.
@pytest.fixture(scope="module", params=[0, 2], ids=["in-process", "workers"])
def env(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Cluster, AggregatorHandle]]:
    cluster = Cluster(tmp_path_factory.mktemp(f"badinput-{request.param}"))
    agg = cluster.aggregator(
        "aggregator",
        0,
        0,
        None,
        "--max-report-bytes",
        "8192",
        "--hello-timeout-s",
        "1",
        "--ingest-workers",
        str(request.param),
    )
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


def _hello(node: str, **changes: object) -> object:
    msg = hello(node)
    for name, value in changes.items():
        if name == "gpus":
            del msg.hello.gpus[:]
            for i in range(int(value)):  # type: ignore[call-overload]
                msg.hello.gpus.add(index=i, uuid=f"GPU-{i}", model="NVIDIA H100 80GB HBM3")
        else:
            setattr(msg.hello, name, value)
    return msg


BAD_HELLOS = [
    ("bad_node_name", _hello("bad node\n"), "node name 'bad node\\n' is not usable", "bad_name"),
    ("option_node_name", _hello("-oProxyCommand=x"), "it starts with '-'", "bad_name"),
    ("hostlist_node_name", _hello("gpu[001-128]"), "it holds '['", "bad_name"),
    (
        "bad_cluster_name",
        _hello("node-cl", cluster="eu\\west"),
        "cluster name 'eu\\\\west' is not usable",
        "bad_name",
    ),
    ("no_boot_id", _hello("node-b0", boot_id=""), "needs a boot_id", "bad_hello"),
    (
        "long_boot_id",
        _hello("node-b1", boot_id="b" * 65),
        "boot_id='" + "b" * 65 + "', which is 65 characters",
        "bad_hello",
    ),
    ("bad_interval", _hello("node-iv", interval_s=0.001),
     "interval_s=0.001, which is outside 0.05..3600 s", "bad_hello"),
    ("inf_interval", _hello("node-iv2", interval_s=float("inf")),
     "interval_s=inf, which is not a finite number", "bad_hello"),
    ("too_many_gpus", _hello("node-65", gpus=65),
     "hello has 65 gpus, more than the 64 accepted", "gpu_count"),
]  # fmt: skip


@pytest.mark.parametrize("name,msg,text,reason", BAD_HELLOS, ids=[b[0] for b in BAD_HELLOS])
def test_bad_hello_ends_the_stream_with_invalid_argument(
    env: tuple[Cluster, AggregatorHandle], name: str, msg: object, text: str, reason: str
) -> None:
    cluster, agg = env
    before = agg.metric_value("gpufleet_ingest_rejections_total", reason=reason)
    # No token can be issued for a name outside the grammar (test_adversarial_node.py): a bad
    # name comes with another node's credential, and the hello is refused by its field first.
    node = msg.hello.node  # type: ignore[attr-defined]
    token = cluster.secrets.collector_token("node-x" if node_name_problem(node) else node)
    s = RawStream(agg.ingest, token)
    s.send(msg)
    err = stream_error(s)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert text in err.details(), err.details()
    assert agg.metric_value("gpufleet_ingest_rejections_total", reason=reason) == before + 1


def test_no_hello_in_time_ends_the_stream(env: tuple[Cluster, AggregatorHandle]) -> None:
    cluster, agg = env
    before = agg.metric_value("gpufleet_ingest_rejections_total", reason="no_hello")
    s = RawStream(agg.ingest, cluster.secrets.collector_token("node-silent"))
    err = stream_error(s)  # sends nothing
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "no hello within 1 s of opening the stream" in err.details()
    assert agg.metric_value("gpufleet_ingest_rejections_total", reason="no_hello") == before + 1


def test_a_message_other_than_a_report_after_the_hello_ends_the_stream(
    env: tuple[Cluster, AggregatorHandle],
) -> None:
    cluster, agg = env
    before = agg.metric_value("gpufleet_ingest_rejections_total", reason="protocol")
    s = stream_for(cluster, agg, "node-twice")
    s.send(hello("node-twice"))
    err = stream_error(s)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "node 'node-twice': unexpected hello message after the hello" in err.details()
    assert agg.metric_value("gpufleet_ingest_rejections_total", reason="protocol") == before + 1


def _engines(r: object, n: int, gpu: int = 0) -> None:
    for i in range(n):
        r.engines.add(engine="vllm", port=8000 + i, gpu_indices=[gpu])  # type: ignore[attr-defined]


BAD_REPORT_FIELDS = [
    ("boot_id_mismatch", lambda r: setattr(r, "boot_id", "boot-other"), grpc.StatusCode.INVALID_ARGUMENT,
     "carries boot_id 'boot-other', the stream's is 'boot-1'", "boot_id"),
    ("seq_zero", lambda r: setattr(r, "seq", 0), grpc.StatusCode.INVALID_ARGUMENT,
     "seq must be 1..", "bad_seq"),
    ("seq_2^64-1", lambda r: setattr(r, "seq", 2**64 - 1), grpc.StatusCode.INVALID_ARGUMENT,
     "report seq 18446744073709551615: seq must be 1..9223372036854775807", "bad_seq"),
    ("older_than_retention", lambda r: setattr(r, "time_unix_ns", r.time_unix_ns - 30 * 86400 * 10**9),
     grpc.StatusCode.INVALID_ARGUMENT, "s from the aggregator's clock); accepted: up to", "timestamp"),
    ("plus_inf", lambda r: setattr(r.gpus[0], "power_w", float("inf")), grpc.StatusCode.INVALID_ARGUMENT,
     "gpus[0].power_w=inf, which is not a finite number", "bad_value"),
    ("minus_inf", lambda r: setattr(r.gpus[0], "temp_gpu_c", float("-inf")), grpc.StatusCode.INVALID_ARGUMENT,
     "gpus[0].temp_gpu_c=-inf, which is not a finite number", "bad_value"),
    ("too_many_engines", lambda r: _engines(r, 65), grpc.StatusCode.RESOURCE_EXHAUSTED,
     "has 65 engines and 0 events; limits are 64 and 1000", "oversized"),
    ("too_many_events", lambda r: [r.events.add() for _ in range(1001)], grpc.StatusCode.RESOURCE_EXHAUSTED,
     "has 0 engines and 1001 events; limits are 64 and 1000", "oversized"),
    ("control_char_in_tag", lambda r: setattr(r.gpus[0], "model", "H100\x1b[31m"),
     grpc.StatusCode.INVALID_ARGUMENT,
     "gpus[0].model='H100\\x1b[31m', which holds '\\x1b' at 4: no control characters", "bad_text"),
    ("stats_counter_2^64-1", lambda r: setattr(r.stats, "reports_dropped_total", 2**64 - 1),
     grpc.StatusCode.INVALID_ARGUMENT, "stats.reports_dropped_total=18446744073709551615, which is outside",
     "bad_value"),
]  # fmt: skip


@pytest.mark.parametrize(
    "name,change,code,text,reason", BAD_REPORT_FIELDS, ids=[b[0] for b in BAD_REPORT_FIELDS]
)
def test_each_refusal_names_its_field_and_is_counted_by_reason(
    env: tuple[Cluster, AggregatorHandle],
    name: str,
    change: object,
    code: grpc.StatusCode,
    text: str,
    reason: str,
) -> None:
    cluster, agg = env
    node = f"node-{name}".lower().replace("^", "")
    before = agg.metric_value("gpufleet_ingest_rejections_total", reason=reason)
    s = stream_for(cluster, agg, node)
    msg = report(node, 1)
    change(msg.report)  # type: ignore[operator]
    s.send(msg)
    answer = s.recv()
    assert answer.WhichOneof("body") == "reject", answer
    assert answer.reject.code == code.value[0] and answer.reject.seq == msg.report.seq
    assert answer.reject.message.startswith(f"node '{node}': report seq {msg.report.seq}")
    assert text in answer.reject.message, answer.reject.message
    s.send(report(node, 2))
    assert list(s.recv().ack.seqs) == [2], "the stream goes on"
    s.close()
    assert agg.metric_value("gpufleet_ingest_rejections_total", reason=reason) == before + 1


def _xid(r: object, **fields: object) -> None:
    from gpufleet.protos import vocabulary_pb2

    r.events.add(  # type: ignore[attr-defined]
        kind=vocabulary_pb2.EVENT_KIND_XID,
        xid=79,
        **{"time_unix_ns": r.time_unix_ns, **fields},  # type: ignore[attr-defined]
    )


# Parts that disagree with their stream (docs/security.md "Parts dropped, reports kept"): the
# part is dropped or marked, counted by reason, and the rest of the report stored and acked.
# Each with what the node's live view then shows: its engines' GPU indices, its XID events' GPUs.
DROPPED_PARTS = [
    ("engine_gpu_out_of_range", lambda r: _engines(r, 1, gpu=9), "gpu_index", [[]], []),
    ("engine_twice", lambda r: (_engines(r, 1), _engines(r, 1)), "engine", [[0]], []),
    ("event_gpu_out_of_range", lambda r: _xid(r, gpu_index=9), "gpu_index", [], [None]),
    ("event_out_of_window", lambda r: _xid(r, time_unix_ns=r.time_unix_ns - 30 * 86400 * 10**9), "timestamp",
     [], []),
]  # fmt: skip


@pytest.mark.parametrize(
    "name,change,reason,engines,xid_gpus", DROPPED_PARTS, ids=[d[0] for d in DROPPED_PARTS]
)
def test_an_inconsistent_part_is_dropped_or_marked_and_the_rest_of_the_report_stored(
    env: tuple[Cluster, AggregatorHandle],
    name: str,
    change: object,
    reason: str,
    engines: list[list[int]],
    xid_gpus: list[int | None],
) -> None:
    import uuid

    from gpufleet.protos import fleet_pb2
    from harness.fleet_api import bearer

    cluster, agg = env
    # A node of its own each run: the module's aggregator keeps a node's recent events.
    node = f"node-{name}-{uuid.uuid4().hex[:6]}".replace("_", "-")
    before = agg.metric_value("gpufleet_ingest_report_parts_dropped_total", reason=reason)
    s = stream_for(cluster, agg, node)
    msg = report(node, 1)
    change(msg.report)  # type: ignore[operator]
    s.send(msg)
    assert list(s.recv().ack.seqs) == [1], "the report is stored and acknowledged"
    s.close()
    assert agg.metric_value("gpufleet_ingest_report_parts_dropped_total", reason=reason) == before + 1
    detail = agg.fleet_stub().GetNode(
        fleet_pb2.GetNodeRequest(node=node), metadata=bearer(cluster.secrets.tokens["viewer"])
    )
    assert len(detail.summary.gpus) == 8, "the GPU samples stored"
    assert [list(e.gpu_indices) for e in detail.engines] == engines
    xids = [e for e in detail.recent_events if e.xid == 79]
    assert [e.gpu_index if e.HasField("gpu_index") else None for e in xids] == xid_gpus
