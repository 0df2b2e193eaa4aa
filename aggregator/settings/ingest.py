"""Ingest: what one report and one node may hold and cost (docs/security.md "Bounded per-node
state"), the worker processes, and when a node counts as stale or silent."""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpufleet.aggregator.ingest.budget import BudgetLimits
from gpufleet.aggregator.settings import require, setting

AUTO_WORKERS = -1
MAX_AUTO_WORKERS = 8


def workers_for_cores() -> int:
    """ingest_workers = -1: one worker process per core this process may run on, up to 8. On
    two cores that is two workers beside the main process, which keeps the streams: measured
    (docs/benchmarks.md) better than one (the checks and store writes then wait for each other)
    and than none (everything on one core)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(MAX_AUTO_WORKERS, cores))


@dataclass
class IngestSettings:
    max_report_bytes: int = setting(
        1024 * 1024,
        "largest report accepted; larger ones are rejected with RESOURCE_EXHAUSTED",
    )
    max_clock_skew_s: float = setting(300.0, "how far ahead of the aggregator's clock a report may be")
    hello_timeout_s: float = setting(
        20.0, "an authenticated collector stream that sends no hello within this is refused"
    )
    max_hello_bytes: int = setting(
        256 * 1024,
        "largest hello (a collector's first message) accepted; a larger one is refused before it is "
        "decoded (a hello with every field at its maximum, 64 GPUs, is 18,387 bytes)",
    )
    max_hellos_per_node: int = setting(
        4,
        "streams of one node's credential waiting for their hello at once; more are refused with "
        "RESOURCE_EXHAUSTED before anything is read (a collector opens one)",
    )
    max_streams: int = setting(
        50_000, "collector streams open at once (authenticated or not); more are refused"
    )
    max_streams_per_peer: int = setting(
        256, "collector streams open at once from one peer address (a NAT in front of many nodes: raise it)"
    )
    node_reports_per_s: float = setting(
        50.0, "reports a second one node may send on average; faster, its stream is read more slowly"
    )
    node_report_burst: int = setting(
        4000, "reports one node may send at once above that rate (a collector replaying its buffer)"
    )
    node_bytes_per_s: float = setting(262144.0, "report bytes a second one node may send on average")
    node_byte_burst: int = setting(16 * 1024 * 1024, "report bytes one node may send at once above that")
    max_series_per_node: int = setting(
        256,
        "distinct series (GPUs by index, uuid, model; engines by name, model, port) one node may make "
        "within series_window_s; a hello or report past it is refused",
    )
    series_window_s: float = setting(86400.0, "the window of max_series_per_node, in seconds")
    ingest_workers: int = setting(
        AUTO_WORKERS,
        "processes that decode, validate and store reports (-1: one per core, up to 8; 0: the main "
        "process does it; N: N worker processes beside it; a node's reports always go to one)",
    )
    ingest_backlog_max_bytes: int = setting(
        64 * 1024 * 1024,
        "report bytes handed to the ingest workers and not yet durable, at most (the backlog's memory "
        "ceiling): past it the aggregator reads no more reports until the workers catch up, and the "
        "collectors keep theirs (they replay); gpufleet_ingest_backlog_bytes shows it",
    )
    stale_after_intervals: float = setting(
        3.0,
        "a node is stale after this many of its sampling intervals without a report",
    )
    silent_after_intervals: float = setting(
        10.0,
        "a node is silent after this many intervals without a report",
    )

    def budget_limits(self) -> BudgetLimits:
        """What one node may cost the ingest (aggregator/ingest/budget.py)."""
        return BudgetLimits(
            self.node_reports_per_s,
            self.node_report_burst,
            self.node_bytes_per_s,
            self.node_byte_burst,
            self.max_series_per_node,
            self.series_window_s,
        )

    def check_ingest(self) -> None:
        require(
            self.max_report_bytes >= 1024, f"max_report_bytes={self.max_report_bytes} must be at least 1024"
        )
        require(
            0.1 <= self.hello_timeout_s <= 600,
            f"hello_timeout_s={self.hello_timeout_s:g} must be between 0.1 and 600",
        )
        require(
            1024 <= self.max_hello_bytes <= 64 * 1024 * 1024,
            f"max_hello_bytes={self.max_hello_bytes} must be between 1024 and 67108864",
        )
        require(
            1 <= self.max_hellos_per_node <= 1000,
            f"max_hellos_per_node={self.max_hellos_per_node} must be between 1 and 1000",
        )
        require(
            -1 <= self.ingest_workers <= 64,
            f"ingest_workers={self.ingest_workers} must be -1 (one per core), 0 (in the main process) "
            "or up to 64",
        )
        if self.ingest_workers == AUTO_WORKERS:
            self.ingest_workers = workers_for_cores()
        require(
            1024 * 1024 <= self.ingest_backlog_max_bytes <= 64 * 1024**3,
            f"ingest_backlog_max_bytes={self.ingest_backlog_max_bytes} must be between 1 MiB and 64 GiB",
        )
        require(
            1 <= self.max_streams_per_peer <= self.max_streams <= 1_000_000,
            f"need 1 <= max_streams_per_peer ({self.max_streams_per_peer}) <= max_streams "
            f"({self.max_streams}) <= 1000000",
        )
        require(
            self.node_reports_per_s > 0 and self.node_bytes_per_s > 0,
            "node_reports_per_s and node_bytes_per_s must be more than 0",
        )
        require(
            self.node_report_burst >= 1 and self.node_byte_burst >= 2 * self.max_report_bytes,
            f"node_report_burst ({self.node_report_burst}) must be at least 1 and node_byte_burst "
            f"({self.node_byte_burst}) at least twice max_report_bytes ({self.max_report_bytes})",
        )
        require(
            8 <= self.max_series_per_node <= 100_000 and self.series_window_s >= 60,
            f"max_series_per_node={self.max_series_per_node} must be 8..100000 and "
            f"series_window_s={self.series_window_s:g} at least 60",
        )
        require(
            1 <= self.stale_after_intervals < self.silent_after_intervals,
            f"need 1 <= stale_after_intervals ({self.stale_after_intervals:g}) < "
            f"silent_after_intervals ({self.silent_after_intervals:g})",
        )
