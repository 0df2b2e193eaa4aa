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

from gpufleet.aggregator.declared_metrics import exposition
from gpufleet.common.bounded_http import BoundedHTTPServer
from gpufleet.common.bounded_http import serve as serve_routes


class MetricsSnapshot:
    """The /metrics body, computed at most once per max_age_s by one scrape at a time: scrapes
    that come while it is computed wait for it and share it, so any number of unauthenticated
    scrapers cost one computation per max_age_s (docs/security.md "Serving pools and the
    capacity guard"). It runs on the HTTP server's threads, never on the event loop that
    acknowledges reports; what it reads of the fleet is the repair pass's copy or a list copy of
    the live view. Answers are paced to max_per_s across all scrapers: one over the pace waits
    its turn on its own thread (no CPU) and is answered 503 at once when its turn is more than
    MAX_QUEUE_S away, so scrapers in a loop cannot take the cores ingest runs on (Prometheus
    scrapes a target every 15 to 60 s). The snapshot's age and how many were computed are
    appended to every answer."""

    MAX_QUEUE_S = 10.0

    def __init__(
        self,
        registry: CollectorRegistry,
        max_age_s: float,
        max_per_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry, self._max_age_s, self._clock = registry, max_age_s, clock
        self._interval_s = 1.0 / max_per_s if max_per_s > 0 else 0.0
        self._lock = threading.Lock()
        self._pace_lock = threading.Lock()
        self._next_s = -float("inf")  # when the next scrape may be answered
        self._body = b""
        self._at = -float("inf")
        self.computed_total = 0
        self.refused_total = 0

    def answer(self) -> tuple[int, str, bytes]:
        """/metrics' route: (status, content type, body)."""
        if not self._wait_turn():
            self.refused_total += 1
            return 503, "text/plain; charset=utf-8", b"too many /metrics scrapes: try again later\n"
        return 200, CONTENT_TYPE_LATEST, self.body()

    def _wait_turn(self) -> bool:
        if not self._interval_s:
            return True
        with self._pace_lock:
            now = self._clock()
            turn = max(self._next_s, now)
            if turn - now > self.MAX_QUEUE_S:
                return False
            self._next_s = turn + self._interval_s
        if turn > now:
            time.sleep(turn - now)  # pacing, not synchronisation: this scrape waits its turn
        return True

    def body(self) -> bytes:
        with self._lock:
            if self._clock() - self._at >= self._max_age_s or not self._body:
                self._body = generate_latest(self._registry)
                self._at = self._clock()
                self.computed_total += 1
            age_s = max(0.0, self._clock() - self._at)
            body, computed = self._body, self.computed_total
        return (
            body
            + (
                exposition("gpufleet_metrics_snapshot_age_seconds", round(age_s, 3))
                + exposition("gpufleet_metrics_snapshots_computed", computed)
                + exposition("gpufleet_metrics_scrapes_refused", self.refused_total)
            ).encode()
        )


def serve(
    host: str,
    port: int,
    registry: CollectorRegistry,
    unhealthy: Callable[[], list[str]],
    snapshot_s: float = 0.0,
    max_scrapes_per_s: float = 0.0,
) -> BoundedHTTPServer:
    """Start serving in a daemon thread (common/bounded_http.py: bounded connections and idle
    timeouts); the caller shuts the server down. snapshot_s and max_scrapes_per_s: /metrics'
    MetricsSnapshot (0: computed for each scrape, unpaced)."""
    snapshot = MetricsSnapshot(registry, snapshot_s, max_scrapes_per_s)

    def ready() -> tuple[int, str, bytes]:
        reasons = unhealthy()
        body = json.dumps({"ready": not reasons, "reasons": reasons}).encode()
        return (503 if reasons else 200), "application/json", body

    return serve_routes(
        host,
        port,
        {
            "/metrics": snapshot.answer,
            "/healthz": lambda: (200, "text/plain; charset=utf-8", b"ok\n"),
            "/ready": ready,
        },
    )
