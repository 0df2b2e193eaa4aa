"""The collector's Prometheus text endpoint (/metrics), for teams that already scrape
Prometheus: every GPU field of the last sample, with node/cluster/gpu/uuid/model labels; XIDs
counted by GPU and number; each inference engine's KV-cache pressure; the collector's own
health. deploy/prometheus/ has alert rules and deploy/grafana/ a dashboard built on these names.

Names follow Prometheus conventions (base units: ratios not percent, hertz not MHz, watts,
celsius, bytes; counters end in _total). A field the GPU does not report has no sample —
absent, never 0. The gpufleet field each comes from is in the HELP text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpufleet.common.bounded_http import serve as serve_routes
from gpufleet.protos import telemetry_pb2

_LABELS = ["node", "cluster", "gpu", "uuid", "model"]
_ENGINE_LABELS = ["node", "cluster", "engine", "model", "port"]


@dataclass(frozen=True)
class _Field:
    field: str  # GpuSample field
    name: str  # Prometheus name (without gpufleet_gpu_ and, for counters, _total)
    help: str
    scale: float = 1.0
    counter: bool = False


GPU_FIELDS = [
    _Field("util_gpu_pct", "utilization_ratio", "GPU (SM) utilization, 0-1", 0.01),
    _Field("util_mem_pct", "memory_utilization_ratio", "memory-controller utilization, 0-1", 0.01),
    _Field("hbm_used_bytes", "hbm_used_bytes", "HBM in use"),
    _Field("hbm_total_bytes", "hbm_total_bytes", "HBM size"),
    _Field("temp_gpu_c", "temperature_celsius", "GPU core temperature"),
    _Field("temp_mem_c", "memory_temperature_celsius", "HBM temperature"),
    _Field("power_w", "power_watts", "board power draw"),
    _Field("power_limit_w", "power_limit_watts", "enforced power limit"),
    _Field("clock_sm_mhz", "sm_clock_hertz", "SM clock", 1e6),
    _Field("clock_mem_mhz", "memory_clock_hertz", "memory clock", 1e6),
    _Field("clock_event_reasons", "clock_event_reasons", "NVML clock-event (throttle) reason bitmask"),
    _Field("throttle_thermal", "thermal_slowdown", "1 while a thermal slowdown is active"),
    _Field("throttle_power", "power_slowdown", "1 while a power cap or power brake slowdown is active"),
    _Field(
        "ecc_sbe_volatile", "ecc_corrected_volatile", "corrected ECC errors since driver load", counter=True
    ),
    _Field(
        "ecc_dbe_volatile",
        "ecc_uncorrected_volatile",
        "uncorrected ECC errors since driver load",
        counter=True,
    ),
    _Field("ecc_sbe_aggregate", "ecc_corrected_aggregate", "corrected ECC errors, lifetime", counter=True),
    _Field(
        "ecc_dbe_aggregate", "ecc_uncorrected_aggregate", "uncorrected ECC errors, lifetime", counter=True
    ),
    _Field("retired_pages_sbe", "retired_pages_single_bit", "pages retired for single-bit errors"),
    _Field("retired_pages_dbe", "retired_pages_double_bit", "pages retired for double-bit errors"),
    _Field("retired_pages_pending", "retired_pages_pending", "1 while a page retirement waits for a reset"),
    _Field("remap_correctable", "remapped_rows_correctable", "rows remapped for correctable errors"),
    _Field("remap_uncorrectable", "remapped_rows_uncorrectable", "rows remapped for uncorrectable errors"),
    _Field("remap_pending", "remapped_rows_pending", "1 while a row remap waits for a GPU reset"),
    _Field("remap_failure", "remapped_rows_failure", "1 if a row remap failed"),
    _Field("pcie_replay_total", "pcie_replays", "PCIe replays", counter=True),
    _Field("nvlink_links_active", "nvlink_links_active", "NVLink links up"),
    _Field("nvlink_links_inactive", "nvlink_links_inactive", "NVLink links down"),
    _Field("nvlink_replay_total", "nvlink_replay_errors", "NVLink replay errors, all links", counter=True),
    _Field(
        "nvlink_recovery_total", "nvlink_recovery_errors", "NVLink recovery errors, all links", counter=True
    ),
    _Field("nvlink_crc_total", "nvlink_crc_errors", "NVLink CRC errors, all links", counter=True),
    _Field("process_count", "compute_processes", "compute processes on the GPU"),
    _Field("driver_unresponsive", "driver_unresponsive", "1 while an NVML call outlives the deadline"),
    _Field("recovery_action", "recovery_action", "NVML recovery action: 0 none, 1 reset, 2 reboot"),
    _Field("pcie_link_gen", "pcie_link_generation", "PCIe link generation now"),
    _Field("pcie_link_gen_max", "pcie_link_generation_max", "most PCIe link generation GPU and slot reach"),
    _Field("pcie_link_width", "pcie_link_width_lanes", "PCIe link width now"),
    _Field("pcie_link_width_max", "pcie_link_width_max_lanes", "PCIe link width the GPU and slot can reach"),
    _Field("fabric_state", "fabric_state", "NVLink fabric state: 1 not started, 2 in progress, 3 completed"),
    _Field("fabric_status", "fabric_status", "NVLink fabric probe's NVML return code (0: success)"),
    _Field("ecc_sbe_rate_per_s", "ecc_corrected_rate", "corrected ECC errors per second"),
    _Field("clock_sm_target_mhz", "sm_clock_target_hertz", "SM clock the clocks policy targets", 1e6),
    _Field("sm_active_pct", "sm_active_ratio", "share of SMs busy over the sample interval (GPM), 0-1", 0.01),
    _Field(
        "tensor_active_pct",
        "tensor_active_ratio",
        "share of time the SMs ran tensor-core work over the sample interval (GPM), 0-1",
        0.01,
    ),
]

# (EngineSample field, Prometheus name, help, counter?)
ENGINE_FIELDS = [
    ("kv_cache_usage_ratio", "kv_cache_usage_ratio", "KV-cache blocks in use, 0-1", False),
    ("requests_running", "requests_running", "requests being decoded", False),
    ("requests_waiting", "requests_waiting", "requests queued for a KV-cache slot or a batch", False),
    ("preemptions_total", "preemptions", "requests preempted (KV cache full)", True),
    ("prefix_cache_hit_ratio", "prefix_cache_hit_ratio", "prefix-cache hit ratio, 0-1", False),
]

# (CollectorStats field, Prometheus name, help, counter?)
SELF_FIELDS = [
    ("reports_dropped_total", "reports_dropped", "reports dropped because the replay buffer was full", True),
    ("reports_rejected_total", "reports_rejected", "reports the aggregator rejected", True),
    ("unacked_reports", "unacked_reports", "reports waiting for the aggregator's acknowledgement", False),
    ("reconnects_total", "reconnects", "reconnects to the aggregator", True),
    ("sample_errors_total", "nvml_errors", "NVML calls that failed (not counting NOT_SUPPORTED)", True),
    ("nvml_calls_hung_total", "nvml_calls_hung", "NVML calls that outlived the call deadline", True),
    ("sample_duration_s", "sample_duration_seconds", "time the last sample of all GPUs took", False),
    ("kmsg_lines_unparsed_total", "kmsg_lines_unparsed", "kernel-log XID lines that did not parse", True),
    ("xid_unknown_gpu_total", "xid_unknown_gpu", "XIDs for a PCI bus id that is no GPU of this node", True),
    ("xid_duplicates_total", "xid_duplicates", "XIDs seen by NVML and the kernel log, sent once", True),
    ("xid_folded_total", "xid_folded", "identical XIDs folded into another event's count (storms)", True),
    (
        "kmsg_records_caught_up_total",
        "kmsg_xids_caught_up",
        "XIDs logged before the collector started, reported at start",
        True,
    ),
    (
        "engine_scrapes_failed_total",
        "engine_scrapes_failed",
        "engine /metrics scrapes that were unreadable",
        True,
    ),
]


# XIDs since the collector started: (GPU index, or "" for a bus id that is no GPU of this node;
# XID number) -> occurrences, a folded storm counted in full (collector/xid_fold.py).
XidCounts = dict[tuple[str, int], int]


class GpuMetrics(Collector):
    """Renders the latest report (from `latest()`) and the XID counts at scrape time."""

    def __init__(
        self,
        latest: Callable[[], telemetry_pb2.NodeReport | None],
        xid_counts: Callable[[], XidCounts] = dict,
    ) -> None:
        self._latest = latest
        self._xid_counts = xid_counts

    def collect(self) -> Iterator[Metric]:
        report = self._latest()
        if report is None:
            return
        node, cluster = report.node, report.cluster
        for spec in GPU_FIELDS:
            family_type = CounterMetricFamily if spec.counter else GaugeMetricFamily
            family = family_type(
                f"gpufleet_gpu_{spec.name}", f"{spec.help} (gpufleet field {spec.field})", labels=_LABELS
            )
            for gpu in report.gpus:
                if gpu.HasField(spec.field):
                    family.add_metric(
                        [node, cluster, str(gpu.index), gpu.uuid, gpu.model],
                        float(getattr(gpu, spec.field)) * spec.scale,
                    )
            yield family
        lost = GaugeMetricFamily("gpufleet_gpu_lost", "1 when NVML answers GPU_IS_LOST", labels=_LABELS)
        for gpu in report.gpus:
            lost.add_metric([node, cluster, str(gpu.index), gpu.uuid, gpu.model], float(gpu.lost))
        yield lost
        xids = CounterMetricFamily(
            "gpufleet_xid_errors",
            "XIDs since the collector started, by GPU and XID number (a storm counted in full)",
            labels=["node", "cluster", "gpu", "xid"],
        )
        for (gpu, xid), count in sorted(self._xid_counts().items()):
            xids.add_metric([node, cluster, gpu, str(xid)], float(count))
        yield xids
        yield from self._engines(report)
        for field, name, help_text, counter in SELF_FIELDS:
            family_type = CounterMetricFamily if counter else GaugeMetricFamily
            family = family_type(f"gpufleet_collector_{name}", help_text, labels=["node", "cluster"])
            family.add_metric([node, cluster], float(getattr(report.stats, field)))
            yield family

    @staticmethod
    def _engines(report: telemetry_pb2.NodeReport) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "gpufleet_engine_up",
            "1 when the engine's /metrics was read at the last sample",
            labels=_ENGINE_LABELS,
        )
        labels = [[report.node, report.cluster, e.engine, e.model, str(e.port)] for e in report.engines]
        for engine, values in zip(report.engines, labels, strict=True):
            up.add_metric(values, float(engine.readable))
        yield up
        for field, name, help_text, counter in ENGINE_FIELDS:
            family_type = CounterMetricFamily if counter else GaugeMetricFamily
            family = family_type(f"gpufleet_engine_{name}", help_text, labels=_ENGINE_LABELS)
            for engine, values in zip(report.engines, labels, strict=True):
                if engine.HasField(field):
                    family.add_metric(values, float(getattr(engine, field)))
            yield family


def serve(
    address: str,
    latest: Callable[[], telemetry_pb2.NodeReport | None],
    xid_counts: Callable[[], XidCounts] = dict,
    probes: dict[str, Callable[[], tuple[int, str, bytes]]] | None = None,
) -> int:
    """Serve /metrics (and probes: path -> answer, e.g. /healthz and /ready) on address
    (host:port, port 0 picks one); return the port."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuMetrics(latest, xid_counts))
    host, _, port = address.rpartition(":")

    def metrics() -> tuple[int, str, bytes]:
        return 200, CONTENT_TYPE_LATEST, generate_latest(registry)

    # Bounded connections and idle timeouts (common/bounded_http.py), unlike start_http_server.
    server = serve_routes(host.strip("[]"), int(port), {"/metrics": metrics, "/": metrics, **(probes or {})})
    return server.server_port
