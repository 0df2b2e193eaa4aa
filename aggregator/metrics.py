"""The aggregator's own Prometheus metrics, in a registry of its own (no global state:
two aggregators in one process, as in tests, do not share counters). Every metric is declared in
aggregator/declared_metrics.py; this module makes the ingest, store and spool ones."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry

from gpufleet.aggregator.declared_metrics import counter, gauge, gauges, histogram, totals
from gpufleet.aggregator.ingest.spool import SpoolStatus
from gpufleet.aggregator.store.base import Store


class AggregatorMetrics:
    """The ingest, store, spool and Fleet API metrics (declared in aggregator/declared_metrics.py)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.reports_accepted = counter(r, "gpufleet_ingest_reports_accepted")
        self.gpu_samples = counter(r, "gpufleet_ingest_gpu_samples")
        self.rejections = counter(r, "gpufleet_ingest_rejections")
        self.parts_dropped = counter(r, "gpufleet_ingest_report_parts_dropped")
        self.streams_open = gauge(r, "gpufleet_ingest_streams_open")
        self.throttled = counter(r, "gpufleet_ingest_throttled_reports")
        self.unknown_fields_dropped = counter(r, "gpufleet_ingest_unknown_fields_dropped")
        self.unknown_bytes_dropped = counter(r, "gpufleet_ingest_unknown_bytes_dropped")
        self.command_results_refused = counter(r, "gpufleet_ingest_command_results_refused")
        self.store_write_seconds = histogram(r, "gpufleet_store_write_seconds")
        self.store_points_written = counter(r, "gpufleet_store_points_written")
        self.store_write_errors = counter(r, "gpufleet_store_write_errors")
        self.store_refused_reports = counter(r, "gpufleet_store_refused_reports")
        self.writer_errors = counter(r, "gpufleet_writer_errors")
        self.listener_errors = counter(r, "gpufleet_listener_errors")
        self.listener_dropped = counter(r, "gpufleet_listener_reports_dropped")
        self.fleet_requests = counter(r, "gpufleet_fleet_requests")

    def watch_spool(self, spool_status: Callable[[], SpoolStatus], store: Store) -> None:
        """Read from the spool (this process's and its ingest workers', as one) and the store's
        own drop count, at scrape time."""

        def of(attr: str) -> Callable[[], float]:
            return lambda: float(getattr(spool_status(), attr))

        gauges(
            self.registry,
            {
                "gpufleet_spool_bytes": of("bytes"),
                "gpufleet_spool_batches": of("batches"),
                "gpufleet_spool_oldest_age_seconds": of("oldest_age_s"),
                "gpufleet_spool_drain_points_per_second": of("drain_points_per_s"),
                "gpufleet_spool_near_limit": of("near_limit"),
                "gpufleet_spool_quarantined_batches": of("quarantined_batches"),
                "gpufleet_spool_quarantined_points": of("quarantined_points"),
            },
        )
        totals(
            self.registry,
            {
                "gpufleet_spool_refused_batches": of("refused_total"),
                "gpufleet_store_points_dropped": lambda: float(store.points_dropped_total),
            },
        )
        # The embedded store's settles (aggregator/store/embedded_staging.py); 0 for a store
        # that writes in place (InfluxDB), so every aggregator serves the same families.
        settler = getattr(store, "settler", None)

        def settled(attr: str) -> Callable[[], float]:
            return lambda: float(getattr(settler, attr, 0))

        totals(
            self.registry,
            {
                "gpufleet_store_settles": settled("settles_total"),
                "gpufleet_store_settled_points": settled("settled_points_total"),
                "gpufleet_store_settle_failures": settled("failures_total"),
            },
        )
        gauges(self.registry, {"gpufleet_store_last_settle_seconds": settled("last_settle_s")})

    def reject(self, reason: str, code: str) -> None:
        self.rejections.labels(reason=reason, code=code).inc()
