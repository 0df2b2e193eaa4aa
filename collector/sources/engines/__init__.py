"""Inference-engine metrics: one parser per engine, registered by name (common/registry.py), chosen
by the metric names a scrape holds."""

from __future__ import annotations

from gpufleet.collector.sources.engines.base import EngineParser, EngineReading, ParseError
from gpufleet.collector.sources.engines.sglang import SglangParser
from gpufleet.collector.sources.engines.tgi import TgiParser
from gpufleet.collector.sources.engines.trtllm import TrtllmParser
from gpufleet.collector.sources.engines.vllm import VllmParser
from gpufleet.common.registry import Registry

REGISTRY: Registry[EngineParser] = Registry(
    "engine", (VllmParser(), SglangParser(), TgiParser(), TrtllmParser())
)

__all__ = ["REGISTRY", "EngineParser", "EngineReading", "ParseError"]
