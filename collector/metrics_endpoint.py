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
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpufleet.collector.dcgm_face import DcgmMetrics
from gpufleet.common.bounded_http import serve as serve_routes
from gpufleet.protos import telemetry_pb2
from gpufleet.protos.signals import COLLECTOR_SIGNALS, ENGINE_SIGNALS, GPU_SIGNALS, reported

_LABELS = ["node", "cluster", "gpu", "uuid", "model"]
_ENGINE_LABELS = ["node", "cluster", "engine", "model", "port"]


# One family per GPU signal, from the signal catalog (protos/signals.py): name, type, help and
# base unit are the catalog's.
GPU_FIELDS = list(GPU_SIGNALS.values())

# One family per engine signal, from the signal catalog too.
ENGINE_FIELDS = list(ENGINE_SIGNALS.values())

# The collector's own health, from the catalog as well.
SELF_FIELDS = list(COLLECTOR_SIGNALS.values())


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
            family = family_type(f"gpufleet_gpu_{spec.prometheus}", spec.prometheus_help, labels=_LABELS)
            for gpu in report.gpus:
                if reported(gpu, spec.field):
                    family.add_metric(
                        [node, cluster, str(gpu.index), gpu.uuid, gpu.model],
                        float(getattr(gpu, spec.field)) * spec.prometheus_scale,
                    )
            yield family
        xids = CounterMetricFamily(
            "gpufleet_xid_errors",
            "XIDs since the collector started, by GPU and XID number (a storm counted in full)",
            labels=["node", "cluster", "gpu", "xid"],
        )
        for (gpu, xid), count in sorted(self._xid_counts().items()):
            xids.add_metric([node, cluster, gpu, str(xid)], float(count))
        yield xids
        yield from self._engines(report)
        for spec in SELF_FIELDS:
            family_type = CounterMetricFamily if spec.counter else GaugeMetricFamily
            family = family_type(
                f"gpufleet_collector_{spec.prometheus}", spec.prometheus_help, labels=["node", "cluster"]
            )
            family.add_metric([node, cluster], float(getattr(report.stats, spec.field)))
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
        for spec in ENGINE_FIELDS:
            family_type = CounterMetricFamily if spec.counter else GaugeMetricFamily
            family = family_type(
                f"gpufleet_engine_{spec.prometheus}", spec.prometheus_help, labels=_ENGINE_LABELS
            )
            for engine, values in zip(report.engines, labels, strict=True):
                if engine.HasField(spec.field):
                    family.add_metric(values, float(getattr(engine, spec.field)) * spec.prometheus_scale)
            yield family


def registry_of(
    names: str, latest: Callable[[], telemetry_pb2.NodeReport | None], **sources: Any
) -> CollectorRegistry:
    """What /metrics serves for metrics_names (collector/config.py METRICS_NAMES): gpufleet's
    names, dcgm-exporter's (collector/dcgm_face.py), or both. sources: xid_counts, xid_last,
    driver_version (callables)."""
    registry = CollectorRegistry(auto_describe=False)
    if names in ("gpufleet", "both"):
        registry.register(GpuMetrics(latest, sources.get("xid_counts", dict)))
    if names in ("dcgm", "both"):
        registry.register(
            DcgmMetrics(latest, sources.get("xid_last", dict), sources.get("driver_version", str))
        )
    return registry


def serve(
    address: str,
    registry: CollectorRegistry,
    probes: dict[str, Callable[[], tuple[int, str, bytes]]] | None = None,
) -> int:
    """Serve registry as /metrics (and probes: path -> answer, e.g. /healthz and /ready) on
    address (host:port, port 0 picks one); return the port."""
    host, _, port = address.rpartition(":")

    def metrics() -> tuple[int, str, bytes]:
        return 200, CONTENT_TYPE_LATEST, generate_latest(registry)

    # Bounded connections and idle timeouts (common/bounded_http.py), unlike start_http_server.
    server = serve_routes(host.strip("[]"), int(port), {"/metrics": metrics, "/": metrics, **(probes or {})})
    return server.server_port
