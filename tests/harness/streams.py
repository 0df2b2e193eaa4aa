"""Collector streams driven by hand: any message (or raw bytes) sent, every answer read; a
valid hello and report to start from; a healthy node streaming beside a test's bad input."""

from __future__ import annotations

import time
from typing import Any

import grpc

from harness.fleet_api import bearer


class RawStream:
    """A hand-driven collector stream, able to send anything (including raw bytes)."""

    def __init__(
        self,
        address: str,
        token: str | None,
        credentials: grpc.ChannelCredentials | None = None,
        metadata: tuple[tuple[str, str], ...] = (),
    ) -> None:
        import queue
        import threading

        from gpufleet.protos import ingest_pb2

        self._outgoing: queue.Queue[object] = queue.Queue()
        self._incoming: queue.Queue[object] = queue.Queue()
        self._channel = (
            grpc.secure_channel(address, credentials) if credentials else grpc.insecure_channel(address)
        )
        method = self._channel.stream_stream(
            "/gpufleet.v1.Ingest/Stream",
            request_serializer=lambda m: m if isinstance(m, bytes) else m.SerializeToString(),
            response_deserializer=ingest_pb2.AggregatorMessage.FromString,
        )
        auth = bearer(token) if token is not None else ()
        self._responses = method(iter(self._outgoing.get, None), metadata=auth + metadata)

        def pump() -> None:
            try:
                for msg in self._responses:
                    self._incoming.put(msg)
                self._incoming.put(EOFError("stream closed by the aggregator"))
            except grpc.RpcError as exc:
                self._incoming.put(exc)

        threading.Thread(target=pump, daemon=True).start()

    def send(self, msg: object) -> None:
        self._outgoing.put(msg)

    def recv(self, timeout_s: float = 10) -> Any:
        """The next message; raises the stream's grpc.RpcError if it ended with one."""
        item = self._incoming.get(timeout=timeout_s)
        if isinstance(item, Exception):
            raise item
        return item

    def close(self) -> None:
        self._outgoing.put(None)
        self._channel.close()


def stream_error(s: RawStream, timeout_s: float = 10) -> grpc.RpcError:
    """How the aggregator ended the stream (every message before it passed over); fails the
    test if it does not end with an error within timeout_s a message."""
    import pytest

    with pytest.raises(grpc.RpcError) as info:
        while True:
            s.recv(timeout_s)
    s.close()
    return info.value


def hello(
    node: str, gpus: int = 8, boot_id: str = "boot-1", protocol_version: int = 1, columnar_gpus: bool = False
) -> Any:
    from gpufleet.protos import ingest_pb2, telemetry_pb2

    return ingest_pb2.CollectorMessage(
        hello=ingest_pb2.Hello(
            protocol_version=protocol_version,
            node=node,
            cluster="test",
            boot_id=boot_id,
            collector_version="test",
            interval_s=1.0,
            columnar_gpus=columnar_gpus,
            gpus=[
                telemetry_pb2.GpuIdentity(index=i, uuid=f"GPU-{node}-{i}", model="NVIDIA H100 80GB HBM3")
                for i in range(gpus)
            ],
        )
    )


def report(node: str, seq: int, boot_id: str = "boot-1", gpus: int = 8, **gpu0: Any) -> Any:
    """A valid report of `gpus` GPUs; keyword arguments override fields of GPU 0."""
    from gpufleet.protos import ingest_pb2, telemetry_pb2

    r = telemetry_pb2.NodeReport(
        node=node, cluster="test", boot_id=boot_id, seq=seq, time_unix_ns=time.time_ns()
    )
    for i in range(gpus):
        r.gpus.add(
            index=i,
            uuid=f"GPU-{node}-{i}",
            model="NVIDIA H100 80GB HBM3",
            util_gpu_pct=50.0,
            hbm_used_bytes=10 << 30,
            hbm_total_bytes=80 << 30,
            temp_gpu_c=55.0,
            power_w=400.0,
        )
    for name, value in gpu0.items():
        setattr(r.gpus[0], name, value)
    return ingest_pb2.CollectorMessage(report=r)


class HealthyNode:
    """A node that keeps streaming alongside a test's bad input: one report every interval_s on
    its own stream, each ack's latency recorded. `worst_ack_s` is what the test asserts on."""

    def __init__(self, address: str, token: str, node: str = "healthy-node", interval_s: float = 0.2) -> None:
        import threading

        self.node = node
        self.latencies_s: list[float] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._stream = RawStream(address, token)
        self._stream.send(hello(node))
        assert self._stream.recv().WhichOneof("body") == "welcome"
        self._interval_s = interval_s
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        seq = 0
        while not self._stop.is_set():
            seq += 1
            sent = time.monotonic()
            self._stream.send(report(self.node, seq))
            try:
                msg = self._stream.recv(timeout_s=10)
            except Exception as exc:  # recorded for the test to fail on
                self.errors.append(f"seq {seq}: {exc!r}")
                return
            if msg.WhichOneof("body") != "ack" or list(msg.ack.seqs) != [seq]:
                self.errors.append(f"seq {seq}: answered {msg}")
                return
            self.latencies_s.append(time.monotonic() - sent)
            self._stop.wait(self._interval_s)

    @property
    def worst_ack_s(self) -> float:
        return max(self.latencies_s, default=0.0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(15)
        self._stream.close()
