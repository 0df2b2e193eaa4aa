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


@dataclass(frozen=True)
class Metric:
    name: str
    measurement: str
    unit: str
    help: str
    low: float
    high: float


# Bounds are sanity limits (what no real device reports), not health thresholds; none is past
# what both stores can hold (SQLite and InfluxDB integers are int64).
INT64_MAX = 2**63 - 1
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
        Metric("clock_sm_mhz", "gpu", "MHz", "SM clock", 0, 10_000),
        Metric("clock_mem_mhz", "gpu", "MHz", "memory clock", 0, 50_000),
        Metric("clock_event_reasons", "gpu", "bitmask", "NVML clock-event (throttle) reasons", 0, INT64_MAX),
        Metric("throttle_thermal", "gpu", "bool", "thermal slowdown active", 0, 1),
        Metric("throttle_power", "gpu", "bool", "power cap or power brake active", 0, 1),
        Metric("ecc_sbe_volatile", "gpu", "errors", "corrected ECC errors since driver load", 0, INT64_MAX),
        Metric("ecc_dbe_volatile", "gpu", "errors", "uncorrected ECC errors since driver load", 0, INT64_MAX),
        Metric("ecc_sbe_aggregate", "gpu", "errors", "corrected ECC errors, lifetime", 0, INT64_MAX),
        Metric("ecc_dbe_aggregate", "gpu", "errors", "uncorrected ECC errors, lifetime", 0, INT64_MAX),
        Metric("retired_pages_sbe", "gpu", "pages", "pages retired for single-bit errors", 0, 2**32),
        Metric("retired_pages_dbe", "gpu", "pages", "pages retired for double-bit errors", 0, 2**32),
        Metric("retired_pages_pending", "gpu", "bool", "a page retirement waits for a reset", 0, 1),
        Metric("remap_correctable", "gpu", "rows", "rows remapped for correctable errors", 0, 2**32),
        Metric("remap_uncorrectable", "gpu", "rows", "rows remapped for uncorrectable errors", 0, 2**32),
        Metric("remap_pending", "gpu", "bool", "a row remap waits for a GPU reset", 0, 1),
        Metric("remap_failure", "gpu", "bool", "a row remap failed", 0, 1),
        Metric("pcie_replay_total", "gpu", "count", "PCIe replays (counter)", 0, INT64_MAX),
        Metric("nvlink_links_active", "gpu", "links", "NVLink links up", 0, 64),
        Metric("nvlink_links_inactive", "gpu", "links", "NVLink links down", 0, 64),
        Metric("nvlink_replay_total", "gpu", "count", "NVLink replay errors, all links", 0, INT64_MAX),
        Metric("nvlink_recovery_total", "gpu", "count", "NVLink recovery errors, all links", 0, INT64_MAX),
        Metric("nvlink_crc_total", "gpu", "count", "NVLink CRC errors, all links", 0, INT64_MAX),
        Metric("process_count", "gpu", "processes", "compute processes on the GPU", 0, 100_000),
        Metric("driver_unresponsive", "gpu", "bool", "an NVML call outlived the collector's deadline", 0, 1),
        Metric("driver_unresponsive_s", "gpu", "s", "how long the stuck NVML call has waited", 0, 1e9),
        Metric(
            "recovery_action",
            "gpu",
            "code",
            "NVML recovery action (0 none, 1 reset, 2 reboot)",
            0,
            255,
        ),
        Metric("pcie_link_gen", "gpu", "gen", "PCIe link generation now", 0, 16),
        Metric("pcie_link_gen_max", "gpu", "gen", "PCIe link generation GPU and slot can reach", 0, 16),
        Metric("pcie_link_width", "gpu", "lanes", "PCIe link width now", 0, 64),
        Metric("pcie_link_width_max", "gpu", "lanes", "PCIe link width GPU and slot can reach", 0, 64),
        Metric("fabric_state", "gpu", "state", "NVLink fabric state (3: completed)", 0, 16),
        Metric("fabric_status", "gpu", "code", "NVLink fabric probe's return code (0: ok)", 0, 2**32 - 1),
        Metric("ecc_sbe_rate_per_s", "gpu", "errors/s", "corrected ECC errors per second", 0, 1e12),
        Metric("clock_sm_target_mhz", "gpu", "MHz", "SM clock the clocks policy targets", 0, 10_000),
        Metric("sm_active_pct", "gpu", "%", "share of SMs busy (GPM)", 0, 100),
        Metric("tensor_active_pct", "gpu", "%", "share of time SMs ran tensor-core work (GPM)", 0, 100),
        Metric("kv_cache_usage_ratio", "engine", "ratio", "KV-cache blocks in use", 0, 1),
        Metric("requests_running", "engine", "requests", "requests being decoded", 0, 1e7),
        Metric("requests_waiting", "engine", "requests", "requests queued", 0, 1e9),
        Metric("preemptions_total", "engine", "count", "requests preempted (counter)", 0, 1e15),
        Metric("prefix_cache_hit_ratio", "engine", "ratio", "prefix-cache hit ratio", 0, 1),
        Metric("seq", "collector", "", "report sequence number", 1, INT64_MAX),
        Metric("gpu_count", "collector", "GPUs", "GPUs in the report", 0, 64),
        Metric("gpus_on_pci_bus", "collector", "GPUs", "NVIDIA GPUs on the PCI bus (sysfs)", 0, 1024),
        Metric("interval_s", "collector", "s", "the collector's sampling interval", 0, 3600),
        Metric(
            "reports_dropped_total",
            "collector",
            "reports",
            "reports the collector dropped (buffer full)",
            0,
            INT64_MAX,
        ),
        Metric(
            "reports_rejected_total", "collector", "reports", "reports the aggregator rejected", 0, INT64_MAX
        ),
        Metric("unacked_reports", "collector", "reports", "reports awaiting acknowledgement", 0, INT64_MAX),
        Metric("reconnects_total", "collector", "count", "collector reconnects", 0, INT64_MAX),
        Metric("sample_errors_total", "collector", "count", "NVML calls that failed", 0, INT64_MAX),
        Metric("nvml_calls_hung_total", "collector", "count", "NVML calls past the deadline", 0, INT64_MAX),
        Metric("sample_duration_s", "collector", "s", "time to sample all GPUs", 0, 3600),
        Metric(
            "kmsg_lines_unparsed_total",
            "collector",
            "lines",
            "kernel-log XID lines that did not parse",
            0,
            INT64_MAX,
        ),
        Metric(
            "xid_unknown_gpu_total",
            "collector",
            "count",
            "XIDs for a bus id that is no known GPU",
            0,
            INT64_MAX,
        ),
        Metric(
            "xid_duplicates_total",
            "collector",
            "count",
            "XIDs seen by NVML and kmsg, sent once",
            0,
            INT64_MAX,
        ),
        Metric(
            "engine_scrapes_failed_total", "collector", "count", "unreadable engine scrapes", 0, INT64_MAX
        ),
        Metric("xid_folded_total", "collector", "count", "identical XIDs folded into a count", 0, INT64_MAX),
        Metric(
            "kmsg_records_caught_up_total",
            "collector",
            "count",
            "XIDs logged before the collector started, reported at start",
            0,
            INT64_MAX,
        ),
    ]
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
_ENGINE_IDENTITY = {
    "engine",
    "model",
    "port",
    "endpoint",
    "gpu_indices",
    "readable",
    "unreadable_reason",
    "pool",
}
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
