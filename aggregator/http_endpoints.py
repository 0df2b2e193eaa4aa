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
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def serve(
    host: str, port: int, registry: CollectorRegistry, unhealthy: Callable[[], list[str]]
) -> ThreadingHTTPServer:
    """Start serving in a daemon thread; the caller shuts the server down."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
            elif path == "/healthz":
                self._send(200, "text/plain; charset=utf-8", b"ok\n")
            elif path == "/ready":
                reasons = unhealthy()
                body = json.dumps({"ready": not reasons, "reasons": reasons}).encode()
                self._send(503 if reasons else 200, "application/json", body)
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found: try /metrics, /healthz or /ready\n")

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # probes every few seconds would flood the log

    server = ThreadingHTTPServer((host or "0.0.0.0", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
