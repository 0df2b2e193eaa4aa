"""Inference replicas serving a request stream, for the graceful-drain tests.

Each `ServingEngine` is one replica: requests it accepts run for `request_s` and then finish;
its real HTTP /metrics (vLLM's names) says how many are running, so a collector scrapes it as it
would vLLM. `terminate()` is what a SIGTERM does to vLLM without --shutdown-timeout: every
request still in flight is aborted (counted). A `Router` sends requests round-robin to the
replicas in rotation, as a Service or an InferencePool's endpoint picker would, a bounded
number of times. `Control` is a loopback HTTP API an operator's commands call (the hook and
Slurm backends' repair_drain_engine_command and drain hook): /leave/NODE/PORT takes a replica
out of rotation, /evict/NODE terminates the node's replicas."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpufleet.collector.simnvml.engine_server import serve_metrics

MODEL = "meta-llama/Llama-3.1-70B-Instruct"


class ServingEngine:
    def __init__(self, node: str, port_label: int = 8000, request_s: float = 1.5) -> None:
        self.node, self.port_label, self.request_s = node, port_label, request_s
        self._lock = threading.Lock()
        self._ends: list[float] = []  # monotonic end time of each request in flight
        self.accepted = self.finished = self.aborted = 0
        self.left_rotation = False
        self.terminated = False
        self.running_at_termination: int | None = None
        # A stopped engine answers no scrape (503), as a terminated pod's port would not.
        self._server = serve_metrics(lambda: None if self.terminated else self.render(), f"engine-{node}")
        self.url = f"http://127.0.0.1:{self._server.server_port}/metrics"

    def _settle(self) -> None:
        now = time.monotonic()
        done = [t for t in self._ends if t <= now]
        self.finished += len(done)
        self._ends = [t for t in self._ends if t > now]

    @property
    def running(self) -> int:
        with self._lock:
            self._settle()
            return len(self._ends)

    def accept(self) -> bool:
        with self._lock:
            if self.terminated:
                return False
            self._ends.append(time.monotonic() + self.request_s)
            self.accepted += 1
            return True

    def terminate(self) -> None:
        """SIGTERM without a shutdown timeout: what is in flight is aborted."""
        with self._lock:
            self._settle()
            self.running_at_termination = len(self._ends)
            self.aborted += len(self._ends)
            self._ends = []
            self.terminated = True

    def render(self) -> str:
        running = self.running
        labels = f'engine="0",model_name="{MODEL}"'
        return (
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{{{labels}}} {min(1.0, 0.05 * running):.4f}\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{labels}}} {running}.0\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{{{labels}}} 0.0\n"
        )

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class Router:
    """Every interval_s, one request to the next replica in rotation (in_rotation(engine));
    at most max_requests and max_s, then it stops by itself."""

    def __init__(
        self,
        engines: list[ServingEngine],
        in_rotation: Callable[[ServingEngine], bool],
        interval_s: float = 0.05,
        max_requests: int = 5000,
        max_s: float = 180.0,
    ) -> None:
        self._engines, self._in_rotation = engines, in_rotation
        self._interval_s, self._max_requests, self._max_s = interval_s, max_requests, max_s
        self._stop = threading.Event()
        self.sent = self.unrouted = 0
        self._thread = threading.Thread(target=self._run, name="router", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        started, turn = time.monotonic(), 0
        while not self._stop.wait(self._interval_s):
            if self.sent + self.unrouted >= self._max_requests or time.monotonic() - started > self._max_s:
                return
            ready = [e for e in self._engines if not e.terminated and self._in_rotation(e)]
            if not ready:
                self.unrouted += 1
                continue
            turn += 1
            if ready[turn % len(ready)].accept():
                self.sent += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class Control:
    """The operator's API that their commands call (loopback HTTP)."""

    def __init__(self, engines: dict[str, ServingEngine]) -> None:
        self.calls: list[str] = []
        control = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = self.path.strip("/").split("/")
                control.calls.append(self.path)
                engine = engines.get(parts[1]) if len(parts) >= 2 else None
                if engine is None or parts[0] not in ("leave", "evict"):
                    self.send_error(404)
                    return
                if parts[0] == "leave":
                    engine.left_rotation = True
                else:
                    engine.terminate()
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        threading.Thread(target=self._server.serve_forever, name="control", daemon=True).start()

    def command(self, action: str, *placeholders: str) -> str:
        """A command line that calls /ACTION/{node}[/{port}] (run with no shell by the backend)."""
        path = "/".join([action, *placeholders])
        code = "import sys, urllib.request; urllib.request.urlopen(sys.argv[1])"
        return f"{sys.executable} -c '{code}' {self.url}/{path}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
