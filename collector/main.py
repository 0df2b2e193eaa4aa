"""Start the collector: open NVML (real or stand-in), then sample and stream until stopped."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import time
from pathlib import Path

from gpufleet.collector import probes
from gpufleet.collector.agent import CollectorAgent
from gpufleet.collector.config import CollectorConfig
from gpufleet.collector.metrics_endpoint import registry_of, serve
from gpufleet.collector.simnvml import SimulatedNode, SimulatedNvmlLibrary, install
from gpufleet.collector.simnvml.clibrary import install_c
from gpufleet.collector.simnvml.engine_server import SimulatedEngine
from gpufleet.collector.simnvml.gpu_users import DemoJobs, ProcGpuUsers
from gpufleet.collector.simnvml.machine import Hang
from gpufleet.collector.simnvml.scenario import ScenarioRunner, load
from gpufleet.collector.simnvml.scheduler import ScheduledState, ServedLoad
from gpufleet.collector.sources.deadline import returns_within
from gpufleet.collector.sources.nvml import NvmlSource
from gpufleet.collector.sources.nvml_start import NvmlNotAnswering, open_nvml
from gpufleet.collector.sources.registry import EVENT_SOURCES, SourceContext
from gpufleet.collector.sources.xid_kmsg import KernelLogXidWatcher
from gpufleet.protos import telemetry_pb2

log = logging.getLogger("gpufleet.collector")


class MetricsUnavailable(RuntimeError):
    """The /metrics endpoint cannot be served where configured."""


def open_source(
    config: CollectorConfig,
) -> tuple[NvmlSource | NvmlNotAnswering, ScenarioRunner | None, SimulatedNode | None]:
    """NVML through pynvml; with `simulate`, the stand-in library is put beneath pynvml
    first (and its fault scenario, if any, is prepared; the simulated node is returned for
    the simulated engine). NVML's start is under the call deadline (sources/nvml_start.py).
    Raises NvmlUnavailable (with what to do) when there is no driver, ScenarioError for an
    unusable scenario."""
    runner = node = None
    if config.simulate:
        scheduled = ScheduledState(config.sim_scheduler_file) if config.sim_scheduler_file else None
        node = SimulatedNode(
            config.node,
            config.sim_gpus,
            config.sim_model,
            scheduled=scheduled,
            gpu_users=(
                ProcGpuUsers(config.node, config.sim_gpus, config.sim_gpu_users_tag)
                if config.sim_gpu_users_tag
                else None
            ),
            demo_jobs=(
                DemoJobs(config.node, config.sim_gpus, Path(config.sim_jobs_dir))
                if config.sim_jobs_dir
                else None
            ),
            served=ServedLoad(config.sim_scheduler_file) if config.sim_scheduler_file else None,
        )
        if config.sim_scenario:
            runner = ScenarioRunner(node, load(config.sim_scenario))
        if config.sim_nvml_init_hang_s > 0:  # a driver that does not answer nvmlInit (tests)
            node.hangs["nvmlInitWithFlags"] = Hang(until_s=time.monotonic() + config.sim_nvml_init_hang_s)
        # sim_nvml_real_load: no stand-in, pynvml loads libnvidia-ml.so.1 by its own path and lock
        # (tests/collector/test_driver_hangs.py: a library whose load never returns).
        if config.sim_nvml_library and not config.sim_nvml_real_load:
            install_c(Path(config.sim_nvml_library), SimulatedNvmlLibrary(node))
        elif not config.sim_nvml_real_load:
            install(SimulatedNvmlLibrary(node))
    return open_nvml(config.nvml_deadline_s), runner, node


def serve_metrics(config: CollectorConfig, agent: CollectorAgent) -> None:
    """The collector's /metrics (collector/metrics_endpoint.py), where configured."""
    if not config.metrics_listen:
        return
    try:
        registry = registry_of(
            config.metrics_names,
            lambda: agent.last_sample,
            xid_counts=lambda: agent.book.xid_counts,
            xid_last=lambda: agent.book.xid_last,
            driver_version=lambda: agent.source.driver_version,
        )
        port = serve(
            config.metrics_listen,
            registry,
            {"/healthz": lambda: probes.healthz(agent), "/ready": lambda: probes.ready(agent)},
        )
    except OSError as exc:
        raise MetricsUnavailable(
            f"cannot serve /metrics on {config.metrics_listen}: {exc}. Set --metrics-listen "
            "(GPUFLEET_COLLECTOR_METRICS_LISTEN) to a free address, or to an empty value to disable it."
        ) from exc
    log.info(
        "serving Prometheus metrics on %s:%d/metrics (probes /healthz, /ready)",
        config.metrics_listen.rpartition(":")[0],
        port,
    )


def _close_nvml(agent: CollectorAgent, source: NvmlSource | NvmlNotAnswering) -> None:
    if agent.sampler.unresponsive:
        # nvmlShutdown would wait on the stuck call: left to the process exit.
        log.warning("NVML not shut down: a call is still stuck in the driver")
    else:
        returns_within(source.close, 2.0, "nvmlShutdown")  # a driver can stick at the last call too


async def run_collector(config: CollectorConfig) -> None:
    source, scenario, node = open_source(config)
    sim_engine = None
    if node is not None and config.sim_engine:
        # The simulated engine is a real HTTP endpoint, scraped like any other.
        sim_engine = SimulatedEngine(node, config.sim_engine)
        url = sim_engine.serve()
        gpus = ",".join(str(g.index) for g in node.gpus)
        config = dataclasses.replace(config, engines=f"{url} gpus={gpus}; {config.engines}".strip("; "))
    agent = CollectorAgent(config, source, simulated=config.simulate)
    if node is not None:
        sim_node = node
        agent.simulated_reset = lambda index: sim_node.gpus[index].reset()
        agent.pci_gpu_count = sim_node.pci_gpu_count  # the simulated bus, not this host's
    serve_metrics(config, agent)
    loop = asyncio.get_running_loop()

    def push(event: telemetry_pb2.Event) -> None:  # called from the watcher threads
        # Folded here, in the source's thread: a storm of 10,000 lines a second costs the
        # event loop nothing (collector/xid_fold.py).
        if agent.xid_fold.offer(event):
            agent.book.kmsg_inflight.add(event.kmsg_seq)
            loop.call_soon_threadsafe(agent.push_events, [event])

    started = {}
    for name, kind in EVENT_SOURCES.items():
        running = kind.start(SourceContext(config, source, push))
        if running is not None:
            started[name] = running
    kmsg = started.get("kmsg")
    agent.keeping.kmsg = (
        kmsg if isinstance(kmsg, KernelLogXidWatcher) else None
    )  # its counters go in each report
    if scenario:
        scenario.start()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await agent.run(stop)
    finally:
        if scenario:
            scenario.stop()
        for running in started.values():
            running.stop()
        if sim_engine:
            sim_engine.stop()
        _close_nvml(agent, source)
        log.info(
            "collector stopped after seq %d with %d unacknowledged report(s)",
            agent.book.seq,
            len(agent.book.buffer),
            extra={
                "last_seq": agent.book.seq,
                "unacked": len(agent.book.buffer),
                "dropped_total": agent.book.buffer.dropped_total,
            },
        )
