"""The aggregator's own Prometheus metrics, in a registry of its own (no global state:
two aggregators in one process, as in tests, do not share counters)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class AggregatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.reports_accepted = Counter(
            "gpufleet_ingest_reports_accepted", "reports made durable and acknowledged", registry=r
        )
        self.gpu_samples = Counter(
            "gpufleet_ingest_gpu_samples", "GPU samples in accepted reports", registry=r
        )
        self.rejections = Counter(
            "gpufleet_ingest_rejections",
            "reports or streams refused, by reason and gRPC status",
            ["reason", "code"],
            registry=r,
        )
        self.streams_open = Gauge(
            "gpufleet_ingest_streams_open", "collector streams connected now", registry=r
        )
        self.store_write_seconds = Histogram(
            "gpufleet_store_write_seconds", "time to make one batch durable", registry=r
        )
        self.store_points_written = Counter(
            "gpufleet_store_points_written", "points written to the store", registry=r
        )
        self.store_write_errors = Counter(
            "gpufleet_store_write_errors", "store writes that failed", registry=r
        )
        self.fleet_requests = Counter(
            "gpufleet_fleet_requests",
            "Fleet API calls by method and status",
            ["method", "code"],
            registry=r,
        )

    def reject(self, reason: str, code: str) -> None:
        self.rejections.labels(reason=reason, code=code).inc()
