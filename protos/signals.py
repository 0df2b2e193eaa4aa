"""The signal catalog: one entry per signal a collector reports (a GpuSample or EngineSample field), and
everything the parts say about it derived from that entry (docs/architecture.md "The signal
catalog"): the collector's /metrics family (name, type, help, base unit), the stored field's
unit, help and plausible range (aggregator/ingest/schema.py, which the wire rules and
`gpufleet metrics` read), and the label and rounding the dashboard's node table shows.

Adding a GPU signal: its `optional` field in telemetry.proto (regenerated), one entry here, its
reader (collector/sources/nvml.py) and the stand-in's answer (collector/simnvml/).
tests/project/test_signal_catalog.py fails when a GpuSample field has no entry.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpufleet.protos import telemetry_pb2

_TIB = 1 << 40
_GIB = 1 << 30
INT64_MAX = 2**63 - 1
_PHYSICAL_UNITS = frozenset({"%", "°C", "W", "MHz", "s"})


@dataclass(frozen=True)
class Signal:
    field: str  # the GpuSample field, which is also the stored field's name
    unit: str  # the unit it is reported and stored in ("%", "W", "bytes", "bool", ...)
    help: str  # one line: what it is
    low: float  # the plausible range (what no real device reports is outside it), for the wire
    high: float  # rules; not a health threshold
    prometheus: str  # the /metrics name after gpufleet_gpu_ (a counter's without _total)
    prometheus_scale: float = 1.0  # to Prometheus's base unit (0.01: percent to ratio; 1e6: MHz to Hz)
    counter: bool = False
    label: str = ""  # the dashboard node table's column, unit in it ("": not a column)
    label_scale: float = 1.0  # what the column and the chart show per unit (1/GiB: bytes as GiB)
    decimals: int = 0  # the column's rounding
    title: str = ""  # its chart: the node page's GPU series and Grafana's node panel ("": none)
    heat: bool = False  # a choice of the fleet overview's heat map
    nvml: str = ""  # a GPU signal's NVML source: the call its reader makes, or "collector: ..." (derived)
    dcgm: str = ""  # its dcgm-exporter field (the collector's DCGM face), "" where DCGM has none
    dcgm_scale: float = 1.0  # to DCGM's unit (bytes to MiB, percent to a 0-1 ratio for PROF fields)

    @property
    def shown_unit(self) -> str:
        """The unit a chart of it reads in ("" for a count: its title says what is counted)."""
        if self.label_scale == 1 / _GIB:
            return "GiB"
        if self.unit == "ratio" and self.label_scale == 100:
            return "%"
        return self.unit if self.unit in _PHYSICAL_UNITS else ""

    @property
    def chart_label(self) -> str:
        """Its chart's name with the unit it reads in: "GPU utilization %", "HBM used GiB"."""
        return f"{self.title} {self.shown_unit}".rstrip()

    @property
    def prometheus_help(self) -> str:
        if self.prometheus_scale == 0.01:
            shown = ", 0-1"
        elif self.prometheus_scale == 1e6:
            shown = ", in hertz"
        else:
            shown = ""
        return f"{self.help}{shown} (gpufleet field {self.field}, {self.unit})"


GPU_SIGNALS: dict[str, Signal] = {
    s.field: s
    for s in [
        Signal("util_gpu_pct", "%", "GPU (SM) utilization: time a kernel ran, not work", 0, 100,
               "utilization_ratio", 0.01, label="GPU util %", title="GPU utilization", heat=True,
               nvml="nvmlDeviceGetUtilizationRates"),
        Signal("util_mem_pct", "%", "memory-controller utilization", 0, 100,
               "memory_utilization_ratio", 0.01, label="memory util %", nvml="nvmlDeviceGetUtilizationRates"),
        Signal("hbm_used_bytes", "bytes", "HBM in use", 0, 16 * _TIB, "hbm_used_bytes",
               label="HBM used GiB", label_scale=1 / _GIB, decimals=1, title="HBM used",
               nvml="nvmlDeviceGetMemoryInfo"),
        Signal("hbm_total_bytes", "bytes", "HBM size", 0, 16 * _TIB, "hbm_total_bytes",
               label="HBM total GiB", label_scale=1 / _GIB, decimals=1, nvml="nvmlDeviceGetMemoryInfo"),
        Signal("temp_gpu_c", "°C", "GPU core temperature", -40, 150, "temperature_celsius", label="temp °C",
               title="GPU temperature", heat=True, nvml="nvmlDeviceGetTemperature"),
        Signal("temp_mem_c", "°C", "HBM temperature", -40, 150, "memory_temperature_celsius",
               label="HBM temp °C", nvml="nvmlDeviceGetFieldValues"),
        Signal("power_w", "W", "board power draw", 0, 5000, "power_watts", label="power W",
               title="board power", heat=True, nvml="nvmlDeviceGetPowerUsage"),
        Signal("power_limit_w", "W", "enforced power limit", 0, 5000, "power_limit_watts",
               label="power limit W", nvml="nvmlDeviceGetEnforcedPowerLimit"),
        Signal("lost", "bool", "1 when NVML answered GPU_IS_LOST", 0, 1, "lost",
               nvml="collector: any NVML call answering GPU_IS_LOST"),
        Signal("clock_sm_mhz", "MHz", "SM clock", 0, 10_000, "sm_clock_hertz", 1e6, label="SM clock MHz",
               title="SM clock", nvml="nvmlDeviceGetClockInfo"),
        Signal("clock_mem_mhz", "MHz", "memory clock", 0, 50_000, "memory_clock_hertz", 1e6,
               nvml="nvmlDeviceGetClockInfo"),
        Signal("clock_event_reasons", "bitmask", "NVML clock-event (throttle) reason bitmask", 0, INT64_MAX,
               "clock_event_reasons", nvml="nvmlDeviceGetCurrentClocksEventReasons"),
        Signal("throttle_thermal", "bool", "1 while a thermal slowdown is active", 0, 1, "thermal_slowdown",
               nvml="nvmlDeviceGetCurrentClocksEventReasons"),
        Signal("throttle_power", "bool", "1 while a power cap or power brake slowdown is active", 0, 1,
               "power_slowdown", nvml="nvmlDeviceGetCurrentClocksEventReasons"),
        Signal("ecc_sbe_volatile", "errors", "corrected ECC errors since driver load", 0, INT64_MAX,
               "ecc_corrected_volatile", counter=True, title="corrected ECC errors (volatile)",
               nvml="nvmlDeviceGetTotalEccErrors"),
        Signal("ecc_dbe_volatile", "errors", "uncorrected ECC errors since driver load", 0, INT64_MAX,
               "ecc_uncorrected_volatile", counter=True, title="uncorrected ECC errors (volatile)",
               nvml="nvmlDeviceGetTotalEccErrors"),
        Signal("ecc_sbe_aggregate", "errors", "corrected ECC errors, lifetime", 0, INT64_MAX,
               "ecc_corrected_aggregate", counter=True, nvml="nvmlDeviceGetTotalEccErrors"),
        Signal("ecc_dbe_aggregate", "errors", "uncorrected ECC errors, lifetime", 0, INT64_MAX,
               "ecc_uncorrected_aggregate", counter=True, nvml="nvmlDeviceGetTotalEccErrors"),
        Signal("retired_pages_sbe", "pages", "pages retired for single-bit errors", 0, 2**32,
               "retired_pages_single_bit", nvml="nvmlDeviceGetRetiredPages"),
        Signal("retired_pages_dbe", "pages", "pages retired for double-bit errors", 0, 2**32,
               "retired_pages_double_bit", nvml="nvmlDeviceGetRetiredPages"),
        Signal("retired_pages_pending", "bool", "1 while a page retirement waits for a reset", 0, 1,
               "retired_pages_pending", nvml="nvmlDeviceGetRetiredPagesPendingStatus"),
        Signal("remap_correctable", "rows", "rows remapped for correctable errors", 0, 2**32,
               "remapped_rows_correctable", nvml="nvmlDeviceGetRemappedRows"),
        Signal("remap_uncorrectable", "rows", "rows remapped for uncorrectable errors", 0, 2**32,
               "remapped_rows_uncorrectable", title="remapped rows (uncorrectable)",
               nvml="nvmlDeviceGetRemappedRows"),
        Signal("remap_pending", "bool", "1 while a row remap waits for a GPU reset", 0, 1,
               "remapped_rows_pending", nvml="nvmlDeviceGetRemappedRows"),
        Signal("remap_failure", "bool", "1 if a row remap failed", 0, 1, "remapped_rows_failure",
               nvml="nvmlDeviceGetRemappedRows"),
        Signal("pcie_replay_total", "count", "PCIe replays", 0, INT64_MAX, "pcie_replays", counter=True,
               nvml="nvmlDeviceGetPcieReplayCounter"),
        Signal("nvlink_links_active", "links", "NVLink links up", 0, 64, "nvlink_links_active",
               nvml="nvmlDeviceGetNvLinkState"),
        Signal("nvlink_links_inactive", "links", "NVLink links down", 0, 64, "nvlink_links_inactive",
               nvml="nvmlDeviceGetNvLinkState"),
        Signal("nvlink_replay_total", "count", "NVLink replay errors, all links", 0, INT64_MAX,
               "nvlink_replay_errors", counter=True, nvml="nvmlDeviceGetFieldValues"),
        Signal("nvlink_recovery_total", "count", "NVLink recovery errors, all links", 0, INT64_MAX,
               "nvlink_recovery_errors", counter=True, nvml="nvmlDeviceGetFieldValues"),
        Signal("nvlink_crc_total", "count", "NVLink CRC errors, all links", 0, INT64_MAX,
               "nvlink_crc_errors", counter=True, nvml="nvmlDeviceGetFieldValues"),
        Signal("process_count", "processes", "compute processes on the GPU", 0, 100_000, "compute_processes",
               nvml="nvmlDeviceGetComputeRunningProcesses"),
        Signal("driver_unresponsive", "bool", "1 while an NVML call outlives the collector's deadline", 0, 1,
               "driver_unresponsive", nvml="collector: the NVML call deadline"),
        Signal("driver_unresponsive_s", "s", "how long the stuck NVML call has waited", 0, 1e9,
               "driver_unresponsive_seconds", nvml="collector: the NVML call deadline"),
        Signal("recovery_action", "code", "NVML recovery action: 0 none, 1 reset, 2 reboot", 0, 255,
               "recovery_action", nvml="nvmlDeviceGetFieldValues"),
        Signal("pcie_link_gen", "gen", "PCIe link generation now", 0, 16, "pcie_link_generation",
               nvml="nvmlDeviceGetCurrPcieLinkGeneration"),
        Signal("pcie_link_gen_max", "gen", "most PCIe link generation GPU and slot reach", 0, 16,
               "pcie_link_generation_max", nvml="nvmlDeviceGetMaxPcieLinkGeneration"),
        Signal("pcie_link_width", "lanes", "PCIe link width now", 0, 64, "pcie_link_width_lanes",
               nvml="nvmlDeviceGetCurrPcieLinkWidth"),
        Signal("pcie_link_width_max", "lanes", "PCIe link width the GPU and slot can reach", 0, 64,
               "pcie_link_width_max_lanes", nvml="nvmlDeviceGetMaxPcieLinkWidth"),
        Signal("fabric_state", "state", "NVLink fabric state: 1 not started, 2 in progress, 3 completed",
               0, 16, "fabric_state", nvml="nvmlDeviceGetGpuFabricInfo"),
        Signal("fabric_status", "code", "NVLink fabric probe's NVML return code (0: success)", 0, 2**32 - 1,
               "fabric_status", nvml="nvmlDeviceGetGpuFabricInfo"),
        Signal("ecc_sbe_rate_per_s", "errors/s", "corrected ECC errors per second", 0, 1e12,
               "ecc_corrected_rate", nvml="collector: ecc_sbe_volatile over the sample interval"),
        Signal("clock_sm_target_mhz", "MHz", "SM clock the clocks policy targets", 0, 10_000,
               "sm_clock_target_hertz", 1e6, label="target clock MHz", nvml="nvmlDeviceGetClock"),
        Signal("sm_active_pct", "%", "share of SMs busy over the sample interval (GPM)", 0, 100,
               "sm_active_ratio", 0.01, label="SMs active %", title="SMs active", nvml="nvmlGpmMetricsGet"),
        Signal("tensor_active_pct", "%", "share of time the SMs ran tensor-core work (GPM)", 0, 100,
               "tensor_active_ratio", 0.01, label="tensor active %", nvml="nvmlGpmMetricsGet"),
    ]
}  # fmt: skip

# Each GPU signal's dcgm-exporter field, in DCGM's unit (its field list, dcgm_fields.h, and
# dcgm-exporter's default counters): the collector's DCGM face (collector/dcgm_face.py) serves them
# under these names, so the dashboards and alert rules written for dcgm-exporter read gpufleet.
# The fields DCGM has that NVML gives no value for are listed in docs/prometheus-and-grafana.md.
_MIB = 1 / (1 << 20)
_DCGM_FIELDS = {
    "util_gpu_pct": ("DCGM_FI_DEV_GPU_UTIL", 1.0),
    "util_mem_pct": ("DCGM_FI_DEV_MEM_COPY_UTIL", 1.0),
    "hbm_used_bytes": ("DCGM_FI_DEV_FB_USED", _MIB),
    "hbm_total_bytes": ("DCGM_FI_DEV_FB_TOTAL", _MIB),
    "temp_gpu_c": ("DCGM_FI_DEV_GPU_TEMP", 1.0),
    "temp_mem_c": ("DCGM_FI_DEV_MEMORY_TEMP", 1.0),
    "power_w": ("DCGM_FI_DEV_POWER_USAGE", 1.0),
    "power_limit_w": ("DCGM_FI_DEV_POWER_MGMT_LIMIT", 1.0),
    "clock_sm_mhz": ("DCGM_FI_DEV_SM_CLOCK", 1.0),
    "clock_mem_mhz": ("DCGM_FI_DEV_MEM_CLOCK", 1.0),
    "clock_event_reasons": ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 1.0),
    "ecc_sbe_volatile": ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 1.0),
    "ecc_dbe_volatile": ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1.0),
    "ecc_sbe_aggregate": ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", 1.0),
    "ecc_dbe_aggregate": ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", 1.0),
    "retired_pages_sbe": ("DCGM_FI_DEV_RETIRED_SBE", 1.0),
    "retired_pages_dbe": ("DCGM_FI_DEV_RETIRED_DBE", 1.0),
    "retired_pages_pending": ("DCGM_FI_DEV_RETIRED_PENDING", 1.0),
    "remap_correctable": ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 1.0),
    "remap_uncorrectable": ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 1.0),
    "remap_pending": ("DCGM_FI_DEV_ROW_REMAP_PENDING", 1.0),
    "remap_failure": ("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1.0),
    "pcie_replay_total": ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 1.0),
    "nvlink_replay_total": ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 1.0),
    "nvlink_recovery_total": ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", 1.0),
    "nvlink_crc_total": ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 1.0),
    "pcie_link_gen": ("DCGM_FI_DEV_PCIE_LINK_GEN", 1.0),
    "pcie_link_width": ("DCGM_FI_DEV_PCIE_LINK_WIDTH", 1.0),
    "sm_active_pct": ("DCGM_FI_PROF_SM_ACTIVE", 0.01),
    "tensor_active_pct": ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.01),
}
GPU_SIGNALS = {
    f: replace(s, dcgm=_DCGM_FIELDS[f][0], dcgm_scale=_DCGM_FIELDS[f][1]) if f in _DCGM_FIELDS else s
    for f, s in GPU_SIGNALS.items()
}

# GpuSample fields that are not signals: who the GPU is, why its fields are absent, its processes.
NOT_SIGNALS = frozenset({"index", "uuid", "model", "pci_bus_id", "driver_unresponsive_call", "processes"})

# An inference engine's KV-cache pressure (EngineSample; /metrics names after gpufleet_engine_).
ENGINE_SIGNALS: dict[str, Signal] = {
    s.field: s
    for s in [
        Signal("kv_cache_usage_ratio", "ratio", "KV-cache blocks in use, 0-1", 0, 1, "kv_cache_usage_ratio",
               label_scale=100, title="KV-cache usage"),
        Signal("requests_waiting", "requests", "requests queued for a KV-cache slot or a batch", 0, 1e9,
               "requests_waiting", title="requests waiting"),
        Signal("requests_running", "requests", "requests being decoded", 0, 1e7, "requests_running",
               title="requests running"),
        Signal("preemptions_total", "count", "requests preempted (KV cache full)", 0, 1e15, "preemptions",
               counter=True, title="preemptions"),
        Signal("prefix_cache_hit_ratio", "ratio", "prefix-cache hit ratio, 0-1", 0, 1,
               "prefix_cache_hit_ratio"),
    ]
}  # fmt: skip
# EngineSample fields that are not signals: which replica it is, where, and whether it was read.
ENGINE_NOT_SIGNALS = frozenset(
    {"engine", "model", "port", "endpoint", "gpu_indices", "readable", "unreadable_reason", "pool"}
)


# The collector's own health (CollectorStats, sent with every report; /metrics names after
# gpufleet_collector_, stored in the `collector` measurement).
COLLECTOR_SIGNALS: dict[str, Signal] = {
    s.field: s
    for s in [
        Signal("reports_dropped_total", "reports", "reports dropped because the replay buffer was full", 0,
               INT64_MAX, "reports_dropped", counter=True),
        Signal("reports_rejected_total", "reports", "reports the aggregator rejected", 0, INT64_MAX,
               "reports_rejected", counter=True),
        Signal("unacked_reports", "reports", "reports waiting for the aggregator's acknowledgement", 0,
               INT64_MAX, "unacked_reports"),
        Signal("reconnects_total", "count", "reconnects to the aggregator", 0, INT64_MAX, "reconnects",
               counter=True),
        Signal("sample_errors_total", "count", "NVML calls that failed (not counting NOT_SUPPORTED)", 0,
               INT64_MAX, "nvml_errors", counter=True),
        Signal("nvml_calls_hung_total", "count", "NVML calls that outlived the call deadline", 0, INT64_MAX,
               "nvml_calls_hung", counter=True),
        Signal("sample_duration_s", "s", "time the last sample of all GPUs took", 0, 3600,
               "sample_duration_seconds"),
        Signal("kmsg_lines_unparsed_total", "lines", "kernel-log XID lines that did not parse", 0, INT64_MAX,
               "kmsg_lines_unparsed", counter=True),
        Signal("xid_unknown_gpu_total", "count", "XIDs for a PCI bus id that is no GPU of this node", 0,
               INT64_MAX, "xid_unknown_gpu", counter=True),
        Signal("xid_duplicates_total", "count", "XIDs seen by NVML and the kernel log, sent once", 0,
               INT64_MAX, "xid_duplicates", counter=True),
        Signal("xid_folded_total", "count", "identical XIDs folded into another event's count (storms)", 0,
               INT64_MAX, "xid_folded", counter=True),
        Signal("kmsg_records_caught_up_total", "count", "XIDs logged before the collector started, reported "
               "at start", 0, INT64_MAX, "kmsg_xids_caught_up", counter=True),
        Signal("engine_scrapes_failed_total", "count", "engine /metrics scrapes that were unreadable", 0,
               INT64_MAX, "engine_scrapes_failed", counter=True),
    ]
}  # fmt: skip


def charted(signals: dict[str, Signal]) -> dict[str, Signal]:
    """The signals that have a chart, by their chart's label (the node page's series choices)."""
    return {s.chart_label: s for s in signals.values() if s.title}


def reported(sample: telemetry_pb2.GpuSample, field: str) -> bool:
    """Whether the sample carries the signal (`lost`, the one that is not optional, always)."""
    return field == "lost" or sample.HasField(field)
