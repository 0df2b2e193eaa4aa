"""GPU samples as columns (telemetry.proto GpuColumns): the bulk checks decide exactly as the
per-GPU checks do and give the same points; a collector and an aggregator agree on the layout
in the hello and the welcome, so a collector that does not offer columns, or an aggregator that
does not take them, is served per GPU as before."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from gpufleet.aggregator.ingest.validation import Checker, Rejection
from gpufleet.protos import columns, ingest_pb2, telemetry_pb2
from harness.processes import Cluster
from harness.repair import gpufleet_cli
from harness.stored import read_points
from harness.streams import hello
from harness.waiting import wait_until
from harness.wire_strategies import BOOT, GPUS, NODE, Case, reports


def _hello(columnar: bool) -> ingest_pb2.Hello:
    return hello(NODE, gpus=GPUS, boot_id=BOOT, columnar_gpus=columnar).hello


def _points(checker: Checker, report: telemetry_pb2.NodeReport, h: ingest_pb2.Hello) -> Any:
    try:
        return sorted(
            (p.measurement, sorted(p.tags.items()), sorted(p.fields.items()), p.time_unix_ns)
            for p in checker.check_report(report, h, now_ns=report.time_unix_ns or time.time_ns())
        )
    except Rejection as r:
        return r


@pytest.mark.slow
@settings(max_examples=400, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(case=reports())
def test_columns_and_per_gpu_samples_are_judged_and_stored_alike(case: Case) -> None:
    """Any report, its GPU samples sent either way: both accepted with the same points, or both
    refused (each naming a field). One checker per layout serves every example, as in the
    aggregator, so the layout plans and identity caches are exercised too."""
    per_gpu = case.report
    columnar = telemetry_pb2.NodeReport()
    columnar.CopyFrom(per_gpu)
    columnar.ClearField("gpus")
    if per_gpu.gpus:
        columnar.gpu_columns.CopyFrom(columns.to_columns(per_gpu.gpus))
    a = _points(_PER_GPU, per_gpu, _hello(False))
    b = _points(_COLUMNAR, columnar, _hello(True))
    if isinstance(a, Rejection) or isinstance(b, Rejection):
        assert isinstance(a, Rejection) and isinstance(b, Rejection), (a, b)
        assert not case.valid, b.message
        return
    assert a == b


_PER_GPU = Checker(1024 * 1024, 14 * 86400, 300)
_COLUMNAR = Checker(1024 * 1024, 14 * 86400, 300)


@pytest.mark.slow
@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(case=reports())
def test_columns_read_back_into_the_samples_they_were_made_of(case: Case) -> None:
    samples = list(case.report.gpus)
    if not case.valid:
        return
    assert columns.to_samples(columns.to_columns(samples)) == samples


def test_a_columnar_report_on_a_stream_that_did_not_offer_columns_is_refused() -> None:
    report = telemetry_pb2.NodeReport(
        node=NODE, cluster="test", boot_id=BOOT, seq=1, time_unix_ns=time.time_ns()
    )
    report.gpu_columns.CopyFrom(
        columns.to_columns(
            [telemetry_pb2.GpuSample(index=0, uuid=f"GPU-{NODE}-0", model=hello(NODE).hello.gpus[0].model)]
        )
    )
    refused = _points(_COLUMNAR, report, _hello(False))
    assert isinstance(refused, Rejection) and "did not say columnar_gpus" in refused.message
    both = telemetry_pb2.NodeReport()
    both.CopyFrom(report)
    both.gpus.add(index=1)
    refused = _points(_COLUMNAR, both, _hello(True))
    assert isinstance(refused, Rejection) and "both gpus and gpu_columns" in refused.message


def test_a_columnar_and_a_per_gpu_collector_are_stored_and_shown_alike(cluster: Cluster) -> None:
    """Two real collectors, one sending columns (the default) and one told not to, on one real
    aggregator with ingest workers: every GPU of both stored with the same fields, both nodes'
    GPUs in `gpufleet node`, and the welcome told the first it may send columns."""
    agg = cluster.aggregator("aggregator", 0, 0, None, "--ingest-workers", "2")
    by_columns = cluster.collector("columns-node", agg.ingest, "--interval-s", "0.5")
    per_gpu = cluster.collector("per-gpu-node", agg.ingest, "--interval-s", "0.5", "--no-columnar-gpus")

    def stored() -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        for tags, fields, _ in read_points(agg.data_dir, "gpu"):
            out.setdefault(tags["node"], []).append((tags["gpu"], sorted(fields)))
        return out

    def two_samples_each() -> bool:
        """Both nodes' GPUs stored at least twice: a GPU's first sample has no corrected-error
        rate yet (it is per second between two samples), so a node stored once and one stored
        twice differ by that field (one six-worker run compared them so)."""
        got = stored()
        return {"columns-node", "per-gpu-node"} <= set(got) and all(len(rows) >= 16 for rows in got.values())

    wait_until(two_samples_each, 30, "both nodes' GPUs stored twice")
    got = stored()
    fields_by_node = {node: {tuple(f) for _, f in rows} for node, rows in got.items()}
    assert fields_by_node["columns-node"] == fields_by_node["per-gpu-node"], fields_by_node
    assert {g for g, _ in got["columns-node"]} == {str(i) for i in range(8)}
    for node in ("columns-node", "per-gpu-node"):
        shown = gpufleet_cli(agg, cluster, "viewer", "node", node, "--json")
        assert shown.returncode == 0, shown.stderr
        assert '"util_gpu_pct"' in shown.stdout and shown.stdout.count('"uuid"') >= 8, shown.stdout[:400]
    assert "GPU samples as columns" in by_columns.log()
    assert "GPU samples per GPU" in per_gpu.log()
