"""A small HTTP server for metrics and probes whose cost is bounded (docs/security.md "Before
authentication"): at most max_connections handled at once (the next is answered 503 and
closed at once, not queued on a thread of its own), and a connection idle for timeout_s is
closed. The standard library's ThreadingHTTPServer, which prometheus_client's
start_http_server uses too, gives every connection a thread for as long as it stays open."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Route = Callable[[], tuple[int, str, bytes]]  # () -> (status, content type, body)
_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class BoundedHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        routes: dict[str, Route],
        max_connections: int = 64,
        timeout_s: float = 5.0,
    ) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        self.refused_total = 0
        known = ", ".join(sorted(routes))

        class Handler(BaseHTTPRequestHandler):
            timeout = timeout_s  # socket timeout: a connection idle this long is closed
            protocol_version = "HTTP/1.0"

            def do_GET(self) -> None:
                route = routes.get(self.path.split("?", 1)[0])
                if route is None:
                    status, content_type, body = (
                        404,
                        "text/plain; charset=utf-8",
                        f"not found: try {known}\n".encode(),
                    )
                else:
                    status, content_type, body = route()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return  # probes every few seconds would flood the log

        super().__init__(address, Handler)

    def process_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        if not self._slots.acquire(blocking=False):
            self.refused_total += 1
            with contextlib.suppress(OSError):
                request.sendall(_BUSY)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def serve(host: str, port: int, routes: dict[str, Route], max_connections: int = 64) -> BoundedHTTPServer:
    """Serve routes on host:port (port 0 picks one) in a daemon thread; the caller shuts it down."""
    server = BoundedHTTPServer((host or "0.0.0.0", port), routes, max_connections)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
