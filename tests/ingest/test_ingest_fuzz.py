"""Property-based ingest: whole reports and hellos generated over the proto descriptors, every
field at its edges, sent over real loopback gRPC to a real aggregator process, on the embedded
store and on a real influxd.

Each report is either acknowledged and read back from the store with exactly the values sent,
or refused with a Reject whose message names the field; a healthy node streaming alongside
keeps getting its acks within 2 s the whole time, and the aggregator keeps running. The
examples that once stopped ingest are kept below as explicit regression cases.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis.control import currently_in_test_context

from gpufleet.aggregator.ingest.schema import ENGINE_VALUE_FIELDS, GPU_VALUE_FIELDS
from gpufleet.aggregator.store.influx import InfluxStore
from gpufleet.protos import ingest_pb2, telemetry_pb2
from gpufleet.protos.names import event_kind_name, event_source_name
from harness.influx import influx_flags
from harness.processes import AggregatorHandle, Cluster
from harness.stored import read_points
from harness.streams import HealthyNode, RawStream, hello
from harness.waiting import wait_until
from harness.wire_strategies import (
    BOOT,
    CLUSTER,
    GPUS,
    MODEL,
    NODE,
    Case,
    declared_uuid,
    hellos,
    next_report_time_ns,
    reports,
)

CODES = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.PERMISSION_DENIED,
}
# How a refusal names what it refuses: a field and its value, or the stream-level fact.
NAMES_THE_FIELD = re.compile(
    r"has [\w.\[\]]+=|has \d+ [\w.\[\]]+, more than|names node|carries boot_id|seq must be|"
    r"time_unix_ns=|GPU index|names GPU|event for GPU|is \d+ bytes|engines and \d+ events|twice|"
    r"above hbm_total_bytes|names cluster|has GPU \d+ as uuid|has GPU \d+ \w+=|gpu_columns"
)

HELLO_NAMES_THE_FIELD = re.compile(
    r"has [\w.\[\]]+=|has \d+ [\w.\[\]]+, more than|protocol version|node name|cluster name|boot_id|"
    r"interval_s|GPU indices"
)


# --- reading back ---------------------------------------------------------------------------
class ReadBack:
    """The stored points of one report time, by measurement, from the store itself."""

    def __init__(self, kind: str, target: str) -> None:
        self.kind, self.target = kind, target

    def points(
        self, measurement: str, start_ns: int, end_ns: int
    ) -> list[tuple[dict[str, str], dict[str, Any], int]]:
        if self.kind == "influxdb":
            url, database = self.target.rsplit("#", 1)
            store = InfluxStore(url, database, create_database=False)
            try:
                found = store.query_points(measurement, start_ns, end_ns, {"node": [NODE]})
            finally:
                store.close()
            return [(dict(p.tags), dict(p.fields), p.time_unix_ns) for p in found]
        found = read_points(Path(self.target), measurement, start_ns, end_ns)
        return [(tags, fields, ts) for tags, fields, ts in found if tags.get("node") == NODE]


def _same(sent: Any, stored: Any) -> bool:
    if isinstance(sent, bool):
        return stored is sent or (type(stored) is int and stored == int(sent))  # SQLite keeps 0/1
    return type(stored) is not bool and sent == stored


def _tags(tags: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in tags.items() if v != ""}  # InfluxDB keeps no empty tag


def _window_ns() -> tuple[int, int]:
    """The times the aggregator accepts now: its defaults (the env's aggregator sets neither),
    retention_s back and max_clock_skew_s ahead. The fuzzed times are at a report's time or at the
    edges of their range, never near the window's ends."""
    from gpufleet.aggregator.config import AggregatorConfig

    config, now = AggregatorConfig(), time.time_ns()
    return now - int(config.retention_s * 1e9), now + int(config.max_clock_skew_s * 1e9)


def expected_points(case: Case) -> dict[str, list[tuple[dict[str, str], dict[str, Any]]]]:
    """What the store must hold of an acknowledged report: for a columnar one, the GPU samples its
    columns were made from, value for value. Written from the storage contract
    (docs/components.md's measurements and tags), not by calling aggregator/ingest/schema.py's
    converter: a test that asked the converter what it should have stored would pass whatever it
    stored. The vocabulary (which fields are values, the events' kind and source names) is the
    product's, read from where it is defined."""
    r = case.report
    samples = case.gpu_samples()
    gpus = []
    for g in samples:
        fields: dict[str, Any] = {fd.name: v for fd, v in g.ListFields() if fd.name in GPU_VALUE_FIELDS}
        fields["lost"] = g.lost
        tags = {"node": r.node, "gpu": str(g.index), "uuid": g.uuid, "model": g.model, "cluster": r.cluster}
        gpus.append((tags, fields))
    # Parts that disagree with the stream are dropped or marked, the rest stored (docs/security.md
    # "Parts dropped, reports kept"): an engine a second time is dropped; an engine keeps only the
    # GPUs the hello declared; an event outside the accepted time window is dropped, one for a GPU
    # the hello did not declare is kept as the node's, a folded XID's first time after its last
    # is dropped from it.
    engines = []
    seen_engines: set[tuple[str, str, int]] = set()
    oldest_ns, newest_ns = _window_ns()
    for e in r.engines:
        if (e.engine, e.model, e.port) in seen_engines:
            continue
        seen_engines.add((e.engine, e.model, e.port))
        fields = {fd.name: v for fd, v in e.ListFields() if fd.name in ENGINE_VALUE_FIELDS}
        declared = [i for i in e.gpu_indices if i < GPUS]
        fields.update(readable=e.readable, gpu_indices=",".join(map(str, declared)))
        if e.unreadable_reason:
            fields["unreadable_reason"] = e.unreadable_reason
        if e.pool:
            fields["pool"] = e.pool
        tags = {
            "node": r.node,
            "engine": e.engine,
            "model": e.model,
            "port": str(e.port),
            "cluster": r.cluster,
        }
        engines.append((tags, fields))
    events = []
    for ev in r.events:
        if ev.time_unix_ns and not oldest_ns <= ev.time_unix_ns <= newest_ns:
            continue
        tags = {
            "node": r.node,
            "cluster": r.cluster,
            "kind": event_kind_name(ev.kind),
            "source": event_source_name(ev.source),
        }
        if ev.HasField("gpu_index") and ev.gpu_index < GPUS:
            tags["gpu"] = str(ev.gpu_index)
        fields = {
            "xid": ev.xid,
            "message": ev.message,
            "pci_bus_id": ev.pci_bus_id,
            "pid": ev.pid,
            "process_name": ev.process_name,
            "count": max(1, ev.count),  # a folded storm's count; one occurrence when unset
        }
        if ev.first_time_unix_ns and oldest_ns <= ev.first_time_unix_ns <= (ev.time_unix_ns or newest_ns):
            fields["first_time_unix_ns"] = ev.first_time_unix_ns
        if ev.kmsg_seq:
            fields["kmsg_seq"] = ev.kmsg_seq
        events.append((tags, fields))
    s = r.stats
    collector = {
        "seq": r.seq,
        "boot_id": r.boot_id,
        "interval_s": r.interval_s,
        **{fd.name: getattr(s, fd.name) for fd in telemetry_pb2.CollectorStats.DESCRIPTOR.fields},
        **({"gpu_count": len(samples)} if r.gpus or r.HasField("gpu_columns") else {}),
        **({"gpus_on_pci_bus": r.gpus_on_pci_bus} if r.HasField("gpus_on_pci_bus") else {}),
    }
    return {
        "gpu": gpus,
        "engine": engines,
        "event": events,
        "collector": [({"node": r.node, "cluster": r.cluster}, collector)],
    }


def assert_stored_exactly(read: ReadBack, case: Case) -> None:
    ts = case.report.time_unix_ns
    for measurement, wanted in expected_points(case).items():
        end = ts + (100_000 if measurement == "event" else 1)
        stored = read.points(measurement, ts, end)
        got = sorted((sorted(_tags(t).items()), sorted(f.items())) for t, f, _ in stored)
        want = sorted((sorted(_tags(t).items()), sorted(f.items())) for t, f in wanted)
        assert len(got) == len(want), f"{measurement}: stored {got}, sent {want}"
        for (gt, gf), (wt, wf) in zip(got, want, strict=True):
            assert gt == wt, f"{measurement} tags: stored {gt}, sent {wt}"
            assert [k for k, _ in gf] == [k for k, _ in wf], f"{measurement} fields: stored {gf}, sent {wf}"
            for (k, stored_v), (_, sent_v) in zip(gf, wf, strict=True):
                assert _same(sent_v, stored_v), f"{measurement}.{k}: stored {stored_v!r}, sent {sent_v!r}"


# --- the servers ----------------------------------------------------------------------------
@dataclass
class Env:
    cluster: Cluster
    agg: AggregatorHandle
    read: ReadBack
    healthy: HealthyNode


def _env(
    cluster: Cluster, store_flags: tuple[str, ...], read: Callable[[AggregatorHandle], ReadBack]
) -> Iterator[Env]:
    agg = cluster.aggregator("aggregator", 0, 0, None, *store_flags)
    healthy = HealthyNode(agg.ingest, cluster.secrets.collector_token("healthy-node"))
    env = Env(cluster, agg, read(agg), healthy)
    try:
        yield env
        # The whole time, the healthy node was served within 2 s, and nothing died. Served at
        # least five times: waited for, since how long this module's tests ran here depends on
        # how many of them this worker got (pytest-xdist shares them out).
        wait_until(lambda: len(healthy.latencies_s) >= 5, 30, "five reports of the healthy node acknowledged")
        healthy.close()
        assert not healthy.errors, healthy.errors
        assert len(healthy.latencies_s) >= 5 and healthy.worst_ack_s < 2.0, healthy.latencies_s
        assert agg.proc.alive()
        assert agg.metric_value("gpufleet_task_restarts_total") == 0
        assert agg.metric_value("gpufleet_writer_errors_total") == 0
    finally:
        healthy.close()
        cluster.stop_all()


# Both stores, and both ingest paths: in the main process, and through two ingest worker
# processes (aggregator/ingest/worker_pool.py), where the same checks and writer run in another process.
@pytest.fixture(
    scope="module",
    # The fast subset keeps one (the embedded store in-process); the others are slow.
    params=[
        ("embedded", 0),
        pytest.param(("influxdb", 0), marks=pytest.mark.slow),
        pytest.param(("embedded", 2), marks=pytest.mark.slow),
        pytest.param(("influxdb", 2), marks=pytest.mark.slow),
    ],
    ids=["embedded", "influxdb", "embedded-workers", "influxdb-workers"],
)
def env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    store, workers = request.param
    cluster = Cluster(tmp_path_factory.mktemp(f"fuzz-{store}-{workers}"))
    # Every example names engines of its own: the per-node series cap (its own test in
    # test_adversarial_node.py) is set past what 120 examples make.
    flags: tuple[str, ...] = ("--ingest-workers", str(workers), "--max-series-per-node", "100000")
    if store == "embedded":
        yield from _env(cluster, flags, lambda agg: ReadBack("embedded", str(agg.data_dir)))
    else:
        url = request.getfixturevalue("influxd")
        database = f"fuzz_{time.time_ns()}"
        yield from _env(
            cluster,
            (*flags, *influx_flags(url, database)),
            lambda agg: ReadBack("influxdb", f"{url}#{database}"),
        )


def send(env: Env, r: telemetry_pb2.NodeReport, columnar_hello: bool = False) -> Any:
    """One report on a stream of its own (the same boot: each new stream supersedes the last),
    so one example's answer can never be read as another's."""
    stream = RawStream(env.agg.ingest, env.cluster.secrets.collector_token(NODE))
    try:
        stream.send(hello(NODE, gpus=GPUS, boot_id=BOOT, columnar_gpus=columnar_hello))
        assert stream.recv(timeout_s=15).WhichOneof("body") == "welcome"
        stream.send(ingest_pb2.CollectorMessage(report=r))
        while True:
            answer = stream.recv(timeout_s=15)
            # A report with a fault in it may make the repair controller send a command (a GPU
            # reset) down this stream before the report's answer: not what is checked here.
            if answer.WhichOneof("body") != "command":
                return answer
    finally:
        stream.close()


def check_outcome(env: Env, case: Case) -> None:
    r = case.report
    answer = send(env, r, case.columnar_hello)
    body = answer.WhichOneof("body")
    if currently_in_test_context():  # counted for --hypothesis-show-statistics
        event(f"{'valid' if case.valid else 'edge'} report: {body}")
    if body == "ack":
        assert list(answer.ack.seqs) == [r.seq]
        assert case.samples is not None or not r.HasField("gpu_columns"), "broken columns were stored"
        assert_stored_exactly(env.read, case)
        return
    assert body == "reject", answer
    assert not case.valid, f"a report of valid values was refused: {answer.reject.message}"
    assert answer.reject.seq == r.seq
    assert grpc.StatusCode(_code(answer.reject.code)) in CODES, answer.reject
    assert answer.reject.message.startswith(f"node {NODE!r}: report seq {r.seq}"), answer.reject.message
    assert NAMES_THE_FIELD.search(answer.reject.message), answer.reject.message


def _code(number: int) -> tuple[int, str]:
    return next(c.value for c in grpc.StatusCode if c.value[0] == number)


FUZZ = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,  # the same examples on every run: a red run is a real finding, not luck
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)


@FUZZ
@given(case=reports())
def test_every_report_is_stored_exactly_or_refused_by_field(env: Env, case: Case) -> None:
    check_outcome(env, case)


@FUZZ
@given(case=reports(columnar=True))
def test_every_columnar_report_is_stored_exactly_or_refused_by_field(env: Env, case: Case) -> None:
    """The same, with the GPU samples in columns (GpuColumns): the bulk checks refuse what the
    per-GPU checks refuse, name the GPU and the field, and store exactly what was sent; a batch
    broken in its own structure is refused whole."""
    check_outcome(env, case)


def _regression(build: Callable[[telemetry_pb2.NodeReport], None]) -> Case:
    r = telemetry_pb2.NodeReport(
        node=NODE, cluster=CLUSTER, boot_id=BOOT, seq=1, time_unix_ns=next_report_time_ns()
    )
    r.gpus.add(index=0, uuid=declared_uuid(0), model=MODEL, util_gpu_pct=10.0)
    build(r)
    return Case(r, valid=False)


# Reports that once stopped ingest for the whole fleet or killed a writer (issue: ingest that
# nothing stops), and the examples the fuzzer found since. Each must be refused alone, or (an
# engine twice, since parts are dropped and reports kept) stored as the contract says.
REGRESSIONS = {
    "seq_2^64-1": lambda r: setattr(r, "seq", 2**64 - 1),
    "stats_counter_2^64-1": lambda r: setattr(r.stats, "reconnects_total", 2**64 - 1),
    "event_pid_2^64-1": lambda r: r.events.add(pid=2**64 - 1),
    "nan_sample_duration": lambda r: setattr(r.stats, "sample_duration_s", math.nan),
    "counter_2^63_exactly": lambda r: setattr(r.gpus[0], "ecc_dbe_aggregate", 2**63),
    "unknown_event_kind": lambda r: r.events.add(kind=99),
    "duplicate_engine": lambda r: r.engines.extend(
        [telemetry_pb2.EngineSample(engine="vllm", port=8000)] * 2
    ),
}


@pytest.mark.parametrize("name", list(REGRESSIONS))
def test_reports_that_once_stopped_ingest_are_refused_alone(env: Env, name: str) -> None:
    check_outcome(env, _regression(REGRESSIONS[name]))
    good = _regression(lambda r: None)
    good.valid = True
    check_outcome(env, good)  # the same stream goes on


@settings(FUZZ, max_examples=40)
@given(h=hellos())
def test_every_hello_is_welcomed_or_refused_by_field(env: Env, h: ingest_pb2.Hello) -> None:
    from gpufleet.protos.credentials import node_name_problem

    # The stream's credential is the hello's node when that is a name one can be issued for;
    # else another node's: the hello is refused by its field before the two are compared.
    s = RawStream(
        env.agg.ingest,
        env.cluster.secrets.collector_token("fuzz-other" if node_name_problem(h.node) else h.node),
    )
    try:
        s.send(ingest_pb2.CollectorMessage(hello=h))
        try:
            first = s.recv(timeout_s=15)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.ALREADY_EXISTS:  # the same random name twice in a row
                assert "already streaming" in err.details()
                return
            assert err.code() in {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION}, err
            assert HELLO_NAMES_THE_FIELD.search(err.details()), err.details()
            return
        assert first.WhichOneof("body") == "welcome"
    finally:
        s.close()
    wait_until(lambda: env.agg.proc.alive(), 1, "the aggregator to be alive")
