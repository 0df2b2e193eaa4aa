"""The collector's stream to the aggregator: hello, replay of everything unacknowledged, live
reports, acks and rejections, commands and their answers (one write at a time), reconnects with
backoff across the replicas' addresses, and the drain before a clean exit."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import time
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

from gpufleet.collector.config import CollectorConfig
from gpufleet.collector.keeping import Keeping
from gpufleet.collector.replay_buffer import ReplayBuffer
from gpufleet.collector.report_book import ReportBook
from gpufleet.protos import columns, ingest_pb2, ingest_pb2_grpc, telemetry_pb2

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


class AckTimeout(ConnectionError):
    """The aggregator holds the stream open but stopped acknowledging (paused, hung)."""


class _SentReports:
    """The reports sent on one stream and when, oldest first, kept only while the replay
    buffer still holds them (unacknowledged): at most the buffer's worth, however long the
    stream lives."""

    def __init__(self, buffer: ReplayBuffer) -> None:
        self._buffer = buffer
        self._sent: collections.deque[tuple[int, float]] = collections.deque()  # (seq, when sent)

    def add(self, seq: int) -> None:
        self._sent.append((seq, time.monotonic()))
        self._prune()

    def oldest(self) -> tuple[int, float] | None:
        """(seq, monotonic time sent) of the oldest report still waiting; None if none waits."""
        self._prune()
        return self._sent[0] if self._sent else None

    def __len__(self) -> int:
        return len(self._sent)

    def _prune(self) -> None:
        while self._sent and not self._buffer.holds(self._sent[0][0]):
            self._sent.popleft()  # acknowledged (or rejected, or dropped from a full buffer)


class AggregatorStream:
    """Keeps this node's one stream to an aggregator: sends what the book holds, forgets what is
    acknowledged (moving the kernel-log cursor on), answers commands, and reconnects."""

    def __init__(
        self,
        config: CollectorConfig,
        book: ReportBook,
        keeping: Keeping,
        hello: Callable[[], ingest_pb2.Hello],
        answer: Callable[[ingest_pb2.Command], Awaitable[ingest_pb2.CommandResult]],
        sampling_stopped: asyncio.Event,
    ) -> None:
        self.config = config
        self._book = book
        self.buffer = book.buffer
        self._keeping = keeping
        self._hello_now = hello
        self._answer = answer
        self._sampling_stopped = sampling_stopped
        # Replicas: start at the address this node's name picks (the fleet spreads over them)
        # and move to the next one whenever a stream breaks; the replay buffer covers the gap.
        self._addresses = config.aggregator_addresses
        self._address_index = zlib.crc32(config.node.encode()) % len(self._addresses)
        self.token = config.resolve_token()
        self.reconnects_total = 0
        self.ack_timeouts_total = (
            0  # streams left because the aggregator stopped acknowledging (also reconnects)
        )
        self.connected = asyncio.Event()
        self._welcomed = False
        self._command_tasks: set[asyncio.Task[None]] = set()
        self._write_lock = asyncio.Lock()
        self._unsent_results: list[ingest_pb2.CommandResult] = []  # kept across a broken stream

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
            await call.write(ingest_pb2.CollectorMessage(hello=self._hello_now()))
            first = await call.read()
            if first is grpc.aio.EOF or first.WhichOneof("body") != "welcome":
                raise ConnectionError("aggregator did not answer the hello with a welcome")
            # Columns only where both ends said so: an older aggregator gets per-GPU samples.
            columnar = c.columnar_gpus and first.welcome.columnar_gpus
            log.info(
                "connected to aggregator %s (GPU samples %s); %d unacknowledged report(s) to replay",
                self.aggregator,
                "as columns" if columnar else "per GPU",
                len(self.buffer),
                extra={"aggregator": self.aggregator, "boot_id": self._book.boot_id},
            )
            self.connected.set()
            self._welcomed = True
            sent = _SentReports(self.buffer)
            sender = asyncio.create_task(self._send_loop(call, columnar, sent))
            receiver = asyncio.create_task(self._receive_loop(call))
            stopper = asyncio.create_task(stop.wait())
            watch = asyncio.create_task(self._ack_watch(sent))
            try:
                done, _ = await asyncio.wait(
                    {sender, receiver, stopper, watch}, return_when=asyncio.FIRST_COMPLETED
                )
                if stopper in done:
                    await self._drain_before_exit()
                    return
                for task in done:
                    task.result()  # re-raise the error that ended the stream
                raise ConnectionError("aggregator closed the stream")
            finally:
                self.connected.clear()
                for task in (sender, receiver, stopper, watch):
                    task.cancel()
                await asyncio.gather(sender, receiver, stopper, watch, return_exceptions=True)

    async def _ack_watch(self, sent: _SentReports) -> None:
        """Ends the stream (AckTimeout) when the oldest report sent on it has waited
        ack_timeout_intervals intervals: a paused or hung replica keeps the connection open and
        reads nothing, and only a stream that moves on gets this node's reports stored. Only
        with several addresses: with one, waiting is all a collector can do (its buffer keeps
        every report until acknowledged)."""
        c = self.config
        timeout_s = c.ack_timeout_intervals * c.interval_s
        if not timeout_s or len(self._addresses) < 2:
            await asyncio.Event().wait()  # never ends the stream
        check_s = min(0.25, c.interval_s / 4)
        while True:
            await asyncio.sleep(check_s)  # the watch's own period, not synchronisation
            oldest = sent.oldest()
            if oldest is not None and time.monotonic() - oldest[1] > timeout_s:
                self.ack_timeouts_total += 1
                raise AckTimeout(
                    f"no acknowledgement for report seq {oldest[0]} in {timeout_s:g} s "
                    f"({c.ack_timeout_intervals:g} intervals; {len(sent)} report(s) outstanding)"
                )

    async def _write(self, call: grpc.aio.StreamStreamCall, message: ingest_pb2.CollectorMessage) -> None:
        # One write at a time on a stream: gRPC refuses a second while one is in flight
        # (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS, which ends the stream). Reports and command
        # results are written by different tasks.
        async with self._write_lock:
            await call.write(message)

    async def _send_loop(self, call: grpc.aio.StreamStreamCall, columnar: bool, sent: _SentReports) -> None:
        # Results a broken stream did not carry go first: the aggregator is still waiting.
        while self._unsent_results:
            await self._write(call, ingest_pb2.CollectorMessage(command_result=self._unsent_results[0]))
            self._unsent_results.pop(0)
        last_sent = 0
        while True:
            for report in self.buffer.after(last_sent):
                await self._write(call, ingest_pb2.CollectorMessage(report=_wire_form(report, columnar)))
                last_sent = report.seq
                sent.add(report.seq)
            await self.buffer.wait_for_new()

    async def _receive_loop(self, call: grpc.aio.StreamStreamCall) -> None:
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                return
            body = msg.WhichOneof("body")
            if body == "ack":
                self.buffer.ack(list(msg.ack.seqs))
                self._keeping.advance_kmsg_cursor()
            elif body == "reject":
                if self.buffer.reject(msg.reject.seq):
                    self._keeping.advance_kmsg_cursor()
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
        result = await self._answer(command)
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

    async def run(self, stop: asyncio.Event) -> None:
        """Stream until stop (then drain what is unacknowledged, within shutdown_grace_s)."""
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
            except AckTimeout as exc:
                # The replica is alive enough to hold the connection but not to answer: the
                # next address at once, no backoff (it is not the network that failed).
                wait_s = 0.0
                log.warning(
                    "aggregator %s stopped acknowledging: %s; moving to the next address",
                    self.aggregator,
                    exc,
                    extra={"aggregator": self.aggregator, "unacked": len(self.buffer)},
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


def _wire_form(report: telemetry_pb2.NodeReport, columnar: bool) -> telemetry_pb2.NodeReport:
    """The report as it goes on this stream: its GPU samples as columns where the aggregator
    takes them (the buffer keeps them per GPU, whichever aggregator the next stream reaches)."""
    if not (columnar and report.gpus):
        return report
    wire = telemetry_pb2.NodeReport()
    wire.CopyFrom(report)
    wire.ClearField("gpus")
    wire.gpu_columns.CopyFrom(columns.to_columns(report.gpus))
    return wire
