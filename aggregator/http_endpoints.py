"""The aggregator's HTTP port: Prometheus `/metrics`, liveness `/healthz`, readiness `/ready`.

prometheus_client's own start_http_server answers every path with the metrics, so a
readiness probe could not fail there; this small server keeps its exposition (generate_latest)
and adds the two probes. `/ready` answers 200 with `{"ready": true}` while the watchdog finds
nothing wrong, else 503 with the reasons, so Kubernetes takes a replica that cannot
acknowledge out of its Service and an operator's probe says why.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gpufleet.common.bounded_http import BoundedHTTPServer
from gpufleet.common.bounded_http import serve as serve_routes


class MetricsSnapshot:
    """The /metrics body, computed at most once per max_age_s by one scrape at a time: scrapes
    that come while it is computed wait for it and share it, so any number of unauthenticated
    scrapers cost one computation per max_age_s (docs/security.md "Before authentication"). It
    runs on the HTTP server's threads, never on the event loop that acknowledges reports; what
    it reads of the fleet is the repair pass's copy or a list copy of the live view. Its age is
    appended to every answer as gpufleet_metrics_snapshot_age_seconds."""

    def __init__(
        self, registry: CollectorRegistry, max_age_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._registry, self._max_age_s, self._clock = registry, max_age_s, clock
        self._lock = threading.Lock()
        self._body = b""
        self._at = -float("inf")
        self.computed_total = 0

    def body(self) -> bytes:
        with self._lock:
            if self._clock() - self._at >= self._max_age_s or not self._body:
                self._body = generate_latest(self._registry)
                self._at = self._clock()
                self.computed_total += 1
            age_s = max(0.0, self._clock() - self._at)
            body = self._body
        return body + (
            "# HELP gpufleet_metrics_snapshot_age_seconds how old this answer's metrics are "
            "(the aggregator's metrics_snapshot_s)\n"
            "# TYPE gpufleet_metrics_snapshot_age_seconds gauge\n"
            f"gpufleet_metrics_snapshot_age_seconds {age_s:.3f}\n"
        ).encode()


def serve(
    host: str,
    port: int,
    registry: CollectorRegistry,
    unhealthy: Callable[[], list[str]],
    snapshot_s: float = 0.0,
) -> BoundedHTTPServer:
    """Start serving in a daemon thread (common/bounded_http.py: bounded connections and idle
    timeouts); the caller shuts the server down. snapshot_s: /metrics' MetricsSnapshot age."""
    snapshot = MetricsSnapshot(registry, snapshot_s)

    def ready() -> tuple[int, str, bytes]:
        reasons = unhealthy()
        body = json.dumps({"ready": not reasons, "reasons": reasons}).encode()
        return (503 if reasons else 200), "application/json", body

    return serve_routes(
        host,
        port,
        {
            "/metrics": lambda: (200, CONTENT_TYPE_LATEST, snapshot.body()),
            "/healthz": lambda: (200, "text/plain; charset=utf-8", b"ok\n"),
            "/ready": ready,
        },
    )
