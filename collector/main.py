"""Start the collector: open NVML (real or stand-in), then sample and stream until stopped."""

from __future__ import annotations

import asyncio
import logging
import signal

from gpufleet.collector.agent import CollectorAgent
from gpufleet.collector.config import CollectorConfig
from gpufleet.collector.simnvml import SimulatedNode, SimulatedNvmlLibrary, install
from gpufleet.collector.sources.nvml import NvmlSource

log = logging.getLogger("gpufleet.collector")


def open_source(config: CollectorConfig) -> NvmlSource:
    """NVML through pynvml; with `simulate`, the stand-in library is put beneath pynvml
    first. Raises NvmlUnavailable (with what to do) when there is no driver."""
    if config.simulate:
        install(SimulatedNvmlLibrary(SimulatedNode(config.node, config.sim_gpus, config.sim_model)))
    return NvmlSource()


async def run_collector(config: CollectorConfig) -> None:
    source = open_source(config)
    agent = CollectorAgent(config, source, simulated=config.simulate)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await agent.run(stop)
    finally:
        source.close()
        log.info(
            "collector stopped after seq %d with %d unacknowledged report(s)",
            agent.seq,
            len(agent.buffer),
            extra={
                "last_seq": agent.seq,
                "unacked": len(agent.buffer),
                "dropped_total": agent.buffer.dropped_total,
            },
        )
