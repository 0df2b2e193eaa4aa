"""Unauthenticated /metrics scrapers against ingest: does scraping slow anyone's acks?

    python bench/metrics_scrape_bench.py                          # 2,000 nodes x 8 GPUs at 1 s, 16 scrapers
    python bench/metrics_scrape_bench.py --cost-nodes 20000          # one exposition's CPU at 20,000 nodes
    python bench/metrics_scrape_bench.py --settings 0/0,5/10 --repeat 3

For each /metrics setting (`--settings`, SNAPSHOT_S/SCRAPES_PER_S: 0/0 computes the exposition
for every scrape, unpaced, as before the snapshot; 5/10 is what ships, metrics_snapshot_s and
metrics_max_scrapes_per_s) it drives the same fleet with bench/loadgen.py into two fresh
aggregators (each its own process, repair on with the `none` backend, so /metrics carries the
GPU-health and pool families): one quiet, one with `--scrapers` threads GETting /metrics back
to back for the whole window. It prints, per setting, the fleet's ack p50/p99 quiet and
scraped and their ratio, scrapes answered per second, the median and p99 time of one scrape,
how many times the aggregator computed the exposition (its
gpufleet_metrics_snapshots_computed_total), and the aggregator's CPU in each phase. Loads,
scrapers and server share this machine's cores: read the ratios (docs/benchmarks.md "/metrics
under ingest")."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import threading
import time
import tomllib
import urllib.request
from pathlib import Path

from ingest_bench import (  # bench/ is on sys.path when a bench script runs
    aggregator_argv,
    bench_load,
    stop_server,
    wait_for_file,
)
from loadgen import CpuSampler, drive, machine

from gpufleet.aggregator.auth.tokens import new_secrets_file


class Scrapers:
    """n threads GETting url back to back until stopped; each scrape's wall time."""

    def __init__(self, url: str, n: int) -> None:
        self.url = url
        self.times_s: list[float] = []
        self.errors = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(n)]

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.perf_counter()
            try:
                urllib.request.urlopen(self.url, timeout=30).read()
            except OSError:
                self.errors += 1
                continue
            self.times_s.append(time.perf_counter() - start)

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            if t.ident is not None:  # started
                t.join(60)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def computed_total(metrics: str) -> float:
    text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=60).read().decode()
    line = next(x for x in text.splitlines() if x.startswith("gpufleet_metrics_snapshots_computed_total "))
    return float(line.split()[1])


def run_phase(
    args: argparse.Namespace, tmp: Path, secrets: Path, secret: str, setting: str, scraped: bool
) -> dict:
    """One phase on an aggregator of its own (a second load on the same aggregator is slower
    whatever else happens: a control run with no scraper measured its p99 8x the first's)."""
    snapshot_s, per_s = (float(x) for x in setting.split("/"))
    ready = tmp / f"agg-{time.monotonic_ns()}.ready.json"
    argv = aggregator_argv(tmp / f"data-{time.monotonic_ns()}", secrets, ready, "--ingest-workers", "0")
    at = argv.index("--metrics-listen")
    argv[at + 1] = "127.0.0.1:0"
    argv += ["--metrics-snapshot-s", str(snapshot_s), "--metrics-max-scrapes-per-s", str(per_s)]
    argv += ["--repair-interval-s", "5"]
    with open(tmp / f"agg-{snapshot_s}.log", "ab") as log:
        server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            bound = wait_for_file(ready, server, 60)
            sampler = CpuSampler([server.pid], children=True)
            sampler.start()
            scrapers = Scrapers(f"http://{bound['metrics']}/metrics", args.scrapers if scraped else 0)
            before = computed_total(str(bound["metrics"]))
            scrapers.start()
            result = drive(bench_load(args, str(bound["ingest"]), secret))
            scrapers.stop()
            computed = computed_total(str(bound["metrics"])) - before - 1
            sampler.stop.set()
            sampler.join()
            return {
                "ack_p50_ms": result["ack_latency_p50_ms"],
                "ack_p99_ms": result["ack_latency_p99_ms"],
                "acked_pct": 100 * result["acked"] / max(1, result["sent"]),
                "cpu_pct": sampler.cpu_pct(result["window_wall_start"], result["window_wall_end"]),
                "scrapes": len(scrapers.times_s),
                "scrape_errors": scrapers.errors,
                "scrape_median_ms": 1000 * _pct(scrapers.times_s, 0.5),
                "scrape_p99_ms": 1000 * _pct(scrapers.times_s, 0.99),
                "computed": computed,
                "window_s": result["seconds"],
            }
        finally:
            stop_server(server)


def run_setting(args: argparse.Namespace, tmp: Path, secrets: Path, secret: str, setting: str) -> dict:
    """The quiet phase and the scraped one, each on a fresh aggregator."""
    return {
        "setting": setting,
        "quiet": run_phase(args, tmp, secrets, secret, setting, scraped=False),
        "scraped": run_phase(args, tmp, secrets, secret, setting, scraped=True),
    }


def cost_per_scrape(nodes: int, gpus: int, repeat: int) -> None:
    """The CPU of one /metrics exposition with `nodes` nodes in the live view (put there directly,
    not over streams: this measures the exposition, not ingest), after one full repair pass."""
    import asyncio
    import threading

    from prometheus_client import generate_latest

    from gpufleet.aggregator.config import AggregatorConfig
    from gpufleet.aggregator.server import Aggregator
    from gpufleet.protos import ingest_pb2, telemetry_pb2

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        new_secrets_file(tmp / "secrets.toml", [])
        config = AggregatorConfig(
            data_dir=str(tmp / "data"),
            secrets_file=str(tmp / "secrets.toml"),
            ingest_listen="127.0.0.1:0",
            fleet_listen="127.0.0.1:0",
            metrics_listen="",
            ingest_workers=0,
            repair_interval_s=60,
        )
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()

        async def start() -> Aggregator:
            agg = Aggregator(config)
            await agg.start()
            agg.run_background(asyncio.Event())
            return agg

        agg = asyncio.run_coroutine_threadsafe(start(), loop).result(60)

        def feed() -> None:
            now = time.time_ns()
            for n in range(nodes):
                node = f"node-{n:05d}"
                idents = [
                    telemetry_pb2.GpuIdentity(index=i, uuid=f"GPU-{node}-{i}", model="H100")
                    for i in range(gpus)
                ]
                agg.fleet.on_hello(
                    ingest_pb2.Hello(node=node, cluster="c", boot_id="b", interval_s=1.0, gpus=idents), now
                )
                report = telemetry_pb2.NodeReport(
                    node=node, cluster="c", boot_id="b", seq=1, time_unix_ns=now
                )
                for i in range(gpus):
                    report.gpus.add(
                        index=i, uuid=f"GPU-{node}-{i}", model="H100", util_gpu_pct=50.0, temp_gpu_c=50.0
                    )
                agg.fleet.on_report(report, now)

        loop.call_soon_threadsafe(feed)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            controller = agg.repair.controller
            if controller is not None and len(controller.last_snapshots) == nodes:
                break
            time.sleep(0.5)  # polling the pass's progress, with a deadline
        else:
            raise SystemExit(f"no full repair pass over {nodes} nodes within 600 s")
        times = []
        for _ in range(repeat):
            start_cpu = time.process_time()
            body = generate_latest(agg.metrics.registry)
            times.append(time.process_time() - start_cpu)
        print(
            f"{nodes} nodes x {gpus} GPUs: one /metrics exposition, median of {repeat}: "
            f"{1000 * statistics.median(times):.0f} ms of CPU, {len(body) / 1024:.0f} KiB"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--seconds", type=float, default=30.0, help="each phase's measurement window")
    p.add_argument("--scrapers", type=int, default=16)
    p.add_argument(
        "--settings", default="0/0,5/10", help="SNAPSHOT_S/SCRAPES_PER_S pairs to compare (0/0: as before)"
    )
    p.add_argument("--repeat", type=int, default=1, help="runs of each setting; medians are printed")
    p.add_argument("--loadgen-procs", type=int, default=2)
    p.add_argument(
        "--cost-nodes",
        type=int,
        default=0,
        help="only the CPU of one exposition at this many nodes (in-process)",
    )
    args = p.parse_args()
    print(machine())
    if args.cost_nodes:
        cost_per_scrape(args.cost_nodes, args.gpus, max(5, args.repeat))
        return
    print(
        f"{args.nodes} nodes x {args.gpus} GPUs every {args.interval:g} s, {args.seconds:g} s a phase, "
        f"{args.scrapers} scrapers in the scraped phase"
    )
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        secrets = tmp / "secrets.toml"
        new_secrets_file(secrets, [])
        secret = tomllib.loads(secrets.read_text())["collector_secret"]
        settings = args.settings.split(",")
        runs: dict[str, list[dict]] = {s: [] for s in settings}
        for _ in range(args.repeat):
            for s in settings:  # interleaved: a noisy minute hits every setting
                runs[s].append(run_setting(args, tmp, secrets, secret, s))

    def med(s: str, phase: str, key: str) -> float:
        values = [r[phase][key] for r in runs[s] if r[phase][key] == r[phase][key]]  # NaN: none
        return statistics.median(values) if values else float("nan")

    print(
        f"\n{'snap/pace':>10} {'quiet p50':>10} {'quiet p99':>10} {'scraped p50':>12} {'scraped p99':>12} "
        f"{'p99 ratio':>9} {'scrapes/s':>9} {'scrape med':>10} {'scrape p99':>10} {'computed':>8} "
        f"{'CPU quiet':>9} {'CPU scraped':>11}"
    )
    for s in settings:
        quiet, scraped = med(s, "quiet", "ack_p99_ms"), med(s, "scraped", "ack_p99_ms")
        print(
            f"{s:>10} {med(s, 'quiet', 'ack_p50_ms'):>8.0f}ms {quiet:>8.0f}ms "
            f"{med(s, 'scraped', 'ack_p50_ms'):>10.0f}ms {scraped:>10.0f}ms {scraped / quiet:>8.2f}x "
            f"{med(s, 'scraped', 'scrapes') / args.seconds:>9.1f} "
            f"{med(s, 'scraped', 'scrape_median_ms'):>8.1f}ms "
            f"{med(s, 'scraped', 'scrape_p99_ms'):>8.0f}ms {med(s, 'scraped', 'computed'):>8.0f} "
            f"{med(s, 'quiet', 'cpu_pct'):>8.0f}% {med(s, 'scraped', 'cpu_pct'):>10.0f}%"
        )
    print(
        "\nack p50/p99: every node's acks in the phase (ms); p99 ratio: scraped / quiet (the bar: ≤ 2x); "
        "scrape med/p99: one GET's wall time (pacing's wait included); computed: expositions the "
        "aggregator computed in the phase; CPU: the aggregator's, 100 % = one core"
    )
    for s in settings:
        for r in runs[s]:
            for phase in ("quiet", "scraped"):
                if r[phase]["acked_pct"] < 99.0 or r[phase]["scrape_errors"]:
                    print(f"note: setting {s}, {phase}: {r[phase]}")


if __name__ == "__main__":
    main()
