"""What is stored, under which names, with which units and which values are plausible.

Reports become points of three measurements:
- `gpu`       tags node, gpu, uuid, model, cluster — one point per GPU per report
- `engine`    tags node, engine, model, port, cluster — one per engine replica per report
- `collector` tags node, cluster — one per report: seq, boot_id and the collector's health
and events become points of `event` (tags node, kind, source, gpu).
Tags hold only bounded values (no PIDs, no free text).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpufleet.aggregator.store.base import Point
from gpufleet.protos import telemetry_pb2, vocabulary_pb2


@dataclass(frozen=True)
class Metric:
    name: str
    measurement: str
    unit: str
    help: str
    low: float
    high: float


# Bounds are sanity limits (what no real device reports), not health thresholds.
_TIB = 1 << 40
METRICS: dict[str, Metric] = {
    m.name: m
    for m in [
        Metric("util_gpu_pct", "gpu", "%", "GPU (SM) utilization", 0, 100),
        Metric("util_mem_pct", "gpu", "%", "memory-controller utilization", 0, 100),
        Metric("hbm_used_bytes", "gpu", "bytes", "HBM in use", 0, 16 * _TIB),
        Metric("hbm_total_bytes", "gpu", "bytes", "HBM size", 0, 16 * _TIB),
        Metric("temp_gpu_c", "gpu", "°C", "GPU core temperature", -40, 150),
        Metric("temp_mem_c", "gpu", "°C", "HBM temperature", -40, 150),
        Metric("power_w", "gpu", "W", "board power draw", 0, 5000),
        Metric("power_limit_w", "gpu", "W", "enforced power limit", 0, 5000),
        Metric("lost", "gpu", "bool", "1 when NVML answered GPU_IS_LOST", 0, 1),
        Metric("kv_cache_usage_ratio", "engine", "ratio", "KV-cache blocks in use", 0, 1),
        Metric("requests_running", "engine", "requests", "requests being decoded", 0, 1e7),
        Metric("requests_waiting", "engine", "requests", "requests queued", 0, 1e9),
        Metric("preemptions_total", "engine", "count", "requests preempted (counter)", 0, 1e15),
        Metric("prefix_cache_hit_ratio", "engine", "ratio", "prefix-cache hit ratio", 0, 1),
        Metric("seq", "collector", "", "report sequence number", 1, 2**63),
        Metric("gpu_count", "collector", "GPUs", "GPUs in the report", 0, 64),
        Metric("interval_s", "collector", "s", "the collector's sampling interval", 0, 3600),
        Metric(
            "reports_dropped_total",
            "collector",
            "reports",
            "reports the collector dropped (buffer full)",
            0,
            2**63,
        ),
        Metric("reports_rejected_total", "collector", "reports", "reports the aggregator rejected", 0, 2**63),
        Metric("unacked_reports", "collector", "reports", "reports awaiting acknowledgement", 0, 2**63),
        Metric("reconnects_total", "collector", "count", "collector reconnects", 0, 2**63),
        Metric("sample_errors_total", "collector", "count", "NVML calls that failed", 0, 2**63),
        Metric("sample_duration_s", "collector", "s", "time to sample all GPUs", 0, 3600),
    ]
}

# Fields of the wire messages that are identity, not measurements.
_GPU_IDENTITY = {"index", "uuid", "model", "pci_bus_id", "lost"}
_ENGINE_IDENTITY = {
    "engine",
    "model",
    "port",
    "endpoint",
    "gpu_indices",
    "readable",
    "unreadable_reason",
}
GPU_VALUE_FIELDS = [f.name for f in telemetry_pb2.GpuSample.DESCRIPTOR.fields if f.name not in _GPU_IDENTITY]
ENGINE_VALUE_FIELDS = [
    f.name for f in telemetry_pb2.EngineSample.DESCRIPTOR.fields if f.name not in _ENGINE_IDENTITY
]


# name -> (low, high), for the hot path: `low <= v <= high` is also False for NaN.
BOUNDS: dict[str, tuple[float, float]] = {m.name: (m.low, m.high) for m in METRICS.values()}


def check_value(metric: str, value: float) -> str | None:
    """None if value is plausible for metric, else why not."""
    spec = METRICS.get(metric)
    if isinstance(value, float) and not math.isfinite(value):
        return "is not a finite number"
    if spec and not spec.low <= value <= spec.high:
        return f"is outside {spec.low:g}..{spec.high:g} {spec.unit}".rstrip()
    return None


def report_to_points(report: telemetry_pb2.NodeReport) -> list[Point]:
    """The points a (validated) report is stored as. Absent fields stay absent."""
    ts = report.time_unix_ns
    node, cluster = report.node, report.cluster
    points: list[Point] = []
    for gpu in report.gpus:
        # HasField over a precomputed name list: about twice as fast as ListFields() here,
        # and this runs for every GPU of every report.
        fields: dict[str, float | int | str | bool] = {
            n: getattr(gpu, n) for n in GPU_VALUE_FIELDS if gpu.HasField(n)
        }
        fields["lost"] = gpu.lost
        tags = {"node": node, "gpu": str(gpu.index), "uuid": gpu.uuid, "model": gpu.model, "cluster": cluster}
        points.append(Point("gpu", tags, fields, ts))
    for eng in report.engines:
        fields = {n: getattr(eng, n) for n in ENGINE_VALUE_FIELDS if eng.HasField(n)}
        fields["readable"] = eng.readable
        if eng.unreadable_reason:
            fields["unreadable_reason"] = eng.unreadable_reason
        fields["gpu_indices"] = ",".join(str(i) for i in eng.gpu_indices)
        tags = {
            "node": node,
            "engine": eng.engine,
            "model": eng.model,
            "port": str(eng.port),
            "cluster": cluster,
        }
        points.append(Point("engine", tags, fields, ts))
    for ev in report.events:
        tags = {
            "node": node,
            "cluster": cluster,
            "kind": vocabulary_pb2.EventKind.Name(ev.kind).removeprefix("EVENT_KIND_").lower(),
            "source": vocabulary_pb2.EventSource.Name(ev.source).removeprefix("EVENT_SOURCE_").lower(),
            "gpu": str(ev.gpu_index) if ev.HasField("gpu_index") else "",
        }
        fields = {
            "xid": ev.xid,
            "message": ev.message,
            "pci_bus_id": ev.pci_bus_id,
            "pid": ev.pid,
            "process_name": ev.process_name,
        }
        points.append(Point("event", tags, fields, ev.time_unix_ns or ts))
    stats = report.stats
    points.append(
        Point(
            "collector",
            {"node": node, "cluster": cluster},
            {
                "seq": report.seq,
                "boot_id": report.boot_id,
                "interval_s": report.interval_s,
                "gpu_count": len(report.gpus),
                "reports_dropped_total": stats.reports_dropped_total,
                "reports_rejected_total": stats.reports_rejected_total,
                "unacked_reports": stats.unacked_reports,
                "reconnects_total": stats.reconnects_total,
                "sample_errors_total": stats.sample_errors_total,
                "sample_duration_s": stats.sample_duration_s,
            },
            ts,
        )
    )
    return points
