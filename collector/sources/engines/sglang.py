"""SGLang (--enable-metrics), /metrics on the server port. One series per tensor-parallel rank
(labels tp_rank, pp_rank, dp_rank): KV usage is the fullest rank; requests are counted once
per data-parallel replica (tp_rank 0, pp_rank 0) and summed over dp_rank."""

from __future__ import annotations

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from gpufleet.collector.sources.engines.base import (
    EngineParser,
    EngineReading,
    ParseError,
    finite,
    first_label,
    samples,
)


def _rank0(found: list[Sample]) -> list[Sample]:
    return [s for s in found if s.labels.get("tp_rank", "0") == "0" and s.labels.get("pp_rank", "0") == "0"]


class SglangParser(EngineParser):
    name = "sglang"
    prefixes = ("sglang:",)

    def parse(self, families: list[Metric]) -> EngineReading:
        usage = samples(families, "sglang:token_usage")
        running = _rank0(samples(families, "sglang:num_running_reqs"))
        waiting = _rank0(samples(families, "sglang:num_queue_reqs"))
        if not (usage or running or waiting):
            raise ParseError("no sglang:token_usage or sglang:num_*_reqs series")
        reading = EngineReading(self.name, first_label(usage + running + waiting, "model_name"))
        if usage:
            reading.kv_cache_usage_ratio = max(finite((s.value for s in usage), "sglang:token_usage"))
        if running:
            reading.requests_running = sum(finite((s.value for s in running), "sglang:num_running_reqs"))
        if waiting:
            reading.requests_waiting = sum(finite((s.value for s in waiting), "sglang:num_queue_reqs"))
        retracted = _rank0(samples(families, "sglang:num_retracted_reqs"))
        if retracted:
            # Retractions are SGLang's nearest to a preemption.
            reading.preemptions_total = sum(finite((s.value for s in retracted), "sglang:num_retracted_reqs"))
        hit = _rank0(samples(families, "sglang:cache_hit_rate"))
        if hit:
            reading.prefix_cache_hit_ratio = max(finite((s.value for s in hit), "sglang:cache_hit_rate"))
        return reading
