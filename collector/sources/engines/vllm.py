"""vLLM (V1 engine), /metrics on the API port. Labels: model_name, engine (data-parallel index).

KV usage: vllm:kv_cache_usage_perc (a 0-1 fraction despite the name), or the older
vllm:gpu_cache_usage_perc (vLLM up to 0.10). With several data-parallel engines the fullest
one counts for KV, and requests and preemptions are summed."""

from __future__ import annotations

from prometheus_client.metrics_core import Metric

from gpufleet.collector.sources.engines.base import (
    COUNTER,
    EngineParser,
    EngineReading,
    ParseError,
    combined,
    first_label,
    samples,
)


def _sum(
    families: list[Metric], name: str, old_name: str = "", types: tuple[str, ...] = COUNTER
) -> float | None:
    found = samples(families, name, types=types) or (
        samples(families, old_name, types=types) if old_name else []
    )
    return combined(found, sum, name)


class VllmParser(EngineParser):
    name = "vllm"
    prefixes = ("vllm:",)

    def parse(self, families: list[Metric]) -> EngineReading:
        kv = samples(families, "vllm:kv_cache_usage_perc") or samples(families, "vllm:gpu_cache_usage_perc")
        running = samples(families, "vllm:num_requests_running")
        waiting = samples(families, "vllm:num_requests_waiting")
        if not (kv or running or waiting):
            raise ParseError("no vllm:kv_cache_usage_perc, gpu_cache_usage_perc or num_requests_* series")
        reading = EngineReading(self.name, first_label(kv + running + waiting, "model_name"))
        reading.kv_cache_usage_ratio = combined(kv, max, "vllm KV cache usage")
        reading.requests_running = combined(running, sum, "vllm:num_requests_running")
        reading.requests_waiting = combined(waiting, sum, "vllm:num_requests_waiting")
        reading.preemptions_total = _sum(families, "vllm:num_preemptions_total")
        hits = _sum(families, "vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
        queries = _sum(families, "vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
        if hits is not None and queries is not None:
            reading.prefix_counters = (hits, queries)
        return reading
