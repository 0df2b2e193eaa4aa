"""Every metric the aggregator's /metrics serves, declared once here: its name, type, help and
labels (a reader lists them in one place; tests/project/test_metrics_declared.py compares this
list with what a scrape serves, and checks no count is exposed as a gauge). The parts that
export them get them from here by name (counter(), gauge(), totals(), family()), so a part never
spells a metric's type or help itself.

Prometheus conventions (prometheus.io/docs/practices/naming): base units with the unit in the
name (seconds, bytes, ratio), counters for whatever only rises (exposed with `_total`: a counter
is declared here without it, as prometheus_client names them), gauges for what goes up and down.
A count a part keeps as a running total (a failure counter on an object) is a counter too:
totals() reads it at scrape time. No global state: every helper takes the registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


@dataclass(frozen=True)
class Declared:
    kind: str  # "counter", "gauge" or "histogram"
    help: str
    labels: tuple[str, ...] = ()


def _c(help_text: str, *labels: str) -> Declared:
    return Declared("counter", help_text, labels)


def _g(help_text: str, *labels: str) -> Declared:
    return Declared("gauge", help_text, labels)


# fmt: off
DECLARED: dict[str, Declared] = {
    # ingest (aggregator/metrics.py)
    "gpufleet_ingest_reports_accepted": _c("reports made durable and acknowledged"),
    "gpufleet_ingest_gpu_samples": _c("GPU samples in accepted reports"),
    "gpufleet_ingest_rejections": _c(
        "reports or streams refused, by reason and gRPC status", "reason", "code"),
    "gpufleet_ingest_report_parts_dropped": _c(
        "parts of accepted reports dropped or marked for disagreeing with their stream (an engine or event "
        "naming a GPU the node did not declare, an engine twice, an event out of the time window), the "
        "rest stored; by reason", "reason"),
    "gpufleet_ingest_streams_open": _g("collector streams connected now"),
    "gpufleet_ingest_oldest_unacked_seconds": _g(
        "how long the oldest accepted report has waited for its ack now (the ingest's lag: alert)"),
    "gpufleet_ingest_backlog_reports": _g("reports accepted and not yet durable now (the ingest's backlog)"),
    "gpufleet_ingest_backlog_bytes": _g(
        "bytes of reports handed to the ingest workers and not yet durable now (ingest_backlog_max_bytes "
        "bounds it)"),
    "gpufleet_ingest_throttled_reports": _c(
        "reports a node sent faster than its report or byte rate allows, held back (not refused)"),
    "gpufleet_ingest_unknown_fields_dropped": _c(
        "collector messages that carried fields the schema does not name (dropped, the rest taken)"),
    "gpufleet_ingest_unknown_bytes_dropped": _c(
        "bytes of fields the schema does not name, dropped from collector messages"),
    "gpufleet_ingest_command_results_refused": _c(
        "command results refused: not a command this aggregator sent to that node's collector boot"),
    # the store and the spool (aggregator/metrics.py)
    "gpufleet_store_write_seconds": Declared("histogram", "time to make one batch durable"),
    "gpufleet_store_points_written": _c("points written to the store"),
    "gpufleet_store_write_errors": _c("store writes that failed"),
    "gpufleet_store_refused_reports": _c(
        "reports the store refused for what they hold (found by bisecting a refused batch)"),
    "gpufleet_store_points_dropped": _c("points the store rejected (e.g. field type conflict)"),
    "gpufleet_store_settles": _c(
        "settles of the embedded store's staged points into its tables (every 10 s and before reads)"),
    "gpufleet_store_settled_points": _c("staged points settled into the embedded store's tables"),
    "gpufleet_store_last_settle_seconds": _g("how long the embedded store's last settle took"),
    "gpufleet_store_settle_failures": _c(
        "settles that failed (a full disk: the points stay staged, reads answer without them)"),
    "gpufleet_writer_errors": _c(
        "group commits that failed unexpectedly (a bug; the reports were not acknowledged)"),
    "gpufleet_listener_errors": _c("exceptions raised by a durable-report listener, by listener", "listener"),
    "gpufleet_listener_reports_dropped": _c(
        "durable reports not given to the listeners because their queue was full"),
    "gpufleet_spool_bytes": _g("bytes held in the on-disk spool"),
    "gpufleet_spool_batches": _g("batches waiting in the spool for the store"),
    "gpufleet_spool_oldest_age_seconds": _g("age of the oldest spooled batch"),
    "gpufleet_spool_drain_points_per_second": _g("points drained to the store, last minute"),
    "gpufleet_spool_near_limit": _g("1 when the spool is past its warning fraction: alert"),
    "gpufleet_spool_refused_batches": _c("batches refused because the spool was full"),
    "gpufleet_spool_quarantined_batches": _g(
        "spooled batches kept aside now, the store having refused them again and again: look at them"),
    "gpufleet_spool_quarantined_points": _g("points kept in the spool's quarantine"),
    # /metrics itself (aggregator/http_endpoints.py, about the snapshot it answers from)
    "gpufleet_metrics_snapshot_age_seconds": _g(
        "how old this answer's metrics are (the aggregator's metrics_snapshot_s)"),
    "gpufleet_metrics_snapshots_computed": _c("/metrics snapshots computed since start"),
    "gpufleet_metrics_scrapes_refused": _c("scrapes answered 503 (past metrics_max_scrapes_per_s)"),
    # the Fleet API (aggregator/metrics.py)
    "gpufleet_fleet_requests": _c("Fleet API calls by method and status", "method", "code"),
    # readiness and the fleet (aggregator/status.py)
    "gpufleet_aggregator_ready": _g(
        "1 while this aggregator is ready (what /ready says; 0: see gpufleet status)"),
    "gpufleet_fleet_nodes": _g("nodes this aggregator knows, by liveness", "liveness"),
    # background tasks (aggregator/supervise.py)
    "gpufleet_task_restarts": _c("background tasks that crashed and were restarted, by task", "task"),
    # repair (aggregator/repair_wiring.py)
    "gpufleet_alerts": _c(
        "alert deliveries by sink and outcome (sent, failed_attempt, dropped)", "sink", "outcome"),
    "gpufleet_repair_actions": _c("repair actions by action and outcome", "action", "outcome"),
    "gpufleet_repair_nodes": _g("nodes in each repair workflow state", "state"),
    "gpufleet_repair_leader": _g("1 while this aggregator runs the repair controller (is the leader)"),
    "gpufleet_repair_breaker_tripped": _g("1 while the repair breaker is tripped: alert"),
    "gpufleet_alerts_held": _g("incident alerts held while the breaker is tripped"),
    "gpufleet_alert_store_errors": _c(
        "alert writes the repair state refused (fenced after a leader change, or unreachable)"),
    "gpufleet_repair_term_load_failures": _c(
        "attempts of this term to load its state from the control plane that failed (each logged)"),
    "gpufleet_repair_unrecorded_outcomes": _c(
        "reboot or ticket commands that finished but whose outcome the control plane refused (fenced, "
        "or unreachable): each logged, its ledger entry left begun"),
    "gpufleet_repair_passes": _c("repair passes run by this leader term"),
    "gpufleet_repair_pass_errors": _c("repair passes that failed with an error (each logged)"),
    "gpufleet_repair_scheduler_reads": _c("reads of the scheduler's view by this leader term"),
    "gpufleet_repair_last_pass_seconds": _g("how long the last repair pass took"),
    "gpufleet_history_export_points": _c(
        "repair actions and health findings this leader term copied into the history store"),
    "gpufleet_history_export_failures": _c(
        "history export passes that failed this leader term (each logged, tried again)"),
    "gpufleet_gpu_health": _g(
        "each GPU that is not ok: its health level (2 watch, 3 suspect, 4 faulty, 5 lost), by cluster, "
        "node, GPU and health word", "cluster", "node", "gpu", "health"),
    "gpufleet_gpu_flagged": _g(
        "1 for each finding the repair controller holds now, by node, GPU, code and severity",
        "node", "gpu", "code", "severity"),
    # serving pools (aggregator/fleet/pools.py)
    "gpufleet_pool_kv_cache_usage_ratio": _g(
        "KV-cache usage of a serving pool's serving replicas (stat: mean or max; 1 is a full cache)",
        "cluster", "model", "stat"),
    "gpufleet_pool_requests_waiting": _g("requests waiting in a serving pool's replicas", "cluster", "model"),
    "gpufleet_pool_replicas": _g("a serving pool's replicas by state", "cluster", "model", "state"),
    "gpufleet_pool_headroom_replicas": _g(
        "replicas that may leave a serving pool within its floor; negative: replicas short of it",
        "cluster", "model"),
    "gpufleet_pool_repairs_waiting_for_capacity": _g(
        "repairs whose drain waits for this pool's capacity (an autoscaler should add a replica)",
        "cluster", "model"),
    "gpufleet_pools_not_exported": _g(
        "serving pools not exported, past the per-scrape cap (aggregator/fleet/pools.py MAX_EXPORTED_POOLS)"),
    "gpufleet_pool_unverified_replicas": _g(
        "engine replicas nodes report that no declared pool places on them (in no pool's figures), by "
        "why (repair/placement.py)", "reason"),
    # workloads (aggregator/workloads/wiring.py)
    "gpufleet_workload_claims_refused": _c(
        "workloads a node named that the scheduler does not place on it (unknown_job, not_on_node) or "
        "that no scheduler is read to check (no_scheduler): not attributed", "reason"),
    "gpufleet_workload_owner_points_dropped": _c(
        "owner-series points (history by account, team...) dropped while the store could not take "
        "them (workload summaries are never dropped)"),
    "gpufleet_workload_scheduler_read_failures": _c("scheduler reads that failed"),
    "gpufleet_workloads_running": _g("workloads holding GPUs now, as the scheduler says"),
    "gpufleet_workload_scheduler_read_age_seconds": _g(
        "seconds since the scheduler was last read (NaN: never)"),
    # replicas and the control plane (aggregator/replication/control_plane.py)
    "gpufleet_control_plane_sync_errors": _c("control-plane syncs that failed (each logged)"),
    "gpufleet_control_plane_lease_errors": _c("lease reads or renewals that failed"),
    "gpufleet_repair_leader_terms": _c("times this replica became the repair leader"),
    "gpufleet_control_plane_call_timeouts": _c(
        "control-plane calls that had no answer within the call timeout (PostgreSQL hung or cut off)"),
    "gpufleet_control_plane_sync_age_seconds": _g(
        "seconds since this replica last reached the control plane"),
}
# fmt: on


def _declared(name: str, kind: str) -> Declared:
    spec = DECLARED.get(name)
    if spec is None or spec.kind != kind:
        raise KeyError(f"{name} is not declared as a {kind} in aggregator/declared_metrics.py")
    return spec


def counter(registry: CollectorRegistry, name: str) -> Counter:
    spec = _declared(name, "counter")
    return Counter(name, spec.help, list(spec.labels), registry=registry)


def gauge(registry: CollectorRegistry, name: str) -> Gauge:
    spec = _declared(name, "gauge")
    return Gauge(name, spec.help, list(spec.labels), registry=registry)


def histogram(registry: CollectorRegistry, name: str) -> Histogram:
    spec = _declared(name, "histogram")
    return Histogram(name, spec.help, list(spec.labels), registry=registry)


def gauges(registry: CollectorRegistry, reads: Mapping[str, Callable[[], float]]) -> None:
    """Unlabelled gauges, each read at scrape time."""
    for name, read in reads.items():
        gauge(registry, name).set_function(lambda read=read: float(read()))


class _Totals:
    """Running totals a part keeps (an object's failure count), exposed as counters: read at
    scrape time, so the part counts as it always did and /metrics types them as what they are."""

    def __init__(self, reads: Mapping[str, Callable[[], float]]) -> None:
        self._reads = {name: (_declared(name, "counter"), read) for name, read in reads.items()}

    def collect(self) -> Iterable[Metric]:
        for name, (spec, read) in self._reads.items():
            yield CounterMetricFamily(name, spec.help, value=float(read()))

    def describe(self) -> Iterable[Metric]:
        for name, (spec, _) in self._reads.items():
            yield CounterMetricFamily(name, spec.help)


def totals(registry: CollectorRegistry, reads: Mapping[str, Callable[[], float]]) -> None:
    """Unlabelled counters whose value is a running total read at scrape time."""
    registry.register(_Totals(reads))


def family(name: str) -> GaugeMetricFamily:
    """A labelled gauge family for a collector that renders it at scrape time (pools, health)."""
    spec = _declared(name, "gauge")
    return GaugeMetricFamily(name, spec.help, labels=list(spec.labels) or None)


def exposition(name: str, value: float) -> str:
    """One unlabelled sample in the text format, for what is written beside a registry's output
    (the snapshot's own age and counts): its HELP and TYPE from its declaration."""
    spec = DECLARED[name]
    shown = f"{name}_total" if spec.kind == "counter" else name
    return f"# HELP {shown} {spec.help}\n# TYPE {shown} {spec.kind}\n{shown} {value:g}\n"
