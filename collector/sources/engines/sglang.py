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
    combined,
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
        reading.kv_cache_usage_ratio = combined(usage, max, "sglang:token_usage")
        reading.requests_running = combined(running, sum, "sglang:num_running_reqs")
        reading.requests_waiting = combined(waiting, sum, "sglang:num_queue_reqs")
        # Retractions are SGLang's nearest to a preemption.
        retracted = _rank0(samples(families, "sglang:num_retracted_reqs"))
        reading.preemptions_total = combined(retracted, sum, "sglang:num_retracted_reqs")
        hit = _rank0(samples(families, "sglang:cache_hit_rate"))
        reading.prefix_cache_hit_ratio = combined(hit, max, "sglang:cache_hit_rate")
        return reading
