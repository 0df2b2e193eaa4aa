"""InfluxDB ingest and history benchmark, against a real influxd started for the run.

    python bench/influx_bench.py                   # 1,000 nodes x 8 GPUs
    python bench/influx_bench.py --repeat 3

1. Bare line-protocol writer: the simulated fleet's points (8 GPU points + 1 collector point
   per node per report) POSTed straight to /write in 5,000-line batches — InfluxDB's own
   pace on this machine.
2. Through the aggregator (--store influxdb): the same fleet shape driven by bench/loadgen.py
   in flood mode (collectors sending columns); acknowledged reports x 9 points.
   Prints points/s for both and their ratio, and influxd's own CPU seconds per million points
   in each (sampled from its process): how well the aggregator batches against the bare
   writer, whatever else shares the cores (target <= 1.15).
3. Paced, as a fleet sends: 2,000 nodes x 8 GPUs at 1 s through the aggregator into influxd
   (--paced-nodes): the share acknowledged and the ack latency (targets >= 99 %, p99 < 2 s).
4. History: a 1-hour raw query of 1 node x 8 GPUs at a 1 min step, and the same node over
   30 days at a 1 h step from the hourly roll-up (what the Fleet API routes it to) and, for
   comparison, from raw data.
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import subprocess
import tempfile
import time
import tomllib
from pathlib import Path

from ingest_bench import aggregator_argv, wait_for_file  # bench/ is on sys.path when a bench script runs
from loadgen import CpuSampler, Load, drive, machine

from gpufleet.aggregator.auth.tokens import new_secrets_file
from gpufleet.aggregator.fleet import rollups
from gpufleet.aggregator.store import HistoryQuery, Point
from gpufleet.aggregator.store.influx import InfluxStore
from gpufleet.aggregator.store.lineproto import line

S = 1_000_000_000


def start_influxd(home: Path) -> tuple[subprocess.Popen[bytes], str]:
    import socket
    import urllib.request

    def port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    http_port, rpc_port = port(), port()
    home.mkdir(parents=True, exist_ok=True)
    conf = home / "influxdb.conf"
    conf.write_text(
        f'reporting-disabled = true\nbind-address = "127.0.0.1:{rpc_port}"\n[meta]\n  dir = "{home}/meta"\n'
        f'[data]\n  dir = "{home}/data"\n  wal-dir = "{home}/wal"\n  query-log-enabled = false\n'
        f'[http]\n  bind-address = "127.0.0.1:{http_port}"\n  log-enabled = false\n'
    )
    proc = subprocess.Popen(
        ["influxd", "-config", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{http_port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(f"{url}/ping", timeout=1).status == 204:
                return proc, url
        except OSError:
            time.sleep(0.1)
    raise SystemExit("influxd did not start")


def fleet_points(nodes: int, t_ns: int) -> list[Point]:
    points = []
    for n in range(nodes):
        node = f"bench-{n:05d}"
        for g in range(8):
            points.append(
                Point(
                    "gpu",
                    {
                        "node": node,
                        "gpu": str(g),
                        "uuid": f"GPU-{node}-{g}",
                        "model": "NVIDIA H100 80GB HBM3",
                        "cluster": "bench",
                    },
                    {
                        "util_gpu_pct": 87.0,
                        "util_mem_pct": 40.0,
                        "hbm_used_bytes": 70 << 30,
                        "hbm_total_bytes": 80 << 30,
                        "temp_gpu_c": 61.0,
                        "power_w": 612.5,
                        "power_limit_w": 700.0,
                        "lost": False,
                    },
                    t_ns,
                )
            )
        points.append(
            Point("collector", {"node": node, "cluster": "bench"}, {"seq": 1, "boot_id": "b"}, t_ns)
        )
    return points


def bare_writer(url: str, database: str, nodes: int, reports: int, influxd_pid: int) -> tuple[float, float]:
    """Points per second, line protocol POSTed directly; and influxd's CPU seconds per million
    points meanwhile."""
    InfluxStore(url, database)  # creates the database
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    t0_ns = time.time_ns() - reports * S
    bodies = []
    for r in range(reports):
        lines = [line(p) for p in fleet_points(nodes, t0_ns + r * S)]
        bodies += ["\n".join(lines[i : i + 5000]).encode() for i in range(0, len(lines), 5000)]
    total = reports * nodes * 9
    cpu_before = _cpu_s(influxd_pid)
    start = time.perf_counter()
    for body in bodies:
        conn.request("POST", f"/write?db={database}&precision=ns", body=body)
        response = conn.getresponse()
        response.read()
        assert response.status == 204, response.status
    elapsed = time.perf_counter() - start
    return total / elapsed, (_cpu_s(influxd_pid) - cpu_before) / total * 1e6


def _cpu_s(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def through_aggregator(
    url: str,
    database: str,
    nodes: int,
    seconds: float,
    tmp: Path,
    workers: int | None,
    influxd_pid: int,
    mode: str = "flood",
) -> dict:
    """The load through an aggregator on influxd: points/s acknowledged, influxd's CPU seconds
    per million points over the window, and the load's own figures."""
    secrets = tmp / "secrets.toml"
    new_secrets_file(secrets, [])
    secret = tomllib.loads(secrets.read_text())["collector_secret"]
    ready = tmp / "agg.ready.json"
    agg = subprocess.Popen(
        aggregator_argv(
            tmp / f"data-{time.monotonic_ns()}",
            secrets,
            ready,
            "--store",
            "influxdb",
            "--influx-url",
            url,
            "--influx-database",
            database,
            *(() if workers is None else ("--ingest-workers", str(workers))),
        )
    )
    try:
        address = wait_for_file(ready, agg, 60)["ingest"]
        influx_cpu = CpuSampler([influxd_pid])
        influx_cpu.start()
        result = drive(
            Load(
                address=address,
                secret=secret,
                nodes=nodes,
                mode=mode,
                window=16,
                seconds=seconds,
                columnar=True,
            )
        )
        influx_cpu.stop.set()
        influx_cpu.join()
        points = result["acked"] * 9
        cpu_pct = influx_cpu.cpu_pct(result["window_wall_start"], result["window_wall_end"])
        result["points_per_s"] = points / result["seconds"]
        result["influxd_cpu_s_per_million"] = cpu_pct / 100 * result["seconds"] / max(1, points) * 1e6
        return result
    finally:
        agg.terminate()
        agg.wait(timeout=60)
        ready.unlink(missing_ok=True)


def history_latency(url: str, database: str) -> tuple[float, float]:
    """Median seconds for 1 h raw at 1 min, and 30 days raw at 1 h, for 1 node x 8 GPUs."""
    store = InfluxStore(url, database, rollup_policies={"_1h": ("gpufleet_1h", 730 * 86400)})
    now = time.time_ns()
    start_30d = now - 30 * 86400 * S
    # 30 days of one node at a 60 s interval (8 GPUs): 345,600 points.
    batch: list[Point] = []
    for t in range(start_30d, now, 60 * S):
        for g in range(8):
            batch.append(Point("gpu", {"node": "hist-node", "gpu": str(g)}, {"util_gpu_pct": float(g)}, t))
        if len(batch) >= 20_000:
            store.write(batch)
            batch = []
    store.write(batch)
    # The last hour again at the collector's default 5 s interval: what "raw resolution" means
    # for a 1-hour query (720 samples per GPU, as many as 30 days of hourly buckets).
    batch = []
    for t in range(now - 3600 * S, now, 5 * S):
        if (t - start_30d) % (60 * S):
            for g in range(8):
                batch.append(
                    Point("gpu", {"node": "hist-node", "gpu": str(g)}, {"util_gpu_pct": float(g)}, t)
                )
    store.write(batch)

    def timed(start: int, step: int) -> float:
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            store.query_history(
                HistoryQuery("gpu", "util_gpu_pct", start, now, step, "mean", {"node": ["hist-node"]})
            )
            runs.append(time.perf_counter() - t0)
        return statistics.median(runs)

    # The hourly roll-up for those 30 days, as the aggregator builds it (rollups.py).
    rollups.compute(store, rollups.TIERS[1], start_30d, now)

    def timed_rollup() -> float:
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            store.query_history(
                HistoryQuery(  # as the Fleet API asks for it (read_as_stored in rollups.py)
                    "gpu_1h",
                    "util_gpu_pct_mean",
                    start_30d,
                    now,
                    3600 * S,
                    "mean",
                    {"node": ["hist-node"]},
                    True,
                )
            )
            runs.append(time.perf_counter() - t0)
        return statistics.median(runs)

    return (
        timed(now - 3600 * S, 60 * S),
        timed(start_30d, 3600 * S),
        timed_rollup(),
        timed(now - 3600 * S, 5 * S),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--reports", type=int, default=10, help="reports per node for the bare writer")
    p.add_argument("--seconds", type=float, default=15.0, help="aggregator measurement window")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument(
        "--ingest-workers",
        type=int,
        default=None,
        help="the aggregator's ingest_workers (default: one per core)",
    )
    p.add_argument("--paced-nodes", type=int, default=2000, help="nodes of the paced run at 1 s (0: none)")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-influx-bench-"))
    print(f"machine: {machine()}", flush=True)
    influxd, url = start_influxd(tmp / "influx")
    try:
        bare, bare_cpu, agg, agg_cpu, paced = [], [], [], [], []
        for i in range(args.repeat):
            rate, cpu = bare_writer(url, f"bare{i}", args.nodes, args.reports, influxd.pid)
            bare.append(rate)
            bare_cpu.append(cpu)
            r = through_aggregator(
                url, f"agg{i}", min(args.nodes, 500), args.seconds, tmp, args.ingest_workers, influxd.pid
            )
            agg.append(r["points_per_s"])
            agg_cpu.append(r["influxd_cpu_s_per_million"])
            print(
                f"  run {i + 1}: bare writer {bare[-1]:,.0f} points/s (influxd {bare_cpu[-1]:.2f} CPU s per "
                f"million points), through the aggregator {agg[-1]:,.0f} points/s (influxd "
                f"{agg_cpu[-1]:.2f} CPU s per million)",
                flush=True,
            )
            if args.paced_nodes:
                r = through_aggregator(
                    url, f"paced{i}", args.paced_nodes, 20.0, tmp, args.ingest_workers, influxd.pid, "paced"
                )
                paced.append(r)
                print(
                    f"  run {i + 1}: paced {args.paced_nodes} nodes x 8 GPUs at 1 s into influxd: "
                    f"{r['acked'] / (args.paced_nodes * 20.0):.1%} acknowledged, ack p50 "
                    f"{r['ack_latency_p50_ms'] or float('nan'):.0f} ms, "
                    f"p99 {r['ack_latency_p99_ms'] or float('nan'):.0f} ms",
                    flush=True,
                )
        b, a = statistics.median(bare), statistics.median(agg)
        bc, ac = statistics.median(bare_cpu), statistics.median(agg_cpu)
        streams = min(args.nodes, 500)
        print(
            f"InfluxDB ingest ({args.nodes} nodes x 8 GPUs; aggregator driven by {streams} streams in flood "
            f"mode, ingest_workers = {args.ingest_workers or 'one per core'}): bare {b:,.0f} points/s, "
            f"aggregator {a:,.0f} points/s, ratio {a / b:.2f}; influxd CPU per million points: bare "
            f"{bc:.2f} s, through the aggregator {ac:.2f} s, ratio {ac / bc:.2f} (target <= 1.15)"
        )
        if paced:
            acked = [r["acked"] / (args.paced_nodes * 20.0) for r in paced]
            p99 = [r["ack_latency_p99_ms"] or float("nan") for r in paced]
            print(
                f"paced {args.paced_nodes} x 8 at 1 s into influxd: acknowledged "
                + ", ".join(f"{x:.1%}" for x in acked)
                + f" (runs); ack p99 {', '.join(f'{x:.0f} ms' for x in p99)}; "
                f"median p99 {statistics.median(p99):.0f} ms"
            )
        raw_1h, raw_30d, rolled_30d, raw_1h_5s = history_latency(url, "history")
        print(
            f"history, 1 node x 8 GPUs: 1 h at raw resolution (5 s, 720 points a GPU) "
            f"{raw_1h_5s * 1000:.1f} ms; "
            f"30 days at 1 h from the 1 h roll-up (720 points a GPU) {rolled_30d * 1000:.1f} ms "
            f"(ratio {rolled_30d / raw_1h_5s:.2f}, target about 1); 1 h raw at 1 min {raw_1h * 1000:.1f} ms; "
            f"the same 30 days from raw data {raw_30d * 1000:.1f} ms"
        )
    finally:
        influxd.terminate()
        influxd.wait(timeout=60)


if __name__ == "__main__":
    main()
