"""Load generator: K simulated node streams against an Ingest endpoint (the aggregator or
the bare baseline server), each sending an 8-GPU report every interval (paced) or as fast
as a window of unacknowledged reports allows (flood). Prints one JSON line of results.

Run by bench/ingest_bench.py; not meant to be run by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import grpc

from gpufleet.aggregator.auth import collector_token
from gpufleet.protos import ingest_pb2, telemetry_pb2

METHOD = "/gpufleet.v1.Ingest/Stream"
STREAMS_PER_CHANNEL = 50
CONNECT_BATCH = 100


class Stats:
    def __init__(self) -> None:
        self.window_start = 0.0
        self.window_end = 0.0
        self.sent = 0
        self.acked = 0
        self.rejected = 0
        self.errors: list[str] = []
        self.latencies_s: list[float] = []
        self.connected = 0

    def in_window(self, t: float) -> bool:
        return self.window_start <= t < self.window_end


def build_report(node: str, gpus: int) -> ingest_pb2.CollectorMessage:
    msg = ingest_pb2.CollectorMessage()
    r = msg.report
    r.node, r.cluster, r.boot_id, r.interval_s = node, "bench", "bench-boot", 1.0
    for i in range(gpus):
        r.gpus.add(
            index=i,
            uuid=f"GPU-{node}-{i}",
            model="NVIDIA H100 80GB HBM3",
            pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
            util_gpu_pct=87.0,
            util_mem_pct=40.0,
            hbm_used_bytes=70 << 30,
            hbm_total_bytes=80 << 30,
            temp_gpu_c=61.0,
            power_w=612.5,
            power_limit_w=700.0,
        )
    return msg


async def node_stream(
    channel: grpc.aio.Channel,
    index: int,
    args: argparse.Namespace,
    stats: Stats,
    all_connected: asyncio.Event,
    stop: asyncio.Event,
) -> None:
    node = f"bench-{index:05d}"
    call = channel.stream_stream(
        METHOD,
        request_serializer=ingest_pb2.CollectorMessage.SerializeToString,
        response_deserializer=ingest_pb2.AggregatorMessage.FromString,
    )(metadata=(("authorization", f"Bearer {collector_token(args.secret, node)}"),))
    hello = ingest_pb2.CollectorMessage(
        hello=ingest_pb2.Hello(
            protocol_version=1,
            node=node,
            cluster="bench",
            boot_id="bench-boot",
            interval_s=1.0,
            gpus=[telemetry_pb2.GpuIdentity(index=i) for i in range(args.gpus)],
        )
    )
    await call.write(hello)
    await call.read()
    stats.connected += 1
    if stats.connected == args.nodes:
        all_connected.set()
    msg = build_report(node, args.gpus)
    sent_at: dict[int, float] = {}
    window = asyncio.Semaphore(args.window)

    async def reader() -> None:
        while True:
            resp = await call.read()
            if resp is grpc.aio.EOF:
                return
            now = time.monotonic()
            if resp.WhichOneof("body") == "ack":
                for seq in resp.ack.seqs:
                    t = sent_at.pop(seq, None)
                    window.release()
                    if t is not None and stats.in_window(t):
                        stats.acked += 1
                        stats.latencies_s.append(now - t)
            elif resp.WhichOneof("body") == "reject":
                stats.rejected += 1
                window.release()

    read_task = asyncio.create_task(reader())
    await all_connected.wait()
    seq = 0
    # Stagger paced streams over the interval, as a real fleet's clocks are.
    next_t = time.monotonic() + (index / args.nodes) * args.interval
    try:
        while not stop.is_set():
            if args.mode == "paced":
                delay = next_t - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)  # the load's own schedule, not synchronisation
                next_t += args.interval
            await window.acquire()
            seq += 1
            now = time.monotonic()
            msg.report.seq = seq
            msg.report.time_unix_ns = time.time_ns()
            sent_at[seq] = now
            if stats.in_window(now):
                stats.sent += 1
            await call.write(msg)
    except grpc.aio.AioRpcError as exc:
        stats.errors.append(f"{node}: {exc.code().name} {exc.details()}")
    finally:
        read_task.cancel()
        call.cancel()


async def run(args: argparse.Namespace) -> dict[str, object]:
    stats = Stats()
    stop = asyncio.Event()
    all_connected = asyncio.Event()
    channels = [
        grpc.aio.insecure_channel(args.address, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range((args.nodes + STREAMS_PER_CHANNEL - 1) // STREAMS_PER_CHANNEL)
    ]
    # Streams are opened in batches, as a real fleet's collectors connect at different
    # times; opening thousands in the same instant makes grpc's client fail some of them.
    tasks: list[asyncio.Task[None]] = []
    for i in range(args.nodes):
        tasks.append(
            asyncio.create_task(
                node_stream(channels[i // STREAMS_PER_CHANNEL], i, args, stats, all_connected, stop)
            )
        )
        if len(tasks) % CONNECT_BATCH == 0:
            deadline = time.monotonic() + 30
            while stats.connected < len(tasks) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)  # the load's own pacing, not synchronisation
            failed = [t for t in tasks if t.done() and t.exception()]
            if failed:
                raise SystemExit(f"{len(failed)} streams failed to open: {failed[0].exception()}")
    await asyncio.wait_for(all_connected.wait(), 120)
    stats.window_start = time.monotonic() + args.warmup
    stats.window_end = stats.window_start + args.seconds
    wall_start = time.time() + args.warmup
    await asyncio.sleep(args.warmup + args.seconds + args.drain)  # the measurement window
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for ch in channels:
        await ch.close()
    lat = sorted(stats.latencies_s)

    def pct(q: float) -> float | None:
        return lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else None

    return {
        "sent": stats.sent,
        "acked": stats.acked,
        "rejected": stats.rejected,
        "errors": stats.errors[:5],
        "error_count": len(stats.errors),
        "seconds": args.seconds,
        "window_wall_start": wall_start,
        "window_wall_end": wall_start + args.seconds,
        "ack_latency_p50_ms": pct(0.5),
        "ack_latency_p99_ms": pct(0.99),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--address", required=True)
    p.add_argument("--secret", required=True)
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--mode", choices=["paced", "flood"], default="paced")
    p.add_argument("--window", type=int, default=64, help="unacked reports per stream (flood)")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--drain", type=float, default=3.0)
    args = p.parse_args()
    print(json.dumps(asyncio.run(run(args))), flush=True)


if __name__ == "__main__":
    main()
