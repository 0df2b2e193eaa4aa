"""A real HTTP server on loopback that receives alerts (webhook, Slack, PagerDuty formats)
and can refuse the first deliveries to test retries."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class AlertReceiver:
    def __init__(self, fail_first: int = 0, port: int = 0) -> None:
        self.received: list[dict[str, Any]] = []  # accepted deliveries, in order
        self.attempts = 0
        self._fail_left = fail_first
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver._lock:
                    receiver.attempts += 1
                    if receiver._fail_left > 0:
                        receiver._fail_left -= 1
                        self.send_response(500)
                        self.end_headers()
                        return
                    receiver.received.append(
                        {
                            "path": self.path,
                            "authorization": self.headers.get("Authorization", ""),
                            **json.loads(body),
                        }
                    )
                self.send_response(202)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def for_key(self, key: str) -> list[dict[str, Any]]:
        with self._lock:
            return [a for a in self.received if a.get("key") == key]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
