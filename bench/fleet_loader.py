"""Puts N nodes into an aggregator's fleet view over real gRPC: each node a stream of its own
(its own credential, a hello of 8 GPUs, one report of those GPUs and two inference engines,
answered before the stream closes), many at a time over a few channels. Used by
bench/fleet_view_bench.py and the fleet view at scale test (tests/fleet/test_fleet_scale.py)."""

from __future__ import annotations

import asyncio
import time
import zlib

import grpc

from gpufleet.aggregator.auth.tokens import issue_collector_token
from gpufleet.protos import ingest_pb2, telemetry_pb2

INTERVAL_S = 3600.0
METHOD = "/gpufleet.v1.Ingest/Stream"
MODEL = "NVIDIA H100 80GB HBM3"
# Each node reports once: an hour's interval keeps it "reporting" (liveness scales with it) for the
# whole of a test or a bench, as a fleet that keeps reporting would be.


def messages(node: str, gpus: int = 8, engines: int = 2) -> tuple[bytes, bytes]:
    """(hello, report) of one node, as wire bytes."""
    hello = ingest_pb2.CollectorMessage(
        hello=ingest_pb2.Hello(
            protocol_version=1,
            node=node,
            cluster=f"c{zlib.crc32(node.encode()) % 4}",
            boot_id="load",
            interval_s=INTERVAL_S,
            gpus=[
                telemetry_pb2.GpuIdentity(index=i, uuid=f"GPU-{node}-{i}", model=MODEL) for i in range(gpus)
            ],
        )
    )
    r = telemetry_pb2.NodeReport(
        node=node,
        cluster=hello.hello.cluster,
        boot_id="load",
        seq=1,
        time_unix_ns=time.time_ns(),
        interval_s=INTERVAL_S,
    )
    for i in range(gpus):
        r.gpus.add(
            index=i,
            uuid=f"GPU-{node}-{i}",
            model=MODEL,
            util_gpu_pct=float((zlib.crc32(node.encode()) + i) % 100),
            hbm_used_bytes=40 << 30,
            hbm_total_bytes=80 << 30,
            temp_gpu_c=60.0,
            power_w=500.0,
        )
    for k in range(engines):
        r.engines.add(
            engine="vllm",
            model="meta-llama/Llama-3.1-8B-Instruct",
            port=8000 + k,
            endpoint=f"http://127.0.0.1:{8000 + k}/metrics",
            gpu_indices=[k],
            readable=True,
            kv_cache_usage_ratio=0.5,
            requests_running=4.0,
        )
    return hello.SerializeToString(), ingest_pb2.CollectorMessage(report=r).SerializeToString()


async def _one(channel: grpc.aio.Channel, secret: str, node: str) -> None:
    hello, report = messages(node)
    call = channel.stream_stream(
        METHOD, request_serializer=bytes, response_deserializer=ingest_pb2.AggregatorMessage.FromString
    )(metadata=(("authorization", f"Bearer {issue_collector_token(secret, node)[0]}"),))
    await call.write(hello)
    welcome = await call.read()
    assert welcome.WhichOneof("body") == "welcome", welcome
    await call.write(report)
    while True:
        msg = await call.read()
        if msg is grpc.aio.EOF:
            raise ConnectionError(f"{node}: stream ended before its report was answered")
        if msg.WhichOneof("body") == "ack":
            break
        if msg.WhichOneof("body") == "reject":
            raise ValueError(f"{node}: {msg.reject.message}")
    await call.done_writing()  # the aggregator then ends the stream, which frees its slot
    while await call.read() is not grpc.aio.EOF:
        pass


async def load(address: str, secret: str, nodes: int, prefix: str = "node", concurrency: int = 200) -> float:
    """Put nodes prefix-00000 ... into the fleet view; seconds it took. Concurrency stays under
    the aggregator's default streams per peer (256)."""
    started = time.monotonic()
    channels = [grpc.aio.insecure_channel(address) for _ in range(8)]
    gate = asyncio.Semaphore(concurrency)

    async def node(i: int) -> None:
        async with gate:
            await _one(channels[i % len(channels)], secret, f"{prefix}-{i:05d}")

    try:
        await asyncio.gather(*(node(i) for i in range(nodes)))
    finally:
        for channel in channels:
            await channel.close()
    return time.monotonic() - started
