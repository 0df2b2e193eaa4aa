"""The collector process: sample on a schedule, stream reports, replay what is unacked.

Two tasks share one ReplayBuffer: the sampler appends a report every interval; the
streamer keeps one gRPC stream to the aggregator open, sends every held report it has not
sent on this stream yet (so a reconnect replays everything unacknowledged, in order), and
forgets reports as acknowledgements or rejections come back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

from gpufleet.collector.commands import CommandGuard, run_command
from gpufleet.collector.config import CollectorConfig
from gpufleet.collector.keeping import Keeping
from gpufleet.collector.report_book import ReportBook
from gpufleet.collector.simnvml.gpu_users import made_up_proc_dir
from gpufleet.collector.sources.deadline import DeadlineSampler
from gpufleet.collector.sources.engines.discovery import EngineDiscovery
from gpufleet.collector.sources.engines.scrape import EngineScraper, parse_endpoints
from gpufleet.collector.sources.nvml import NvmlSource
from gpufleet.collector.sources.nvml_start import NvmlNotAnswering
from gpufleet.collector.sources.pci_bus import count_nvidia_gpus
from gpufleet.collector.sources.pod_resources import PodResourcesReader
from gpufleet.collector.sources.workloads import WorkloadReader
from gpufleet.collector.streaming import PROTOCOL_VERSION, AggregatorStream
from gpufleet.collector.xid_fold import XidFolder
from gpufleet.common.version import __version__
from gpufleet.protos import ingest_pb2, telemetry_pb2, vocabulary_pb2
from gpufleet.protos.limits import MAX_WORKLOADS_PER_REPORT
from gpufleet.protos.names import event_source_name

log = logging.getLogger("gpufleet.collector")


class CollectorAgent:
    """Samples on a schedule into the report book; its stream (streaming.py) sends the book's
    reports and its keeping (keeping.py) carries them and the kernel-log cursor over a restart."""

    def __init__(
        self, config: CollectorConfig, source: NvmlSource | NvmlNotAnswering, simulated: bool
    ) -> None:
        self.config = config
        self.source = source
        self.simulated = simulated
        # Each GPU on a thread of its own, every NVML call under the deadline (collector/sources/deadline.py).
        self.sampler = DeadlineSampler(source, config.nvml_deadline_s)
        # NVIDIA GPUs on the PCI bus (None: not counted); run_collector swaps in the simulated bus.
        self.pci_gpu_count: Callable[[], int | None] = (
            (lambda: count_nvidia_gpus(config.pci_sysfs_dir)) if config.pci_sysfs_dir else (lambda: None)
        )
        self.last_tick_s = time.monotonic()  # when the sampling loop last finished a tick (/healthz)
        # Set by run_collector with --simulate: resets a simulated GPU when no reset_command is set.
        self.simulated_reset: Callable[[int], str] | None = None
        self.book = ReportBook(config)
        self.xid_fold = XidFolder(config.xid_storm_window_s)
        self.keeping = Keeping(config, self.book, self.xid_fold)
        self._sampling_stopped = asyncio.Event()
        self.stream = AggregatorStream(
            config, self.book, self.keeping, self._hello, self._answer_command, self._sampling_stopped
        )
        self._lost: set[int] = set()
        self._sample_duration_s = 0.0
        self.command_guard = CommandGuard(config.reset_min_interval_s)
        self.last_sample: telemetry_pb2.NodeReport | None = None  # what /metrics shows
        endpoints = parse_endpoints(config.engines)
        # Simulated GPUs report made-up PIDs: discovery only looks at a real node's processes.
        self.discovery = (
            EngineDiscovery(config.engine_timeout_s) if config.engine_discovery and not simulated else None
        )
        self.engines = (
            EngineScraper(endpoints, config.engine_timeout_s) if endpoints or self.discovery else None
        )
        # Whose work each GPU's processes are (sources/workloads.py); a simulated node's made-up
        # processes are read from its own folder first (run_collector sets proc_roots).
        roots = [Path("/proc")]
        if simulated and config.sim_jobs_dir:
            roots.insert(0, made_up_proc_dir(Path(config.sim_jobs_dir), config.node))
        self.workloads = WorkloadReader(roots) if config.workloads else None
        self.pod_resources = (
            PodResourcesReader(
                config.kubelet_pod_resources_socket,
                tuple(r.strip() for r in config.kubelet_gpu_resources.split(",") if r.strip()),
            )
            if config.workloads and config.kubelet_pod_resources_socket
            else None
        )

    def _hello(self) -> ingest_pb2.Hello:
        """What this collector says of itself when a stream opens."""
        return ingest_pb2.Hello(
            protocol_version=PROTOCOL_VERSION,
            node=self.config.node,
            cluster=self.config.cluster,
            boot_id=self.book.boot_id,
            collector_version=__version__,
            interval_s=self.config.interval_s,
            gpus=self.source.inventory(),
            driver_version=self.source.driver_version,
            simulated=self.simulated,
            columnar_gpus=self.config.columnar_gpus,
        )

    async def _answer_command(self, command: ingest_pb2.Command) -> ingest_pb2.CommandResult:
        """A GPU reset the aggregator asked for: refused by the guard, or run."""
        result = self.command_guard.refuse(command)
        if result is not None:
            return result
        c = self.config
        return await run_command(
            command,
            self.source.inventory(),
            c.reset_command,
            c.reset_timeout_s,
            self.simulated_reset,
            c.reset_socket,
        )

    async def sample_once(self) -> telemetry_pb2.NodeReport:
        started_ns = time.time_ns()
        t0 = time.perf_counter()
        # A tick never waits past the call deadline, nor past most of the interval: a GPU whose
        # call is stuck is reported as such and the others stay on time.
        sampling = asyncio.to_thread(
            self.sampler.sample, min(self.config.nvml_deadline_s, self.config.interval_s * 0.8)
        )
        if self.engines is not None:
            # Engines are scraped while the GPUs are sampled; each scrape has its own timeout.
            found = (
                self.discovery.endpoints(list(self.last_sample.gpus))
                if (self.discovery and self.last_sample)
                else []
            )
            gpus, engines = await asyncio.gather(sampling, asyncio.to_thread(self.engines.scrape_all, found))
        else:
            gpus, engines = await sampling, []
        if engines:
            self._only_declared_gpus(engines)
        workloads = await self._workloads(gpus)
        self._sample_duration_s = time.perf_counter() - t0
        report = self._new_report(
            started_ns,
            gpus=gpus,
            engines=engines,
            workloads=workloads,
            events=self._lost_events(gpus, started_ns) + self._folded_xids(),
            **self._bus_count(),
        )
        self.last_sample = report
        self.last_tick_s = time.monotonic()
        return report

    async def _workloads(self, gpus: list[telemetry_pb2.GpuSample]) -> list[telemetry_pb2.WorkloadSample]:
        """Whose work each GPU runs (sources/workloads.py) and, on Kubernetes, which pod each GPU
        is allocated to (sources/pod_resources.py); the processes of no workload last."""
        found = await asyncio.to_thread(self.workloads.read, gpus) if self.workloads is not None else []
        if self.pod_resources is None:
            return found
        pods = await asyncio.to_thread(self.pod_resources.read, self.source.inventory())
        named = [w for w in found if w.scheduler != "none"]
        rest = [w for w in found if w.scheduler == "none"]
        return (named + pods)[: MAX_WORKLOADS_PER_REPORT - len(rest)] + rest

    def _only_declared_gpus(self, engines: list[telemetry_pb2.EngineSample]) -> None:
        """An engine names only GPUs this collector's hello declares: with NVML not started (its
        start stuck: collector/sources/nvml_start.py) it declares none, and an engine configured
        with `gpus=0,1` still reports its readings, without GPUs it cannot see."""
        declared = {g.index for g in self.source.inventory()}
        for engine in engines:
            if any(i not in declared for i in engine.gpu_indices):
                kept = [i for i in engine.gpu_indices if i in declared]
                del engine.gpu_indices[:]
                engine.gpu_indices.extend(kept)

    def _bus_count(self) -> dict[str, int]:
        count = self.pci_gpu_count()
        return {} if count is None else {"gpus_on_pci_bus": count}

    def _new_report(self, time_ns: int, **parts: object) -> telemetry_pb2.NodeReport:
        return self.book.new(time_ns, self._stats(), **parts)

    def _folded_xids(self) -> list[telemetry_pb2.Event]:
        folded = self.xid_fold.flush()
        for event in folded:
            log.warning(
                "XID %d on GPU %s repeated %d more time(s) in %.1f s (folded into one event)",
                event.xid,
                event.gpu_index if event.HasField("gpu_index") else event.pci_bus_id,
                event.count,
                (event.time_unix_ns - event.first_time_unix_ns) / 1e9,
                extra={"xid": event.xid, "count": event.count},
            )
        return folded

    def push_events(self, events: list[telemetry_pb2.Event]) -> telemetry_pb2.NodeReport | None:
        """Send events now, in a report of their own, rather than at the next sampling tick
        (the sources' threads folded them first: collector/xid_fold.py)."""
        if not events:
            return None
        for event in events:
            if event.kind == vocabulary_pb2.EVENT_KIND_XID:
                where = event.gpu_index if event.HasField("gpu_index") else f"bus {event.pci_bus_id}"
                log.warning(
                    "XID %d on GPU %s (%s): %.200s",
                    event.xid,
                    where,
                    event_source_name(event.source),
                    event.message,
                    extra={"xid": event.xid, "gpu": where},
                )
        report = self._new_report(time.time_ns(), events=events)
        for event in events:
            self.book.kmsg_inflight.discard(event.kmsg_seq)
        return report

    def _stats(self) -> telemetry_pb2.CollectorStats:
        buffer, kmsg = self.book.buffer, self.keeping.kmsg
        return telemetry_pb2.CollectorStats(
            reports_dropped_total=buffer.dropped_total,
            reports_rejected_total=buffer.rejected_total,
            unacked_reports=len(buffer),
            reconnects_total=self.stream.reconnects_total,
            sample_errors_total=self.source.errors_total + self.sampler.failed_total,
            nvml_calls_hung_total=self.sampler.hung_total,
            sample_duration_s=self._sample_duration_s,
            kmsg_lines_unparsed_total=kmsg.lines_unparsed_total if kmsg else 0,
            xid_unknown_gpu_total=kmsg.xids_unknown_gpu_total if kmsg else 0,
            xid_duplicates_total=self.xid_fold.duplicates_total,
            xid_folded_total=self.xid_fold.folded_total,
            kmsg_records_caught_up_total=kmsg.caught_up_total if kmsg else 0,
            engine_scrapes_failed_total=self.engines.failed_total if self.engines else 0,
        )

    def _lost_events(self, gpus: list[telemetry_pb2.GpuSample], time_ns: int) -> list[telemetry_pb2.Event]:
        """A GPU_LOST event when a GPU stops answering, GPU_RECOVERED when it answers again."""
        events = []
        for gpu in gpus:
            was_lost = gpu.index in self._lost
            if gpu.lost == was_lost:
                continue
            kind = vocabulary_pb2.EVENT_KIND_GPU_LOST if gpu.lost else vocabulary_pb2.EVENT_KIND_GPU_RECOVERED
            (self._lost.add if gpu.lost else self._lost.discard)(gpu.index)
            events.append(
                telemetry_pb2.Event(
                    kind=kind,
                    source=vocabulary_pb2.EVENT_SOURCE_COLLECTOR,
                    time_unix_ns=time_ns,
                    gpu_index=gpu.index,
                    pci_bus_id=gpu.pci_bus_id,
                    message="NVML answers GPU_IS_LOST" if gpu.lost else "GPU answers NVML again",
                )
            )
        return events

    async def _sample_loop(self, stop: asyncio.Event) -> None:
        interval = self.config.interval_s
        next_tick = time.monotonic()
        try:
            await self._sample_until(stop, interval, next_tick)
        finally:
            self._sampling_stopped.set()

    async def _sample_until(self, stop: asyncio.Event, interval: float, next_tick: float) -> None:
        while not stop.is_set():
            await self.sample_once()
            next_tick += interval
            late_s = time.monotonic() - next_tick
            if late_s > 0:
                skipped = int(late_s // interval) + 1
                log.warning(
                    "sampling took longer than the interval: skipping %d tick(s)",
                    skipped,
                    extra={"interval_s": interval, "sample_duration_s": self._sample_duration_s},
                )
                next_tick += skipped * interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(0.0, next_tick - time.monotonic()))

    async def run(self, stop: asyncio.Event) -> None:
        log.info(
            "collector started: node %s, %d GPU(s)%s, interval %.3g s, aggregator %s",
            self.config.node,
            len(self.source.gpus),
            " (simulated)" if self.simulated else "",
            self.config.interval_s,
            ", ".join(self.config.aggregator_addresses),
            extra={"boot_id": self.book.boot_id},
        )
        self.keeping.carry_in()
        sampler = asyncio.create_task(self._sample_loop(stop))
        try:
            await self.stream.run(stop)
        finally:
            stop.set()
            await sampler
            # Folded XIDs still waiting for a tick go in a last report (kept with the rest).
            folded = self._folded_xids()
            if folded:
                self._new_report(time.time_ns(), events=folded)
            if not self.keeping.carry_out():
                self.keeping.advance_kmsg_cursor()
