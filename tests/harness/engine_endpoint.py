"""A real HTTP /metrics endpoint on loopback in vLLM's format whose KV-cache usage and
request counts the test sets: an inference engine replica a collector scrapes (`--engines
URL`), standing in for vLLM where no GPU runs one (names as vLLM exposes them:
../shared/research/kv_metrics.md)."""

from __future__ import annotations

from gpufleet.collector.simnvml.engine_server import serve_metrics

MODEL = "meta-llama/Llama-3.1-70B-Instruct"


class EngineEndpoint:
    def __init__(
        self, kv_cache_usage_ratio: float, running: int = 20, waiting: int = 0, model: str = MODEL
    ) -> None:
        self.kv_cache_usage_ratio = kv_cache_usage_ratio
        self.running = running
        self.waiting = waiting
        self.model = model
        self._server = serve_metrics(self.render, "engine-endpoint")
        self.url = f"http://127.0.0.1:{self._server.server_port}/metrics"

    def render(self) -> str:
        labels = f'engine="0",model_name="{self.model}"'
        return (
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{{{labels}}} {self.kv_cache_usage_ratio}\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{labels}}} {self.running}.0\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{{{labels}}} {self.waiting}.0\n"
            "# TYPE vllm:num_preemptions_total counter\n"
            f"vllm:num_preemptions_total{{{labels}}} 0.0\n"
        )

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
