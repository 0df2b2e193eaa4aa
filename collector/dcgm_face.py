"""The collector's DCGM face (`metrics_names = dcgm` or `both`): the last sample served under
NVIDIA dcgm-exporter's names, units and labels, so the dashboards (grafana.com 12239) and alert
rules a fleet wrote for dcgm-exporter read a gpufleet collector unchanged
(docs/prometheus-and-grafana.md "Coming from dcgm-exporter").

Every name comes from the signal catalog (protos/signals.py `dcgm`, `dcgm_scale`), plus the two
DCGM derives from others: DCGM_FI_DEV_FB_FREE (total less used) and DCGM_FI_PROF_GR_ENGINE_ACTIVE
(the share of time a kernel ran: NVML's GPU utilization as a 0-1 ratio). DCGM_FI_DEV_XID_ERRORS
is what dcgm-exporter makes it: the number of the GPU's last XID (0: none since the collector
started). Labels are dcgm-exporter's: gpu, UUID, device, modelName, Hostname, pci_bus_id,
DCGM_FI_DRIVER_VERSION, and pod, namespace, container of the Kubernetes workload on the GPU
(empty, so absent, where none is known).

Every family is a gauge, as the values are DCGM's field values: dcgm-exporter's own names (a
counter without _total, a camelCase label) are kept as they are, because the point is that the
queries written for them match; `promtool check metrics` says only that (tested).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpufleet.protos import telemetry_pb2
from gpufleet.protos.signals import GPU_SIGNALS, reported

LABELS = [
    "gpu",
    "UUID",
    "device",
    "modelName",
    "Hostname",
    "pci_bus_id",
    "DCGM_FI_DRIVER_VERSION",
    "pod",
    "namespace",
    "container",
]
_MIB = 1 << 20
DCGM_SIGNALS = [s for s in GPU_SIGNALS.values() if s.dcgm]
# DCGM fields served that no one catalog signal is: (name, help, its value from a GPU sample).
DERIVED: list[tuple[str, str, Callable[[telemetry_pb2.GpuSample], float | None]]] = [
    (
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB): gpufleet's hbm_total_bytes less hbm_used_bytes.",
        lambda g: (
            (g.hbm_total_bytes - g.hbm_used_bytes) / _MIB
            if g.HasField("hbm_total_bytes") and g.HasField("hbm_used_bytes")
            else None
        ),
    ),
    (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "Ratio of time the graphics engine is active (0-1): gpufleet's util_gpu_pct / 100.",
        lambda g: g.util_gpu_pct / 100 if g.HasField("util_gpu_pct") else None,
    ),
]
XID_NAME = "DCGM_FI_DEV_XID_ERRORS"


def served_names() -> list[str]:
    """Every DCGM name the face serves, in the order it serves them (the docs list them)."""
    return [s.dcgm for s in DCGM_SIGNALS] + [name for name, _, _ in DERIVED] + [XID_NAME]


def _pods(report: telemetry_pb2.NodeReport) -> dict[int, tuple[str, str, str]]:
    """GPU index -> (pod, namespace, container) of the Kubernetes workload on it (its id is
    "namespace/pod", its part the container), as dcgm-exporter's pod mapping labels it."""
    pods: dict[int, tuple[str, str, str]] = {}
    for w in report.workloads:
        namespace, _, pod = w.id.partition("/")
        if w.scheduler == "kubernetes" and pod:
            for index in w.gpu_indices:
                pods.setdefault(index, (pod, namespace, w.part))
    return pods


class DcgmMetrics(Collector):
    """Renders the latest report (from `latest()`) under dcgm-exporter's names at scrape time."""

    def __init__(
        self,
        latest: Callable[[], telemetry_pb2.NodeReport | None],
        xid_last: Callable[[], dict[str, int]] = dict,
        driver_version: Callable[[], str] = str,
    ) -> None:
        self._latest = latest
        self._xid_last = xid_last
        self._driver_version = driver_version

    def collect(self) -> Iterator[Metric]:
        report = self._latest()
        if report is None:
            return
        pods = _pods(report)
        driver = self._driver_version()
        labels = [
            [
                str(g.index),
                g.uuid,
                f"nvidia{g.index}",
                g.model,
                report.node,
                g.pci_bus_id,
                driver,
                *pods.get(g.index, ("", "", "")),
            ]
            for g in report.gpus
        ]
        gpus = list(zip(report.gpus, labels, strict=True))
        for spec in DCGM_SIGNALS:
            family = GaugeMetricFamily(spec.dcgm, f"{spec.help} (gpufleet field {spec.field})", labels=LABELS)
            for g, values in gpus:
                if reported(g, spec.field):
                    family.add_metric(values, float(getattr(g, spec.field)) * spec.dcgm_scale)
            yield family
        for name, text, value_of in DERIVED:
            family = GaugeMetricFamily(name, text, labels=LABELS)
            for g, values in gpus:
                value = value_of(g)
                if value is not None:
                    family.add_metric(values, value)
            yield family
        last = self._xid_last()
        xid = GaugeMetricFamily(XID_NAME, "Value of the last XID error encountered (0: none).", labels=LABELS)
        for g, values in gpus:
            xid.add_metric(values, float(last.get(str(g.index), 0)))
        yield xid


# dcgm-exporter's default fields that the DCGM face does not serve, and why (the docs list them).
NOT_SERVED = {
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "NVML has it (nvmlDeviceGetTotalEnergyConsumption); gpufleet "
    "does not read it yet",
    "DCGM_FI_DEV_ENC_UTIL": "NVML has it (nvmlDeviceGetEncoderUtilization); gpufleet does not read it yet",
    "DCGM_FI_DEV_DEC_UTIL": "NVML has it (nvmlDeviceGetDecoderUtilization); gpufleet does not read it yet",
    "DCGM_FI_PROF_DRAM_ACTIVE": "a DCGM profiling field; NVML's GPM has a DRAM bandwidth metric gpufleet "
    "does not read yet",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "a DCGM profiling field; gpufleet does not read PCIe throughput",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "a DCGM profiling field; gpufleet does not read PCIe throughput",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "no NVML source on a bare-metal GPU (vGPU licensing)",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "gpufleet reads NVLink errors and link state, not throughput",
}


def docs_table() -> str:
    """The DCGM face's fields as docs/prometheus-and-grafana.md lists them (scripts/gen_dcgm_doc.py
    writes it there; tests/collector/test_dcgm_face.py checks it is current)."""
    rows = ["| DCGM field | from gpufleet's | unit |", "|---|---|---|"]
    for s in DCGM_SIGNALS:
        unit = {1 / _MIB: "MiB", 0.01: "ratio 0-1"}.get(s.dcgm_scale, s.unit)
        rows.append(f"| `{s.dcgm}` | `{s.field}` | {unit} |")
    rows.append("| `DCGM_FI_DEV_FB_FREE` | `hbm_total_bytes` less `hbm_used_bytes` | MiB |")
    rows.append("| `DCGM_FI_PROF_GR_ENGINE_ACTIVE` | `util_gpu_pct` / 100 | ratio 0-1 |")
    rows.append("| `DCGM_FI_DEV_XID_ERRORS` | the GPU's last XID number (0: none) | XID |")
    rows += ["", "Not served:", ""]
    rows += [f"- `{name}`: {why}." for name, why in NOT_SERVED.items()]
    return "\n".join(rows) + "\n"
