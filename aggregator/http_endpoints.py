"""The aggregator's HTTP port: Prometheus `/metrics`, liveness `/healthz`, readiness `/ready`.

prometheus_client's own start_http_server answers every path with the metrics, so a
readiness probe could not fail there; this small server keeps its exposition (generate_latest)
and adds the two probes. `/ready` answers 200 with `{"ready": true}` while the watchdog finds
nothing wrong, else 503 with the reasons, so Kubernetes takes a replica that cannot
acknowledge out of its Service and an operator's probe says why.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gpufleet.common.bounded_http import BoundedHTTPServer
from gpufleet.common.bounded_http import serve as serve_routes


def serve(
    host: str, port: int, registry: CollectorRegistry, unhealthy: Callable[[], list[str]]
) -> BoundedHTTPServer:
    """Start serving in a daemon thread (common/bounded_http.py: bounded connections and idle
    timeouts); the caller shuts the server down."""

    def ready() -> tuple[int, str, bytes]:
        reasons = unhealthy()
        body = json.dumps({"ready": not reasons, "reasons": reasons}).encode()
        return (503 if reasons else 200), "application/json", body

    return serve_routes(
        host,
        port,
        {
            "/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(registry)),
            "/healthz": lambda: (200, "text/plain; charset=utf-8", b"ok\n"),
            "/ready": ready,
        },
    )
