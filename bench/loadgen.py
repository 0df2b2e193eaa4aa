"""Load generator: K simulated node streams against an Ingest endpoint (the aggregator or
the bare baseline server), each sending an 8-GPU report every interval (paced) or as fast
as a window of unacknowledged reports allows (flood).

`drive()` splits the streams over several generator processes (one event loop is one core,
and 2,000 streams at 1 s are more than one Python process sends on a slow core), starts the
measurement window in all of them at one wall-clock time, samples their CPU, and merges what
they saw. A child process is this file run with --child; it prints "connected", waits for
"go WALL_TIME" on stdin, and prints one JSON line of results.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil

from gpufleet.aggregator.auth.tokens import issue_collector_token
from gpufleet.protos import columns, ingest_pb2, telemetry_pb2

METHOD = "/gpufleet.v1.Ingest/Stream"
STREAMS_PER_CHANNEL = 50
CONNECT_BATCH = 100
HERE = Path(__file__).resolve()


def machine() -> str:
    """Cores and CPU model, so figures from different machines are not confused."""
    model = "unknown CPU"
    try:
        for row in Path("/proc/cpuinfo").read_text().splitlines():
            if row.startswith("model name"):
                model = row.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {model}, Python {sys.version.split()[0]}"


class Stats:
    def __init__(self) -> None:
        self.window_start = 0.0
        self.window_end = 0.0
        self.sent = 0
        self.acked = 0
        self.rejected = 0
        self.errors: list[str] = []
        self.latencies_s: list[float] = []
        self.minutes: list[int] = []  # each latency's minute of the window (its report's send time)
        self.connected = 0

    def in_window(self, t: float) -> bool:
        return self.window_start <= t < self.window_end


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


_REPORT_TAG = bytes([(ingest_pb2.CollectorMessage.DESCRIPTOR.fields_by_name["report"].number << 3) | 2])
_SEQ_TAG = _varint(telemetry_pb2.NodeReport.DESCRIPTOR.fields_by_name["seq"].number << 3)
_TIME_TAG = _varint(telemetry_pb2.NodeReport.DESCRIPTOR.fields_by_name["time_unix_ns"].number << 3)


class ReportBytes:
    """A node's report as wire bytes, with a new seq and time spliced in per send: the same
    bytes SerializeToString makes of the message with those two fields set (protobuf keeps the
    last value of a repeated scalar field), for a fraction of its CPU. The generator's CPU is
    taken from the machine the aggregator runs on, so it is kept small."""

    def __init__(self, msg: ingest_pb2.CollectorMessage) -> None:
        report = msg.report
        report.ClearField("seq")
        report.ClearField("time_unix_ns")
        self._body = report.SerializeToString()

    def make(self, seq: int, time_unix_ns: int) -> bytes:
        body = self._body + _SEQ_TAG + _varint(seq) + _TIME_TAG + _varint(time_unix_ns)
        return _REPORT_TAG + _varint(len(body)) + body


def build_report(node: str, gpus: int, columnar: bool = False) -> ingest_pb2.CollectorMessage:
    """A node's report as the collector sends it: its GPU samples as columns (GpuColumns) when
    columnar, else one GpuSample each."""
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
    if columnar:
        r.gpu_columns.CopyFrom(columns.to_columns(r.gpus))
        r.ClearField("gpus")
    return msg


def bench_job_id(index: int) -> str:
    """The Slurm job id bench node `index` runs (bench/workloads_bench.py records it)."""
    return str(100_000 + index)


def bench_node(index: int) -> str:
    return f"bench-{index:05d}"


async def node_stream(
    channel: grpc.aio.Channel,
    index: int,
    args: argparse.Namespace,
    stats: Stats,
    go: asyncio.Event,
    stop: asyncio.Event,
) -> None:
    node = bench_node(index)
    call = channel.stream_stream(
        METHOD,
        request_serializer=bytes,  # messages are written as bytes (ReportBytes)
        response_deserializer=ingest_pb2.AggregatorMessage.FromString,
    )(metadata=(("authorization", f"Bearer {issue_collector_token(args.secret, node)[0]}"),))
    hello = ingest_pb2.CollectorMessage(
        hello=ingest_pb2.Hello(
            protocol_version=1,
            node=node,
            cluster="bench",
            boot_id="bench-boot",
            interval_s=args.interval,
            columnar_gpus=args.columnar,
            gpus=[
                telemetry_pb2.GpuIdentity(index=i, uuid=f"GPU-{node}-{i}", model="NVIDIA H100 80GB HBM3")
                for i in range(args.gpus)
            ],
        )
    )
    await call.write(hello.SerializeToString())
    await call.read()
    stats.connected += 1
    msg = build_report(node, args.gpus, args.columnar)
    msg.report.interval_s = args.interval
    if args.workloads:
        # The node's job on every GPU, as a collector names it from its processes' cgroup.
        msg.report.workloads.add(
            scheduler="slurm",
            id=bench_job_id(index),
            part="0",
            gpu_indices=range(args.gpus),
            pids=[5_000_000 + index],
            process_count=1,
            hbm_used_bytes=70 << 30,
            source="cgroup",
        )
    wire = ReportBytes(msg)
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
                        stats.minutes.append(int((t - stats.window_start) // 60))
            elif resp.WhichOneof("body") == "reject":
                stats.rejected += 1
                window.release()

    read_task = asyncio.create_task(reader())
    await go.wait()
    seq = 0
    # Stagger paced streams over the interval (by their index in the whole fleet, whichever
    # process runs them), as a real fleet's clocks are.
    next_t = stats.window_start - args.warmup + (index / args.nodes) * args.interval
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
            data = wire.make(seq, time.time_ns())
            sent_at[seq] = now
            if stats.in_window(now):
                stats.sent += 1
            await call.write(data)
    except grpc.aio.AioRpcError as exc:
        stats.errors.append(f"{node}: {exc.code().name} {exc.details()}")
    finally:
        read_task.cancel()
        call.cancel()


async def child(args: argparse.Namespace) -> dict[str, object]:
    stats = Stats()
    stop, go = asyncio.Event(), asyncio.Event()
    indices = range(args.first, args.first + args.count)
    # Several comma-separated addresses (aggregator replicas): node i streams to address i mod n.
    addresses = args.address.split(",")
    channels: dict[tuple[int, int], grpc.aio.Channel] = {}
    per_address = [0] * len(addresses)

    def channel_for(i: int) -> grpc.aio.Channel:
        a = i % len(addresses)
        key = (a, per_address[a] // STREAMS_PER_CHANNEL)
        per_address[a] += 1
        if key not in channels:
            channels[key] = grpc.aio.insecure_channel(
                addresses[a], options=[("grpc.use_local_subchannel_pool", 1)]
            )
        return channels[key]

    # Streams are opened in batches, as a real fleet's collectors connect at different
    # times; opening thousands in the same instant makes grpc's client fail some of them.
    tasks: list[asyncio.Task[None]] = []
    for i in indices:
        tasks.append(asyncio.create_task(node_stream(channel_for(i), i, args, stats, go, stop)))
        if len(tasks) % CONNECT_BATCH == 0 or len(tasks) == args.count:
            deadline = time.monotonic() + 60
            while stats.connected < len(tasks) and time.monotonic() < deadline:
                failed = [t for t in tasks if t.done() and t.exception()]
                if failed:
                    raise SystemExit(f"{len(failed)} streams failed to open: {failed[0].exception()}")
                await asyncio.sleep(0.01)  # the load's own pacing, not synchronisation
            if stats.connected < len(tasks):
                raise SystemExit(f"only {stats.connected} of {len(tasks)} streams opened in 60 s")
    print("connected", flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    wall_start = float(line.split()[1])  # "go WALL_START": the window starts then, in every child
    stats.window_start = time.monotonic() + (wall_start - time.time())
    stats.window_end = stats.window_start + args.seconds
    go.set()
    await asyncio.sleep(max(0.0, stats.window_end - time.monotonic()) + args.drain)  # the window
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for ch in channels.values():
        await ch.close()
    return {
        "sent": stats.sent,
        "acked": stats.acked,
        "rejected": stats.rejected,
        "errors": stats.errors[:5],
        "error_count": len(stats.errors),
        "latencies_ms": [round(x * 1000, 2) for x in stats.latencies_s],
        "minutes": stats.minutes,
    }


@dataclass
class Load:
    address: str  # host:port, or several comma-separated (replicas: nodes spread over them)
    secret: str
    nodes: int = 2000
    gpus: int = 8
    interval: float = 1.0
    mode: str = "paced"
    window: int = 64
    seconds: float = 20.0
    warmup: float = 3.0
    drain: float = 3.0
    procs: int = 2
    columnar: bool = False  # GPU samples as columns (GpuColumns), as collectors send by default
    workloads: bool = False  # each report names its node's job (bench/workloads_bench.py)


class CpuSampler(threading.Thread):
    """CPU seconds and RSS of a set of processes (with their children, if asked: ingest worker
    processes), sampled twice a second. A process that ends drops out of the sums."""

    def __init__(self, pids: list[int], children: bool = False) -> None:
        super().__init__(daemon=True)
        self.procs = [psutil.Process(p) for p in pids]
        self.children = children
        self.samples: list[tuple[float, float, int]] = []  # (wall, cpu seconds, rss bytes)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            cpu, rss = 0.0, 0
            for top in self.procs:
                try:
                    family = [top, *top.children(recursive=True)] if self.children else [top]
                except psutil.Error:
                    continue
                for proc in family:
                    try:
                        t = proc.cpu_times()
                        cpu += t.user + t.system
                        rss += proc.memory_info().rss
                    except psutil.Error:
                        pass
            self.samples.append((time.time(), cpu, rss))
            self.stop.wait(0.5)

    def cpu_pct(self, start: float, end: float) -> float:
        """CPU over [start, end] wall-clock seconds; 100 = one core."""
        window = [s for s in self.samples if start <= s[0] <= end]
        if len(window) < 2:
            return float("nan")
        return 100 * (window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0])

    def peak_rss_mib(self) -> float:
        return max((s[2] for s in self.samples), default=0) / 2**20


def drive(load: Load) -> dict[str, object]:
    """Run the load in load.procs processes; merged results, the window's wall-clock span and
    the generators' own CPU (100 = one core)."""
    procs = max(1, min(load.procs, load.nodes))
    share = [load.nodes // procs + (1 if i < load.nodes % procs else 0) for i in range(procs)]
    children: list[subprocess.Popen[str]] = []
    first = 0
    for count in share:
        argv = [sys.executable, str(HERE), "--child", "--first", str(first), "--count", str(count)]
        for name in ("address", "secret", "nodes", "gpus", "interval", "mode", "window", "seconds", "warmup"):
            argv += [f"--{name}", str(getattr(load, name))]
        argv += ["--drain", str(load.drain), *(["--columnar"] if load.columnar else [])]
        argv += ["--workloads"] if load.workloads else []
        children.append(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        first += count
    try:
        for c in children:
            assert c.stdout is not None
            if c.stdout.readline().strip() != "connected":
                raise SystemExit(f"a load generator failed to connect its streams (exit {c.wait()})")
        sampler = CpuSampler([c.pid for c in children])
        sampler.start()
        wall_start = time.time() + load.warmup
        for c in children:
            assert c.stdin is not None
            c.stdin.write(f"go {wall_start}\n")
            c.stdin.flush()
        parts = []
        for c in children:
            out, _ = c.communicate(timeout=load.warmup + load.seconds + load.drain + 300)
            if c.returncode:
                raise SystemExit(f"a load generator exited {c.returncode}")
            parts.append(json.loads(out.strip().splitlines()[-1]))
        sampler.stop.set()
        sampler.join()
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
    lat = sorted(x for p in parts for x in p["latencies_ms"])
    by_minute: dict[int, list[float]] = {}
    for p in parts:
        for minute, ms in zip(p["minutes"], p["latencies_ms"], strict=True):
            by_minute.setdefault(minute, []).append(ms)

    def pct(q: float, values: list[float] = lat) -> float | None:
        return values[min(len(values) - 1, int(q * len(values)))] if values else None

    per_minute = []
    for minute in sorted(by_minute):
        values = sorted(by_minute[minute])
        per_minute.append({"minute": minute, "acked": len(values), "p50_ms": pct(0.5, values),
                           "p99_ms": pct(0.99, values)})  # fmt: skip

    wall_end = wall_start + load.seconds
    return {
        "sent": sum(p["sent"] for p in parts),
        "acked": sum(p["acked"] for p in parts),
        "rejected": sum(p["rejected"] for p in parts),
        "errors": [e for p in parts for e in p["errors"]][:5],
        "error_count": sum(p["error_count"] for p in parts),
        "seconds": load.seconds,
        "window_wall_start": wall_start,
        "window_wall_end": wall_end,
        "ack_latency_p50_ms": pct(0.5),
        "ack_latency_p99_ms": pct(0.99),
        "per_minute": per_minute,  # ack latency by the minute of the window a report was sent in
        "loadgen_cpu_pct": sampler.cpu_pct(wall_start, wall_end),
        "loadgen_procs": procs,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--child", action="store_true", required=True)
    p.add_argument("--first", type=int, required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--address", required=True)
    p.add_argument("--secret", required=True)
    p.add_argument("--nodes", type=int, required=True, help="streams in the whole load (all children)")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--mode", choices=["paced", "flood"], default="paced")
    p.add_argument("--window", type=int, default=64, help="unacked reports per stream (flood)")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--drain", type=float, default=3.0)
    p.add_argument("--columnar", action="store_true", help="GPU samples as columns")
    p.add_argument("--workloads", action="store_true", help="each report names its node's job")
    args = p.parse_args()
    print(json.dumps(asyncio.run(child(args))), flush=True)


if __name__ == "__main__":
    main()
