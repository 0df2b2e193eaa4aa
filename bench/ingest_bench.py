"""Ingest benchmark: the aggregator against a bare gRPC stream baseline, same load, same run.

    python bench/ingest_bench.py                       # 2,000 nodes x 8 GPUs, 1 s interval
    python bench/ingest_bench.py --mode flood --nodes 200
    python bench/ingest_bench.py --repeat 3            # medians over 3 runs of each

For each target it starts the server as its own process, drives it with bench/loadgen.py
(another process), and samples the server process's CPU and RSS with psutil over the
measurement window. Prints reports/s, GPU samples/s, ack latency, CPU% (100 = one core)
and peak RSS, then the aggregator/bare ratios. Load generator and server share this
machine's cores, so read the ratios, not the absolute numbers, across machines.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path

import psutil

from gpufleet.aggregator.auth import new_secrets_file

HERE = Path(__file__).resolve().parent


def wait_for_file(path: Path, proc: subprocess.Popen[bytes], timeout_s: float) -> dict[str, object]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode} before it was ready")
        if path.exists():
            return json.loads(path.read_text())
        time.sleep(0.05)
    raise SystemExit(f"server not ready after {timeout_s}s")


def aggregator_argv(data_dir: Path, secrets: Path, ready: Path, *extra: str) -> list[str]:
    """`gpufleet aggregator run` on free loopback ports, quiet, writing a ready file."""
    return [
        sys.executable,
        "-m",
        "gpufleet.cli.main",
        "--log-level",
        "warning",
        "aggregator",
        "run",
        "--data-dir",
        str(data_dir),
        "--secrets-file",
        str(secrets),
        "--ingest-listen",
        "127.0.0.1:0",
        "--fleet-listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "",
        "--ready-file",
        str(ready),
        *extra,
    ]


class Sampler(threading.Thread):
    """Samples a process's CPU time and RSS twice a second."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.samples: list[tuple[float, float, int]] = []  # (wall, cpu seconds, rss bytes)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                t = self.proc.cpu_times()
                rss = self.proc.memory_info().rss
            except psutil.Error:
                return
            self.samples.append((time.time(), t.user + t.system, rss))
            self.stop.wait(0.5)

    def cpu_pct(self, start: float, end: float) -> float:
        window = [s for s in self.samples if start <= s[0] <= end]
        if len(window) < 2:
            return float("nan")
        return 100 * (window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0])

    def peak_rss_mib(self) -> float:
        return max((s[2] for s in self.samples), default=0) / 2**20


def run_target(target: str, args: argparse.Namespace, tmp: Path, secrets: Path, secret: str) -> dict:
    ready = tmp / f"{target}.ready.json"
    ready.unlink(missing_ok=True)
    log = open(tmp / f"{target}.log", "ab")  # noqa: SIM115 (closed below)
    if target == "bare":
        argv = [sys.executable, str(HERE / "bare_server.py"), "--ready-file", str(ready)]
    else:
        data = tmp / f"data-{time.monotonic_ns()}"
        argv = aggregator_argv(data, secrets, ready)
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        bound = wait_for_file(ready, server, 60)
        sampler = Sampler(server.pid)
        sampler.start()
        gen = subprocess.run(
            [
                sys.executable,
                str(HERE / "loadgen.py"),
                "--address",
                str(bound["ingest"]),
                "--secret",
                secret,
                "--nodes",
                str(args.nodes),
                "--gpus",
                str(args.gpus),
                "--interval",
                str(args.interval),
                "--mode",
                args.mode,
                "--seconds",
                str(args.seconds),
                "--window",
                str(args.window),
            ],
            capture_output=True,
            text=True,
            timeout=args.seconds + 300,
        )
        sampler.stop.set()
        sampler.join()
        if gen.returncode != 0:
            raise SystemExit(f"load generator failed against {target}:\n{gen.stderr[-3000:]}")
        result = json.loads(gen.stdout.strip().splitlines()[-1])
        result["cpu_pct"] = sampler.cpu_pct(result["window_wall_start"], result["window_wall_end"])
        result["peak_rss_mib"] = sampler.peak_rss_mib()
        result["reports_per_s"] = result["acked"] / result["seconds"]
        result["gpu_samples_per_s"] = result["reports_per_s"] * args.gpus
        return result
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--interval", type=float, default=1.0, help="seconds between a node's reports (paced)")
    p.add_argument("--mode", choices=["paced", "flood"], default="paced")
    p.add_argument("--window", type=int, default=32, help="unacked reports per stream in flood mode")
    p.add_argument("--seconds", type=float, default=20.0, help="measurement window per run")
    p.add_argument("--repeat", type=int, default=1, help="runs of each target; medians are reported")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
    secrets = tmp / "secrets.toml"
    new_secrets_file(secrets, [])
    secret = tomllib.loads(secrets.read_text())["collector_secret"]
    offered = args.nodes / args.interval if args.mode == "paced" else float("nan")
    print(
        f"ingest benchmark: {args.nodes} nodes x {args.gpus} GPUs, mode {args.mode}"
        + (f", {args.interval:g}s interval (offered {offered:.0f} reports/s)" if args.mode == "paced" else "")
        + f", {args.seconds:g}s window, {args.repeat} run(s) each, {os.cpu_count()} CPUs",
        flush=True,
    )
    runs: dict[str, list[dict]] = {"bare": [], "aggregator": []}
    for i in range(args.repeat):
        for target in ("bare", "aggregator"):
            r = run_target(target, args, tmp, secrets, secret)
            runs[target].append(r)
            print(
                f"  run {i + 1} {target:10s}: {r['reports_per_s']:8.0f} reports/s, "
                f"CPU {r['cpu_pct']:5.0f}%, p99 ack {r['ack_latency_p99_ms'] or float('nan'):7.1f} ms, "
                f"errors {r['error_count']}, rejected {r['rejected']}",
                flush=True,
            )
    med = {
        t: {
            k: statistics.median(r[k] for r in rs if r[k] is not None)
            for k in (
                "reports_per_s",
                "gpu_samples_per_s",
                "cpu_pct",
                "peak_rss_mib",
                "ack_latency_p50_ms",
                "ack_latency_p99_ms",
            )
        }
        for t, rs in runs.items()
    }
    print()
    print(
        f"{'':12s}{'reports/s':>12s}{'GPU samples/s':>15s}{'CPU %':>8s}{'peak RSS MiB':>14s}"
        f"{'ack p50 ms':>12s}{'ack p99 ms':>12s}"
    )
    for t, m in med.items():
        print(
            f"{t:12s}{m['reports_per_s']:12.0f}{m['gpu_samples_per_s']:15.0f}{m['cpu_pct']:8.0f}"
            f"{m['peak_rss_mib']:14.0f}{m['ack_latency_p50_ms']:12.1f}{m['ack_latency_p99_ms']:12.1f}"
        )
    a, b = med["aggregator"], med["bare"]
    print(
        f"\nratio aggregator/bare: throughput {a['reports_per_s'] / b['reports_per_s']:.2f}, "
        f"CPU {a['cpu_pct'] / b['cpu_pct']:.2f}, CPU per report "
        f"{(a['cpu_pct'] / a['reports_per_s']) / (b['cpu_pct'] / b['reports_per_s']):.2f}"
    )
    if args.mode == "paced":
        kept_up = a["reports_per_s"] >= 0.99 * offered
        print(
            f"aggregator {'kept up with' if kept_up else 'FELL BEHIND'} the offered "
            f"{offered:.0f} reports/s ({a['reports_per_s'] / offered:.1%} acknowledged in the window)"
        )
    print(f"(logs and data in {tmp})")


if __name__ == "__main__":
    main()
