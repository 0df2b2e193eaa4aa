"""TensorRT-LLM through Triton's backend (metrics port 8002):
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used|max|fraction|..."} and
nv_trt_llm_request_metrics{request_type="active|scheduled|waiting|..."}."""

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


class TrtllmParser(EngineParser):
    name = "trtllm"
    prefixes = ("nv_trt_llm_",)

    def parse(self, families: list[Metric]) -> EngineReading:
        blocks = {
            s.labels.get("kv_cache_block_type"): s
            for s in samples(families, "nv_trt_llm_kv_cache_block_metrics")
        }
        requests = {s.labels.get("request_type"): s for s in samples(families, "nv_trt_llm_request_metrics")}
        if not (blocks or requests):
            raise ParseError("no nv_trt_llm_kv_cache_block_metrics or nv_trt_llm_request_metrics series")
        reading = EngineReading(
            self.name, first_label(list(blocks.values()) + list(requests.values()), "model")
        )
        if "fraction" in blocks:
            (reading.kv_cache_usage_ratio,) = finite([blocks["fraction"].value], "KV block fraction")
        elif "used" in blocks and "max" in blocks:
            used, cap = finite([blocks["used"].value, blocks["max"].value], "KV blocks")
            reading.kv_cache_usage_ratio = used / cap if cap > 0 else None
        if "active" in requests:
            (reading.requests_running,) = finite([requests["active"].value], "active requests")
        if "waiting" in requests:
            (reading.requests_waiting,) = finite([requests["waiting"].value], "waiting requests")
        return reading
