"""Unauthenticated /metrics scrapers against ingest: does scraping slow anyone's acks?

    python bench/metrics_scrape_bench.py                          # 2,000 nodes x 8 GPUs at 1 s, 16 scrapers
    python bench/metrics_scrape_bench.py --nodes 20000 --interval 10 --seconds 30   # the cost at 20,000 nodes
    python bench/metrics_scrape_bench.py --snapshots 0,5 --repeat 3

For each /metrics snapshot age (`--snapshots`: 0 computes the exposition for every scrape; 5 is
the shipped metrics_snapshot_s) it starts one aggregator (its own process, repair on with the
`none` backend, so /metrics carries the GPU-health and pool families) and drives the same fleet
twice with bench/loadgen.py: once quiet, once with `--scrapers` threads GETting /metrics
back to back for the whole window. It prints, per setting, the fleet's ack p50/p99 quiet and
scraped and their ratio, scrapes answered per second, the median and p99 time of one scrape,
how many scrapes computed the exposition (the aggregator's own count is not exported; a scrape
that took over 5 ms is counted as one that computed it), and the aggregator's CPU in each
phase. Loads, scrapers and server share this machine's cores: read the ratios (docs/benchmarks.md
"/metrics under ingest")."""

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


def run_setting(args: argparse.Namespace, tmp: Path, secrets: Path, secret: str, snapshot_s: float) -> dict:
    ready = tmp / f"agg-{snapshot_s}.ready.json"
    ready.unlink(missing_ok=True)
    argv = aggregator_argv(tmp / f"data-{time.monotonic_ns()}", secrets, ready, "--ingest-workers", "0")
    at = argv.index("--metrics-listen")
    argv[at + 1] = "127.0.0.1:0"
    argv += ["--metrics-snapshot-s", str(snapshot_s), "--repair-interval-s", "5"]
    with open(tmp / f"agg-{snapshot_s}.log", "ab") as log:
        server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            bound = wait_for_file(ready, server, 60)
            load = bench_load(args, str(bound["ingest"]), secret)
            out: dict = {"snapshot_s": snapshot_s}
            for phase in ("quiet", "scraped"):
                sampler = CpuSampler([server.pid], children=True)
                sampler.start()
                scrapers = Scrapers(f"http://{bound['metrics']}/metrics", args.scrapers)
                if phase == "scraped":
                    scrapers.start()
                result = drive(load)
                scrapers.stop()
                sampler.stop.set()
                sampler.join()
                out[phase] = {
                    "ack_p50_ms": result["ack_latency_p50_ms"],
                    "ack_p99_ms": result["ack_latency_p99_ms"],
                    "acked_pct": 100 * result["acked"] / max(1, result["sent"]),
                    "cpu_pct": sampler.cpu_pct(result["window_wall_start"], result["window_wall_end"]),
                    "scrapes": len(scrapers.times_s),
                    "scrape_errors": scrapers.errors,
                    "scrape_median_ms": 1000 * _pct(scrapers.times_s, 0.5),
                    "scrape_p99_ms": 1000 * _pct(scrapers.times_s, 0.99),
                    "computed": sum(1 for t in scrapers.times_s if t > 0.005),
                    "window_s": result["seconds"],
                }
            return out
        finally:
            stop_server(server)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--seconds", type=float, default=30.0, help="each phase's measurement window")
    p.add_argument("--scrapers", type=int, default=16)
    p.add_argument("--snapshots", default="0,5", help="metrics_snapshot_s settings to compare")
    p.add_argument("--repeat", type=int, default=1, help="runs of each setting; medians are printed")
    p.add_argument("--loadgen-procs", type=int, default=2)
    args = p.parse_args()
    print(machine())
    print(
        f"{args.nodes} nodes x {args.gpus} GPUs every {args.interval:g} s, {args.seconds:g} s a phase, "
        f"{args.scrapers} scrapers in the scraped phase"
    )
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        secrets = tmp / "secrets.toml"
        new_secrets_file(secrets, [])
        secret = tomllib.loads(secrets.read_text())["collector_secret"]
        settings = [float(s) for s in args.snapshots.split(",")]
        runs: dict[float, list[dict]] = {s: [] for s in settings}
        for _ in range(args.repeat):
            for s in settings:  # interleaved: a noisy minute hits every setting
                runs[s].append(run_setting(args, tmp, secrets, secret, s))

    def med(s: float, phase: str, key: str) -> float:
        values = [r[phase][key] for r in runs[s] if r[phase][key] == r[phase][key]]  # NaN: none
        return statistics.median(values) if values else float("nan")

    print(
        f"\n{'snapshot s':>10} {'quiet p50':>10} {'quiet p99':>10} {'scraped p50':>12} {'scraped p99':>12} "
        f"{'p99 ratio':>9} {'scrapes/s':>9} {'scrape med':>10} {'scrape p99':>10} {'computed':>8} "
        f"{'CPU quiet':>9} {'CPU scraped':>11}"
    )
    for s in settings:
        quiet, scraped = med(s, "quiet", "ack_p99_ms"), med(s, "scraped", "ack_p99_ms")
        print(
            f"{s:>10g} {med(s, 'quiet', 'ack_p50_ms'):>8.0f}ms {quiet:>8.0f}ms "
            f"{med(s, 'scraped', 'ack_p50_ms'):>10.0f}ms {scraped:>10.0f}ms {scraped / quiet:>8.2f}x "
            f"{med(s, 'scraped', 'scrapes') / args.seconds:>9.1f} "
            f"{med(s, 'scraped', 'scrape_median_ms'):>8.1f}ms "
            f"{med(s, 'scraped', 'scrape_p99_ms'):>8.0f}ms {med(s, 'scraped', 'computed'):>8.0f} "
            f"{med(s, 'quiet', 'cpu_pct'):>8.0f}% {med(s, 'scraped', 'cpu_pct'):>10.0f}%"
        )
    print(
        "\nack p50/p99: every node's acks in the phase (ms); p99 ratio: scraped / quiet (the bar: ≤ 2x); "
        "scrape med/p99: one GET's wall time; computed: scrapes slower than 5 ms (those that computed "
        "the exposition rather than read the snapshot); CPU: the aggregator's, 100 % = one core"
    )
    for s in settings:
        for r in runs[s]:
            for phase in ("quiet", "scraped"):
                if r[phase]["acked_pct"] < 99.0 or r[phase]["scrape_errors"]:
                    print(f"note: snapshot {s:g} s, {phase}: {r[phase]}")


if __name__ == "__main__":
    main()
