"""vLLM (V1 engine), /metrics on the API port. Labels: model_name, engine (data-parallel index).

KV usage: vllm:kv_cache_usage_perc (a 0-1 fraction despite the name), or the older
vllm:gpu_cache_usage_perc (vLLM up to 0.10). With several data-parallel engines the fullest
one counts for KV, and requests and preemptions are summed."""

from __future__ import annotations

from prometheus_client.metrics_core import Metric

from gpufleet.collector.sources.engines.base import (
    EngineParser,
    EngineReading,
    ParseError,
    finite,
    first_label,
    samples,
)


class VllmParser(EngineParser):
    name = "vllm"
    prefixes = ("vllm:",)

    def parse(self, families: dict[str, Metric]) -> EngineReading:
        kv = samples(families, "vllm:kv_cache_usage_perc") or samples(families, "vllm:gpu_cache_usage_perc")
        running = samples(families, "vllm:num_requests_running")
        waiting = samples(families, "vllm:num_requests_waiting")
        if not (kv or running or waiting):
            raise ParseError("no vllm:kv_cache_usage_perc, gpu_cache_usage_perc or num_requests_* series")
        reading = EngineReading(self.name, first_label(kv + running + waiting, "model_name"))
        if kv:
            reading.kv_cache_usage_ratio = max(finite((s.value for s in kv), "vllm KV cache usage"))
            if not samples(families, "vllm:kv_cache_usage_perc"):
                reading.notes.append("older vLLM: read vllm:gpu_cache_usage_perc")
        if running:
            reading.requests_running = sum(finite((s.value for s in running), "vllm:num_requests_running"))
        if waiting:
            reading.requests_waiting = sum(finite((s.value for s in waiting), "vllm:num_requests_waiting"))
        preempt = samples(families, "vllm:num_preemptions_total")
        if preempt:
            reading.preemptions_total = sum(finite((s.value for s in preempt), "vllm:num_preemptions_total"))
        hits = samples(families, "vllm:prefix_cache_hits_total") or samples(
            families, "vllm:gpu_prefix_cache_hits_total"
        )
        queries = samples(families, "vllm:prefix_cache_queries_total") or samples(
            families, "vllm:gpu_prefix_cache_queries_total"
        )
        if hits and queries:
            reading.prefix_counters = (
                sum(finite((s.value for s in hits), "prefix hits")),
                sum(finite((s.value for s in queries), "prefix queries")),
            )
        return reading
