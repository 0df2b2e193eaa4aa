"""What is stored, under which names, with which units and which values are plausible.

Reports become points of three measurements:
- `gpu`       tags node, gpu, uuid, model, cluster — one point per GPU per report
- `engine`    tags node, engine, model, port, cluster — one per engine replica per report
- `collector` tags node, cluster — one per report: seq, boot_id and the collector's health
and events become points of `event` (tags node, kind, source, gpu).
Tags hold only bounded values (no PIDs, no free text).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

from gpufleet.aggregator.store.base import FieldValue, Point, SharedTags
from gpufleet.protos import telemetry_pb2
from gpufleet.protos.names import event_kind_name, event_source_name
from gpufleet.protos.signals import (
    COLLECTOR_SIGNALS,
    ENGINE_NOT_SIGNALS,
    ENGINE_SIGNALS,
    GPU_SIGNALS,
    INT64_MAX,
)


@dataclass(frozen=True)
class Metric:
    name: str
    measurement: str
    unit: str
    help: str
    low: float
    high: float
    source: str = ""  # a GPU signal's NVML source (the signal catalog's)


# Bounds are sanity limits (what no real device reports), not health thresholds; none is past
# what both stores can hold (SQLite and InfluxDB integers are int64).
METRICS: dict[str, Metric] = {
    # The GPU, engine and collector signals are the signal catalog's (protos/signals.py); the
    # report's own fields below are not signals a collector measures.
    **{s.field: Metric(s.field, "gpu", s.unit, s.help, s.low, s.high, s.nvml) for s in GPU_SIGNALS.values()},
    **{s.field: Metric(s.field, "engine", s.unit, s.help, s.low, s.high) for s in ENGINE_SIGNALS.values()},
    **{
        s.field: Metric(s.field, "collector", s.unit, s.help, s.low, s.high)
        for s in COLLECTOR_SIGNALS.values()
    },
    **{
        m.name: m
        for m in [
            Metric("seq", "collector", "", "report sequence number", 1, INT64_MAX),
            Metric("gpu_count", "collector", "GPUs", "GPUs in the report", 0, 64),
            Metric("gpus_on_pci_bus", "collector", "GPUs", "NVIDIA GPUs on the PCI bus (sysfs)", 0, 1024),
            Metric("interval_s", "collector", "s", "the collector's sampling interval", 0, 3600),
        ]
    },
}

# Each measurement's tags: what history can filter and group by (roll-ups keep their source's).
TAGS: dict[str, tuple[str, ...]] = {
    "gpu": ("cluster", "model", "node", "gpu", "uuid"),
    "engine": ("cluster", "model", "node", "engine", "port"),
    "collector": ("cluster", "node"),
    "event": ("cluster", "node", "gpu", "kind", "source"),
}

# Fields of the wire messages that are identity, not measurements.
_GPU_IDENTITY = {"index", "uuid", "model", "pci_bus_id", "lost", "processes"}
_ENGINE_IDENTITY = ENGINE_NOT_SIGNALS  # which replica, where, whether it was read
GPU_VALUE_FIELDS = [f.name for f in telemetry_pb2.GpuSample.DESCRIPTOR.fields if f.name not in _GPU_IDENTITY]
ENGINE_VALUE_FIELDS = [
    f.name for f in telemetry_pb2.EngineSample.DESCRIPTOR.fields if f.name not in _ENGINE_IDENTITY
]


# What a GPU point's tags and its `lost` field are made of, with proto3's value for "not set".
GPU_IDENTITY: tuple[tuple[str, object], ...] = (("index", 0), ("uuid", ""), ("model", ""), ("lost", False))
_ENGINE_VALUES = frozenset(ENGINE_VALUE_FIELDS)
# The collector's own counters, stored with every report (0 when the collector sent none).
_STATS_NAMES = tuple(f.name for f in telemetry_pb2.CollectorStats.DESCRIPTOR.fields)
_stats_values = operator.attrgetter(*_STATS_NAMES)
_TAG_CACHE_MAX = 200_000


def _present(msg: object, wanted: frozenset[str]) -> dict[str, float | int | str | bool]:
    # ListFields walks only the fields the message carries: absent stays absent, and the
    # values are already checked against wire_rules.RULES by the time a report is converted.
    return {fd.name: v for fd, v in msg.ListFields() if fd.name in wanted}  # type: ignore[attr-defined]


class PointConverter:
    """Turns checked reports into points.

    Keeps the tag dicts of the GPUs it has seen, so the same GPU's points share one tags
    object across reports (less to build per report; bounded, cleared when full)."""

    def __init__(self) -> None:
        self._gpu_tags: dict[tuple[str, str, int, str, str], SharedTags] = {}
        self._node_tags: dict[tuple[str, str], SharedTags] = {}

    def convert(
        self, report: telemetry_pb2.NodeReport, gpu_rows: list[tuple[dict[str, FieldValue], tuple]]
    ) -> list[Point]:
        """The points a checked report is stored as; gpu_rows holds each GPU sample's
        measurement fields as the check copied them and its GPU_IDENTITY values. Absent
        fields stay absent."""
        ts = report.time_unix_ns
        node, cluster = report.node, report.cluster
        points: list[Point] = []
        cache = self._gpu_tags
        for fields, (index, uuid, model, lost) in gpu_rows:
            fields["lost"] = lost
            key = (node, cluster, index, uuid, model)
            tags = cache.get(key)
            if tags is None:
                if len(cache) >= _TAG_CACHE_MAX:
                    cache.clear()
                tags = cache[key] = SharedTags(
                    node=node, gpu=str(index), uuid=uuid, model=model, cluster=cluster
                )
            points.append(Point("gpu", tags, fields, ts))
        node_tags = self._node_tags.get((node, cluster))
        if node_tags is None:
            if len(self._node_tags) >= _TAG_CACHE_MAX:
                self._node_tags.clear()
            node_tags = self._node_tags[(node, cluster)] = SharedTags(node=node, cluster=cluster)
        points.extend(_engine_event_collector_points(report, node, cluster, ts, node_tags))
        return points


def _engine_event_collector_points(
    report: telemetry_pb2.NodeReport, node: str, cluster: str, ts: int, node_tags: SharedTags
) -> list[Point]:
    points: list[Point] = []
    for eng in report.engines:
        fields = _present(eng, _ENGINE_VALUES)
        fields["readable"] = eng.readable
        if eng.unreadable_reason:
            fields["unreadable_reason"] = eng.unreadable_reason
        if eng.pool:
            fields["pool"] = eng.pool
        fields["gpu_indices"] = ",".join(str(i) for i in eng.gpu_indices)
        tags = {
            "node": node,
            "engine": eng.engine,
            "model": eng.model,
            "port": str(eng.port),
            "cluster": cluster,
        }
        points.append(Point("engine", tags, fields, ts))
    taken: set[tuple[tuple[tuple[str, str], ...], int]] = set()
    for ev in report.events:
        tags = {
            "node": node,
            "cluster": cluster,
            "kind": event_kind_name(ev.kind),
            "source": event_source_name(ev.source),
        }
        if ev.HasField("gpu_index"):  # an XID for an unknown bus id has no GPU (and no empty tag)
            tags["gpu"] = str(ev.gpu_index)
        fields = {
            "xid": ev.xid,
            "message": ev.message,
            "pci_bus_id": ev.pci_bus_id,
            "pid": ev.pid,
            "process_name": ev.process_name,
            # A folded XID storm (docs/architecture.md "XID storms"): how many, since when.
            "count": max(1, ev.count),
        }
        if ev.first_time_unix_ns:
            fields["first_time_unix_ns"] = ev.first_time_unix_ns
        if ev.kmsg_seq:  # which kernel-log record (collector/kmsg_cursor.py)
            fields["kmsg_seq"] = ev.kmsg_seq
        # Two events of one report with the same tags and nanosecond would be one point (a
        # point's identity is measurement + tags + time): the later one is kept 1 ns after.
        event_ts, key = ev.time_unix_ns or ts, tuple(tags.items())
        while (key, event_ts) in taken:
            event_ts += 1
        taken.add((key, event_ts))
        points.append(Point("event", tags, fields, event_ts))
    fields = dict(zip(_STATS_NAMES, _stats_values(report.stats), strict=True))
    fields["seq"] = report.seq
    fields["boot_id"] = report.boot_id
    fields["interval_s"] = report.interval_s
    # An event-only report (XIDs pushed between ticks) says nothing of the GPU count.
    if report.gpus:
        fields["gpu_count"] = len(report.gpus)
    elif report.HasField("gpu_columns"):
        fields["gpu_count"] = report.gpu_columns.count
    if report.HasField("gpus_on_pci_bus"):
        fields["gpus_on_pci_bus"] = report.gpus_on_pci_bus
    points.append(Point("collector", node_tags, fields, ts))
    return points
