"""Text Generation Inference, the router's /metrics. TGI has no KV-cache metric: the proxy is
the current batch's token budget in use, tgi_batch_current_max_tokens /
tgi_batch_max_total_tokens. No model label is exported."""

from __future__ import annotations

from prometheus_client.metrics_core import Metric

from gpufleet.collector.sources.engines.base import (
    EngineParser,
    EngineReading,
    ParseError,
    combined,
    finite,
    samples,
)


class TgiParser(EngineParser):
    name = "tgi"
    prefixes = ("tgi_",)

    def parse(self, families: list[Metric]) -> EngineReading:
        size = samples(families, "tgi_batch_current_size")
        queue = samples(families, "tgi_queue_size")
        if not (size or queue):
            raise ParseError("no tgi_batch_current_size or tgi_queue_size series")
        reading = EngineReading(self.name)
        reading.requests_running = combined(size, sum, "tgi_batch_current_size")
        reading.requests_waiting = combined(queue, sum, "tgi_queue_size")
        used = samples(families, "tgi_batch_current_max_tokens")
        total = samples(families, "tgi_batch_max_total_tokens")
        if used and total:
            (u,), (t,) = finite([used[0].value], "tokens in use"), finite([total[0].value], "token budget")
            if t > 0:
                reading.kv_cache_usage_ratio = min(1.0, u / t)
        return reading
