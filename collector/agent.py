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
import random
import time
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path

import grpc

from gpufleet.collector import carryover
from gpufleet.collector.commands import CommandGuard, run_command
from gpufleet.collector.config import CollectorConfig
from gpufleet.collector.replay_buffer import ReplayBuffer
from gpufleet.collector.sources.engines.discovery import EngineDiscovery
from gpufleet.collector.sources.engines.scrape import EngineScraper, parse_endpoints
from gpufleet.collector.sources.nvml import NvmlSource
from gpufleet.collector.sources.xid_kmsg import KernelLogXidWatcher
from gpufleet.collector.xid_fold import XidFolder
from gpufleet.common.version import __version__
from gpufleet.protos import ingest_pb2, ingest_pb2_grpc, telemetry_pb2, vocabulary_pb2
from gpufleet.protos.names import event_source_name

log = logging.getLogger("gpufleet.collector")

PROTOCOL_VERSION = 1
NODE_METADATA = "x-gpufleet-node"  # aggregator/auth/tokens.py reads it
# Statuses that will not cure themselves by retrying soon: wait the longest backoff.
_CONFIG_ERRORS = {
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.INVALID_ARGUMENT,
}
CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    ("grpc.max_send_message_length", 16 * 1024 * 1024),
]


def status_name(code: int) -> str:
    """INVALID_ARGUMENT for 3: the name of a gRPC status code number."""
    return next((c.name for c in grpc.StatusCode if c.value[0] == code), str(code))


def open_channel(
    address: str, tls_ca: str = "", client_cert: str = "", client_key: str = ""
) -> grpc.aio.Channel:
    """A channel to the aggregator: TLS when tls_ca is set (with this node's client certificate
    for mTLS when one is given); plaintext otherwise (CollectorConfig allows that only to
    loopback unless allow_plaintext)."""
    if tls_ca:
        creds = grpc.ssl_channel_credentials(
            Path(tls_ca).read_bytes(),
            private_key=Path(client_key).read_bytes() if client_key else None,
            certificate_chain=Path(client_cert).read_bytes() if client_cert else None,
        )
        return grpc.aio.secure_channel(address, creds, options=CHANNEL_OPTIONS)
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)


class CollectorAgent:
    def __init__(self, config: CollectorConfig, source: NvmlSource, simulated: bool) -> None:
        self.config = config
        self.source = source
        self.simulated = simulated
        # Set by run_collector with --simulate: resets a simulated GPU when no reset_command is set.
        self.simulated_reset: Callable[[int], str] | None = None
        self.boot_id = uuid.uuid4().hex
        # Replicas: start at the address this node's name picks (the fleet spreads over them)
        # and move to the next one whenever a stream breaks; the replay buffer covers the gap.
        self._addresses = config.aggregator_addresses
        self._address_index = zlib.crc32(config.node.encode()) % len(self._addresses)
        self.token = config.resolve_token()
        self.buffer = ReplayBuffer(config.buffer_reports)
        self.seq = 0
        self.reconnects_total = 0
        self.connected = asyncio.Event()
        self._lost: set[int] = set()
        self._sample_duration_s = 0.0
        self._welcomed = False
        self._command_tasks: set[asyncio.Task[None]] = set()
        self.command_guard = CommandGuard(config.reset_min_interval_s)
        self._write_lock = asyncio.Lock()
        self._unsent_results: list[ingest_pb2.CommandResult] = []  # kept across a broken stream
        self._sampling_stopped = asyncio.Event()
        self.kmsg: KernelLogXidWatcher | None = None  # set when the kernel log is read
        self.xid_fold = XidFolder(config.xid_storm_window_s)
        # Kernel-log records handed on by the watcher and not yet in a report (added from its
        # thread), and the oldest record in each unacknowledged report: what the kernel-log
        # cursor may not pass (collector/kmsg_cursor.py).
        self.kmsg_inflight: set[int] = set()
        self._kmsg_unacked: dict[int, int] = {}
        self.last_sample: telemetry_pb2.NodeReport | None = None  # what /metrics shows
        # XIDs reported since start, by (GPU, number), for /metrics (collector/metrics_endpoint.py).
        self.xid_counts: dict[tuple[str, int], int] = {}
        endpoints = parse_endpoints(config.engines)
        # Simulated GPUs report made-up PIDs: discovery only looks at a real node's processes.
        self.discovery = (
            EngineDiscovery(config.engine_timeout_s) if config.engine_discovery and not simulated else None
        )
        self.engines = (
            EngineScraper(endpoints, config.engine_timeout_s) if endpoints or self.discovery else None
        )

    # --- sampling ------------------------------------------------------------------
    async def sample_once(self) -> telemetry_pb2.NodeReport:
        started_ns = time.time_ns()
        t0 = time.perf_counter()
        sampling = asyncio.to_thread(self.source.sample)
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
        self._sample_duration_s = time.perf_counter() - t0
        report = self._new_report(
            started_ns,
            gpus=gpus,
            engines=engines,
            events=self._lost_events(gpus, started_ns) + self._folded_xids(),
        )
        self.last_sample = report
        return report

    def _new_report(self, time_ns: int, **parts: object) -> telemetry_pb2.NodeReport:
        """The next report of this boot (seq + 1), with parts, held for sending until acked."""
        self.seq += 1
        report = telemetry_pb2.NodeReport(
            node=self.config.node,
            cluster=self.config.cluster,
            boot_id=self.boot_id,
            seq=self.seq,
            time_unix_ns=time_ns,
            interval_s=self.config.interval_s,
            stats=self._stats(),
            **parts,
        )
        xids = [e for e in report.events if e.kind == vocabulary_pb2.EVENT_KIND_XID]
        if xids:
            # A new dict, swapped in whole: /metrics reads it from its own thread.
            counts = dict(self.xid_counts)
            for e in xids:
                key = (str(e.gpu_index) if e.HasField("gpu_index") else "", e.xid)
                counts[key] = counts.get(key, 0) + max(1, e.count)
            self.xid_counts = counts
        kmsg_seqs = [e.kmsg_seq for e in report.events if e.kmsg_seq]
        if kmsg_seqs:
            self._kmsg_unacked[report.seq] = min(kmsg_seqs)
        self.buffer.add(report)
        return report

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

    def advance_kmsg_cursor(self, carried: bool = False) -> None:
        """Move the kernel-log cursor past every record whose XIDs are acknowledged (or, with
        carried, kept in the carry-over file)."""
        if self.kmsg is None or self.kmsg.cursor is None:
            return
        read = self.kmsg.read_seq  # read before the sets: a record counted here is in one of them
        if carried:
            self._kmsg_unacked.clear()
        else:
            for seq in [s for s in self._kmsg_unacked if not self.buffer.holds(s)]:
                del self._kmsg_unacked[seq]  # acknowledged, rejected or dropped (each counted)
        unsent = [s for s in list(self.kmsg_inflight) if s] + list(self._kmsg_unacked.values())
        oldest_folded = self.xid_fold.oldest_unsent_kmsg_seq()
        if oldest_folded is not None:
            unsent.append(oldest_folded)
        self.kmsg.cursor.advance(min(unsent) - 1 if unsent else read)

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
            self.kmsg_inflight.discard(event.kmsg_seq)
        return report

    def _stats(self) -> telemetry_pb2.CollectorStats:
        return telemetry_pb2.CollectorStats(
            reports_dropped_total=self.buffer.dropped_total,
            reports_rejected_total=self.buffer.rejected_total,
            unacked_reports=len(self.buffer),
            reconnects_total=self.reconnects_total,
            sample_errors_total=self.source.errors_total,
            sample_duration_s=self._sample_duration_s,
            kmsg_lines_unparsed_total=self.kmsg.lines_unparsed_total if self.kmsg else 0,
            xid_unknown_gpu_total=self.kmsg.xids_unknown_gpu_total if self.kmsg else 0,
            xid_duplicates_total=self.xid_fold.duplicates_total,
            xid_folded_total=self.xid_fold.folded_total,
            kmsg_records_caught_up_total=self.kmsg.caught_up_total if self.kmsg else 0,
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

    # --- streaming -----------------------------------------------------------------
    def _hello(self) -> ingest_pb2.CollectorMessage:
        return ingest_pb2.CollectorMessage(
            hello=ingest_pb2.Hello(
                protocol_version=PROTOCOL_VERSION,
                node=self.config.node,
                cluster=self.config.cluster,
                boot_id=self.boot_id,
                collector_version=__version__,
                interval_s=self.config.interval_s,
                gpus=self.source.inventory(),
                driver_version=self.source.driver_version,
                simulated=self.simulated,
            )
        )

    @property
    def aggregator(self) -> str:
        """The aggregator address this collector streams to (or tries next)."""
        return self._addresses[self._address_index]

    def _next_aggregator(self) -> None:
        self._address_index = (self._address_index + 1) % len(self._addresses)

    async def _stream_once(self, stop: asyncio.Event) -> None:
        """One connection: hello, replay, then live reports until something breaks."""
        c = self.config
        async with open_channel(self.aggregator, c.tls_ca, c.tls_client_cert, c.tls_client_key) as channel:
            stub = ingest_pb2_grpc.IngestStub(channel)
            # Read again at every connect: a projected Kubernetes token is rotated by the kubelet.
            self.token = c.resolve_token()
            metadata = [(NODE_METADATA, c.node)]  # which of its certificate's names (mTLS) this node is
            if self.token:
                metadata.append(("authorization", f"Bearer {self.token}"))
            call = stub.Stream(metadata=tuple(metadata))
            await call.write(self._hello())
            first = await call.read()
            if first is grpc.aio.EOF or first.WhichOneof("body") != "welcome":
                raise ConnectionError("aggregator did not answer the hello with a welcome")
            log.info(
                "connected to aggregator %s; %d unacknowledged report(s) to replay",
                self.aggregator,
                len(self.buffer),
                extra={"aggregator": self.aggregator, "boot_id": self.boot_id},
            )
            self.connected.set()
            self._welcomed = True
            sender = asyncio.create_task(self._send_loop(call))
            receiver = asyncio.create_task(self._receive_loop(call))
            stopper = asyncio.create_task(stop.wait())
            try:
                done, _ = await asyncio.wait({sender, receiver, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if stopper in done:
                    await self._drain_before_exit()
                    return
                for task in done:
                    task.result()  # re-raise the error that ended the stream
                raise ConnectionError("aggregator closed the stream")
            finally:
                self.connected.clear()
                for task in (sender, receiver, stopper):
                    task.cancel()
                await asyncio.gather(sender, receiver, stopper, return_exceptions=True)

    async def _write(self, call: grpc.aio.StreamStreamCall, message: ingest_pb2.CollectorMessage) -> None:
        # One write at a time on a stream: gRPC refuses a second while one is in flight
        # (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS, which ends the stream). Reports and command
        # results are written by different tasks.
        async with self._write_lock:
            await call.write(message)

    async def _send_loop(self, call: grpc.aio.StreamStreamCall) -> None:
        # Results a broken stream did not carry go first: the aggregator is still waiting.
        while self._unsent_results:
            await self._write(call, ingest_pb2.CollectorMessage(command_result=self._unsent_results[0]))
            self._unsent_results.pop(0)
        last_sent = 0
        while True:
            for report in self.buffer.after(last_sent):
                await self._write(call, ingest_pb2.CollectorMessage(report=report))
                last_sent = report.seq
            await self.buffer.wait_for_new()

    async def _receive_loop(self, call: grpc.aio.StreamStreamCall) -> None:
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                return
            body = msg.WhichOneof("body")
            if body == "ack":
                self.buffer.ack(list(msg.ack.seqs))
                self.advance_kmsg_cursor()
            elif body == "reject":
                if self.buffer.reject(msg.reject.seq):
                    self.advance_kmsg_cursor()
                    log.error(
                        "aggregator rejected report seq %d (%s): %s",
                        msg.reject.seq,
                        status_name(msg.reject.code),
                        msg.reject.message,
                        extra={"seq": msg.reject.seq, "code": msg.reject.code},
                    )
            elif body == "command":
                task = asyncio.create_task(self._answer_command(call, msg.command))
                self._command_tasks.add(task)
                task.add_done_callback(self._command_tasks.discard)

    async def _answer_command(self, call: grpc.aio.StreamStreamCall, command: ingest_pb2.Command) -> None:
        result = self.command_guard.refuse(command)
        if result is None:
            result = await run_command(
                command,
                self.source.inventory(),
                self.config.reset_command,
                self.config.reset_timeout_s,
                self.simulated_reset,
                self.config.reset_socket,
            )
        try:
            await self._write(call, ingest_pb2.CollectorMessage(command_result=result))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
            self._unsent_results.append(result)
            log.error(
                "could not report the result of command %s (%s); it is sent again on the next stream",
                command.id,
                exc,
            )

    async def _drain_before_exit(self) -> None:
        async def drained() -> None:
            # A sample may be in progress when the stop comes: let it land in the buffer
            # first, or it would be left behind unacknowledged.
            await self._sampling_stopped.wait()
            await self.buffer.wait_empty()

        try:
            await asyncio.wait_for(drained(), self.config.shutdown_grace_s)
        except TimeoutError:
            log.warning(
                "exiting with %d unacknowledged report(s) after waiting %.1f s",
                len(self.buffer),
                self.config.shutdown_grace_s,
            )

    async def _stream_loop(self, stop: asyncio.Event) -> None:
        backoff_s = 0.5
        while not stop.is_set():
            self._welcomed = False
            try:
                await self._stream_once(stop)
                return
            except grpc.aio.AioRpcError as exc:
                wait_s = self.config.backoff_max_s if exc.code() in _CONFIG_ERRORS else backoff_s
                level = logging.ERROR if exc.code() in _CONFIG_ERRORS else logging.WARNING
                log.log(
                    level,
                    "stream to aggregator %s ended: %s: %s; retrying in %.1f s",
                    self.aggregator,
                    exc.code().name,
                    exc.details(),
                    wait_s,
                    extra={"code": exc.code().name, "unacked": len(self.buffer)},
                )
            except (ConnectionError, OSError, asyncio.InvalidStateError) as exc:
                # InvalidStateError: gRPC's "RPC already finished" when a write races the
                # aggregator going away.
                wait_s = backoff_s
                log.warning(
                    "stream to aggregator %s ended: %s; retrying in %.1f s", self.aggregator, exc, wait_s
                )
            except Exception:
                # A collector must outlive any one stream: log the surprise and reconnect.
                wait_s = backoff_s
                log.exception("stream to aggregator failed unexpectedly; retrying in %.1f s", wait_s)
            if self._welcomed:  # the last attempt got through: start the backoff again
                backoff_s = 0.5
            self._next_aggregator()
            self.reconnects_total += 1
            # Full jitter keeps a fleet of collectors from reconnecting in lock-step.
            delay = random.uniform(0.5 * wait_s, wait_s)
            backoff_s = min(self.config.backoff_max_s, backoff_s * 2)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)

    async def run(self, stop: asyncio.Event) -> None:
        log.info(
            "collector started: node %s, %d GPU(s)%s, interval %.3g s, aggregator %s",
            self.config.node,
            len(self.source.gpus),
            " (simulated)" if self.simulated else "",
            self.config.interval_s,
            ", ".join(self._addresses),
            extra={"boot_id": self.boot_id},
        )
        self._carry_in()
        sampler = asyncio.create_task(self._sample_loop(stop))
        try:
            await self._stream_loop(stop)
        finally:
            stop.set()
            await sampler
            # Folded XIDs still waiting for a tick go in a last report (kept with the rest).
            folded = self._folded_xids()
            if folded:
                self._new_report(time.time_ns(), events=folded)
            if not self._carry_out():
                self.advance_kmsg_cursor()

    def _carry_in(self) -> None:
        """Reports a previous run of this node's collector left unacknowledged go first."""
        if not self.config.state_dir:
            return
        path = carryover.carry_path(self.config.state_dir, self.config.node)
        try:
            carried = carryover.load(path, self.config.node, self.config.buffer_reports)
        except OSError as exc:
            log.error("cannot read carried-over reports from %s: %s", path, exc)
            return
        for report in carried:
            self.seq += 1
            report.boot_id, report.seq = self.boot_id, self.seq
            self.buffer.add(report)
        if carried:
            log.info("%d report(s) left unacknowledged by the last run are sent first", len(carried))

    def _carry_out(self) -> bool:
        """True when every unacknowledged report is kept for the next start (or none is left)."""
        left = self.buffer.after(0)
        if not left:
            self.advance_kmsg_cursor(carried=True)
            return True
        if not self.config.state_dir:
            log.warning(
                "exiting with %d unacknowledged report(s), not kept: set state_dir to send them after "
                "the restart",
                len(left),
                extra={"unacked": len(left)},
            )
            return False
        path = carryover.carry_path(self.config.state_dir, self.config.node)
        try:
            carryover.save(path, left)
        except OSError as exc:
            log.error("cannot keep %d unacknowledged report(s) in %s: %s", len(left), path, exc)
            return False
        log.info("%d unacknowledged report(s) kept in %s for the next start", len(left), path)
        self.advance_kmsg_cursor(carried=True)
        return True
