"""The aggregator's own Prometheus metrics, in a registry of its own (no global state:
two aggregators in one process, as in tests, do not share counters)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpufleet.aggregator.ingest.spool import SpoolStatus
from gpufleet.aggregator.store.base import Store


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
        self.parts_dropped = Counter(
            "gpufleet_ingest_report_parts_dropped",
            "parts of accepted reports dropped or marked for disagreeing with their stream (an engine "
            "or event naming a GPU the node did not declare, an engine twice, an event out of the time "
            "window), the rest stored; by reason",
            ["reason"],
            registry=r,
        )
        self.streams_open = Gauge(
            "gpufleet_ingest_streams_open", "collector streams connected now", registry=r
        )
        self.throttled = Counter(
            "gpufleet_ingest_throttled_reports",
            "reports a node sent faster than its report or byte rate allows, held back (not refused)",
            registry=r,
        )
        self.unknown_fields_dropped = Counter(
            "gpufleet_ingest_unknown_fields_dropped",
            "collector messages that carried fields the schema does not name (dropped, the rest taken)",
            registry=r,
        )
        self.unknown_bytes_dropped = Counter(
            "gpufleet_ingest_unknown_bytes_dropped",
            "bytes of fields the schema does not name, dropped from collector messages",
            registry=r,
        )
        self.command_results_refused = Counter(
            "gpufleet_ingest_command_results_refused",
            "command results refused: not a command this aggregator sent to that node's collector boot",
            registry=r,
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
        self.store_refused_reports = Counter(
            "gpufleet_store_refused_reports",
            "reports the store refused for what they hold (found by bisecting a refused batch)",
            registry=r,
        )
        self.writer_errors = Counter(
            "gpufleet_writer_errors",
            "group commits that failed unexpectedly (a bug; the reports were not acknowledged)",
            registry=r,
        )
        self.listener_errors = Counter(
            "gpufleet_listener_errors",
            "exceptions raised by a durable-report listener, by listener",
            ["listener"],
            registry=r,
        )
        self.listener_dropped = Counter(
            "gpufleet_listener_reports_dropped",
            "durable reports not given to the listeners because their queue was full",
            registry=r,
        )
        self.fleet_requests = Counter(
            "gpufleet_fleet_requests",
            "Fleet API calls by method and status",
            ["method", "code"],
            registry=r,
        )

    def watch_spool(self, spool_status: Callable[[], SpoolStatus], store: Store) -> None:
        """Gauges read from the spool (this process's and its ingest workers', as one) and the
        store's own drop count, at scrape time."""
        r = self.registry
        for name, help_text, attr in (
            ("gpufleet_spool_bytes", "bytes held in the on-disk spool", "bytes"),
            ("gpufleet_spool_batches", "batches waiting in the spool for the store", "batches"),
            ("gpufleet_spool_oldest_age_seconds", "age of the oldest spooled batch", "oldest_age_s"),
            (
                "gpufleet_spool_drain_points_per_second",
                "points drained to the store, last minute",
                "drain_points_per_s",
            ),
            (
                "gpufleet_spool_near_limit",
                "1 when the spool is past its warning fraction: alert",
                "near_limit",
            ),
            ("gpufleet_spool_refused_batches", "batches refused because the spool was full", "refused_total"),
            (
                "gpufleet_spool_quarantined_batches",
                "spooled batches the store refused again and again, kept aside: look at them",
                "quarantined_batches",
            ),
            (
                "gpufleet_spool_quarantined_points",
                "points kept in the spool's quarantine",
                "quarantined_points",
            ),
        ):
            Gauge(name, help_text, registry=r).set_function(
                lambda attr=attr: float(getattr(spool_status(), attr))
            )
        Gauge(
            "gpufleet_store_points_dropped",
            "points the store rejected (e.g. field type conflict)",
            registry=r,
        ).set_function(lambda: float(store.points_dropped_total))

    def reject(self, reason: str, code: str) -> None:
        self.rejections.labels(reason=reason, code=code).inc()
