"""A simulated serving pool: inference replicas behind a router, serving a request stream, for
the demo (`gpufleet demo --scenario examples/serving.toml`) and the graceful-drain tests.

Each `Replica` is one engine: a request it accepts runs for `request_s` and then finishes; each
running request holds `kv_per_request` of its KV-cache, and past a full cache the rest wait.
Its real HTTP /metrics (vLLM's names) says so, so a collector scrapes it as it would vLLM.
`terminate()` is what a SIGTERM does to vLLM without --shutdown-timeout: every request still in
flight is aborted (counted). A replica not yet started answers no scrape (503), as a pod that
is not up; `start()` brings it in.

A `Router` sends requests round-robin to the replicas in rotation, as a Service or an
InferencePool's endpoint picker would: a replica that leaves puts its share of the stream on
the others, so their KV-cache usage rises. `Control` is a loopback HTTP API the operator's
commands call (the hook backend's cordon, drain and uncordon, repair_drain_engine_command):
/leave/NODE/PORT takes a node's replicas out of rotation, /evict/NODE terminates them (the
drain), /uncordon/NODE starts them again and puts them back, /cordon/NODE is recorded (a cordon
stops new work being scheduled, not serving). With the demo's scheduler (scheduler.py), the same
commands set each node's state there: cordon stops new jobs, evict stops the node's job,
uncordon lets work start again."""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpufleet.collector.simnvml.engine_server import serve_metrics
from gpufleet.collector.simnvml.scheduler import (
    CORDONED,
    DRAINED,
    IN_SERVICE,
    OUT_OF_ROTATION,
    ScheduledState,
)

MODEL = "meta-llama/Llama-3.1-70B-Instruct"


class Replica:
    def __init__(
        self,
        node: str,
        model: str = MODEL,
        request_s: float = 1.5,
        kv_per_request: float = 0.05,
        started: bool = True,
    ) -> None:
        self.node, self.model, self.request_s, self.kv_per_request = node, model, request_s, kv_per_request
        self._lock = threading.Lock()
        self._ends: list[float] = []  # monotonic end time of each request in flight
        self.accepted = self.finished = self.aborted = 0
        self.started = started
        self.left_rotation = False
        self.terminated = False
        self.running_at_termination: int | None = None
        # A stopped or not yet started engine answers no scrape (503).
        self._server = serve_metrics(self._render_if_up, f"engine-{node}")
        self.url = f"http://127.0.0.1:{self._server.server_port}/metrics"

    @property
    def up(self) -> bool:
        return self.started and not self.terminated

    def _settle(self) -> None:
        now = time.monotonic()
        done = [t for t in self._ends if t <= now]
        self.finished += len(done)
        self._ends = [t for t in self._ends if t > now]

    @property
    def in_flight(self) -> int:
        with self._lock:
            self._settle()
            return len(self._ends)

    def accept(self) -> bool:
        with self._lock:
            if not self.up:
                return False
            self._ends.append(time.monotonic() + self.request_s)
            self.accepted += 1
            return True

    def start(self) -> None:
        """The replica comes up (again) and back into rotation."""
        with self._lock:
            self.started, self.terminated, self.left_rotation = True, False, False

    def terminate(self) -> None:
        """SIGTERM without a shutdown timeout: what is in flight is aborted."""
        with self._lock:
            self._settle()
            self.running_at_termination = len(self._ends)
            self.aborted += len(self._ends)
            self._ends = []
            self.terminated = True

    def _render_if_up(self) -> str | None:
        return self.render() if self.up else None

    def render(self) -> str:
        in_flight = self.in_flight
        # A full cache holds floor(1 / kv_per_request) requests; the rest wait for room.
        room = math.floor(1 / self.kv_per_request) if self.kv_per_request > 0 else in_flight
        running, waiting = min(in_flight, room), max(0, in_flight - room)
        labels = f'engine="0",model_name="{self.model}"'
        return (
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{{{labels}}} {min(1.0, self.kv_per_request * running):.4f}\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{labels}}} {running}.0\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{{{labels}}} {waiting}.0\n"
        )

    # vLLM takes this share of each GPU's memory at start (its gpu_memory_utilization default):
    # the weights, then the rest preallocated as KV-cache, held whatever the batch.
    HBM_HELD_FRACTION = 0.9

    def gpu_load(self) -> tuple[float, float]:
        """What this replica asks of its GPUs: (utilization %, HBM fraction). Decode keeps the
        GPUs as busy as the batch is full (its KV-cache usage); HBM is held from start. Down (not
        joined, drained): (0, 0), nothing on the GPUs."""
        if not self.up:
            return 0.0, 0.0
        in_flight = self.in_flight
        room = math.floor(1 / self.kv_per_request) if self.kv_per_request > 0 else max(1, in_flight)
        return round(100.0 * min(in_flight, room) / max(1, room), 1), self.HBM_HELD_FRACTION

    def figures(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "url": self.url,
            "up": self.up,
            "in_rotation": self.up and not self.left_rotation,
            "in_flight": self.in_flight,
            "accepted": self.accepted,
            "finished": self.finished,
            "aborted": self.aborted,
        }

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class Router:
    """Every interval_s, one request to the next replica in rotation (in_rotation(replica));
    at most max_requests and max_s (None: until stop()), then it stops by itself."""

    def __init__(
        self,
        replicas: list[Replica],
        in_rotation: Callable[[Replica], bool],
        interval_s: float = 0.05,
        max_requests: int | None = 5000,
        max_s: float | None = 180.0,
    ) -> None:
        self._replicas, self._in_rotation = replicas, in_rotation
        self._interval_s, self._max_requests, self._max_s = interval_s, max_requests, max_s
        self._stop = threading.Event()
        self.sent = self.unrouted = 0
        self._thread = threading.Thread(target=self._run, name="router", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        started, turn = time.monotonic(), 0
        while not self._stop.wait(self._interval_s):
            if self._max_requests is not None and self.sent + self.unrouted >= self._max_requests:
                return
            if self._max_s is not None and time.monotonic() - started > self._max_s:
                return
            ready = [r for r in self._replicas if r.up and self._in_rotation(r)]
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

    ACTIONS = ("leave", "evict", "cordon", "uncordon")
    # What each command makes of the node in the demo's scheduler.
    SCHEDULED = {"cordon": CORDONED, "leave": OUT_OF_ROTATION, "evict": DRAINED, "uncordon": IN_SERVICE}

    def __init__(
        self, replicas: dict[str, Replica], scheduled: dict[str, ScheduledState] | None = None
    ) -> None:
        """replicas: each serving node's engine; scheduled: each demo node's scheduler state (a
        node named in a call and in neither is answered 204 and nothing is done: the name is
        only ever a key here, never a path)."""
        self.calls: list[str] = []
        control = self
        scheduled = scheduled or {}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = self.path.strip("/").split("/")
                control.calls.append(self.path)
                if len(parts) < 2 or parts[0] not in Control.ACTIONS:
                    self.send_error(404)
                    return
                state = scheduled.get(parts[1])
                if state is not None and parts[0] in Control.SCHEDULED:
                    state.write(Control.SCHEDULED[parts[0]])
                replica = replicas.get(parts[1])
                if replica is not None:  # a node that serves nothing: nothing to do
                    if parts[0] == "leave":
                        replica.left_rotation = True
                    elif parts[0] == "evict":
                        replica.terminate()
                    elif parts[0] == "uncordon":
                        replica.start()
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

    def backend_options(self) -> list[str]:
        """The aggregator's hook backend on this API: cordon, drain (evict), uncordon and the
        engines' leaving rotation are calls to it."""
        return [
            "--repair-backend",
            "hook",
            "--repair-hook-cordon",
            self.command("cordon", "{node}"),
            "--repair-hook-uncordon",
            self.command("uncordon", "{node}"),
            "--repair-hook-drain",
            self.command("evict", "{node}"),
            "--repair-drain-engine-command",
            self.command("leave", "{node}", "{port}"),
            "--repair-hook-timeout-s",
            "30",
        ]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
