"""A simulated inference engine for simulated nodes: a real HTTP /metrics endpoint in vLLM's
or SGLang's format whose KV-cache pressure follows the node's simulated GPU load, so the demo
exercises the same scrape-and-parse path as a real engine.

KV usage tracks GPU utilization (a busy replica holds more sequences); past 90 % requests
start to queue, past 95 % the engine preempts (vLLM) or retracts (SGLang) requests.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpufleet.collector.simnvml.machine import SimulatedNode

ENGINES = ("vllm", "sglang")
FINISH_S = 8.0  # out of rotation, the requests in flight are all done within this
MODELS = {"vllm": "meta-llama/Llama-3.1-70B-Instruct", "sglang": "Qwen/Qwen2.5-72B-Instruct"}


class SimulatedEngine:
    def __init__(self, node: SimulatedNode, engine: str, seed: int = 0) -> None:
        if engine not in ENGINES:
            raise ValueError(f"simulated engine {engine!r} is not one of {', '.join(ENGINES)}")
        self.node = node
        self.engine = engine
        self.model = MODELS[engine]
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._preemptions = 0
        self._prefix_queries = 0
        self._prefix_hits = 0
        self._server: ThreadingHTTPServer | None = None
        self._left: tuple[float, int, float] | None = None  # (when, running, KV) at leaving rotation

    def _state(self) -> tuple[float, int, int]:
        self.node.advance()
        gpus = [g for g in self.node.gpus if not g.lost]
        util = sum(g.util_gpu_pct for g in gpus) / len(gpus) if gpus else 0.0
        kv = min(1.0, max(0.0, 0.05 + 0.95 * util / 100 + self._rng.gauss(0, 0.02)))
        running = int(util * 0.6)
        waiting = int(max(0.0, kv - 0.9) * 400)
        if not self.node.engines_in_rotation:
            # Out of rotation (the drain's leave): no request arrives; those in flight finish
            # within FINISH_S, their KV-cache freed as they do, so a graceful drain sees 0 running.
            now = time.monotonic()
            if self._left is None:
                self._left = (now, running, kv)
            since, running_then, kv_then = self._left
            share = max(0.0, 1.0 - (now - since) / FINISH_S)
            return kv_then * share, int(running_then * share), 0
        self._left = None
        with self._lock:
            if kv > 0.95:
                self._preemptions += self._rng.randint(1, 3)
            self._prefix_queries += running * 512
            self._prefix_hits += int(running * 512 * 0.35)
        return kv, running, waiting

    def render(self) -> str:
        kv, running, waiting = self._state()
        if self.engine == "vllm":
            labels = f'engine="0",model_name="{self.model}"'
            return (
                "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
                "# TYPE vllm:kv_cache_usage_perc gauge\n"
                f"vllm:kv_cache_usage_perc{{{labels}}} {kv:.4f}\n"
                "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
                "# TYPE vllm:num_requests_running gauge\n"
                f"vllm:num_requests_running{{{labels}}} {running}.0\n"
                "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
                "# TYPE vllm:num_requests_waiting gauge\n"
                f"vllm:num_requests_waiting{{{labels}}} {waiting}.0\n"
                "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.\n"
                "# TYPE vllm:num_preemptions_total counter\n"
                f"vllm:num_preemptions_total{{{labels}}} {self._preemptions}.0\n"
                "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in tokens.\n"
                "# TYPE vllm:prefix_cache_queries_total counter\n"
                f"vllm:prefix_cache_queries_total{{{labels}}} {self._prefix_queries}.0\n"
                "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in tokens.\n"
                "# TYPE vllm:prefix_cache_hits_total counter\n"
                f"vllm:prefix_cache_hits_total{{{labels}}} {self._prefix_hits}.0\n"
            )
        lines = []
        for name, help_text, value in (
            ("sglang:token_usage", "The token usage", f"{kv:.4f}"),
            ("sglang:num_running_reqs", "The number of running requests", f"{running}.0"),
            ("sglang:num_queue_reqs", "The number of requests in the waiting queue", f"{waiting}.0"),
            ("sglang:cache_hit_rate", "The prefix cache hit rate", "0.35"),
            ("sglang:num_retracted_reqs", "The number of retracted requests", f"{self._preemptions}.0"),
        ):
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
            for rank in range(min(4, len(self.node.gpus)) or 1):
                lines.append(
                    f'{name}{{engine_type="unified",model_name="{self.model}",pp_rank="0",'
                    f'tp_rank="{rank}"}} {value}'
                )
        return "\n".join(lines) + "\n"

    def serve(self) -> str:
        """Start serving on a free loopback port; return the /metrics URL."""
        self._server = serve_metrics(self.render, "sim-engine")
        return f"http://127.0.0.1:{self._server.server_port}/metrics"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()


def serve_metrics(render: Callable[[], str | None], name: str) -> ThreadingHTTPServer:
    """A loopback HTTP server whose /metrics answers render()'s text (None: 503, an engine
    that has stopped), on a thread of its own; shut it down with .shutdown()."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/metrics":
                self.send_error(404)
                return
            text = render()
            if text is None:
                self.send_error(503)
                return
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    return server
