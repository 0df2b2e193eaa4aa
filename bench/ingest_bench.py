"""Ingest benchmark: the aggregator against a bare gRPC stream baseline, same load, same run.

    python bench/ingest_bench.py                       # 2,000 nodes x 8 GPUs, 1 s interval
    python bench/ingest_bench.py --mode flood --nodes 200
    python bench/ingest_bench.py --repeat 3            # medians over 3 runs of each
    python bench/ingest_bench.py --repeat 3 --spin 1   # ... with one core kept busy by a spinning process
    python bench/ingest_bench.py --layouts columns     # only collectors that send columns

Each layout of the GPU samples (`--layouts columns,per-gpu`: as collectors send them by default,
and as older collectors do) is run against the bare server and the aggregator, side by side.

For each target it starts the server as its own process, drives it with bench/loadgen.py
(another process), and samples the server process's CPU and RSS with psutil over the
measurement window. Prints reports/s, GPU samples/s, ack latency, CPU% (100 = one core)
and peak RSS, then the aggregator/bare ratios. Load generator and server share this
machine's cores, so read the ratios, not the absolute numbers, across machines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from loadgen import CpuSampler, Load, drive, machine  # bench/ is on sys.path when a bench script runs

from gpufleet.aggregator.auth.tokens import new_secrets_file

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


# Every simulated node streams from this one loopback address, and flood mode sends as fast as
# acks come back: the per-peer stream limit and the per-node rates (docs/security.md), which
# protect a real fleet from one node, would measure themselves here instead of the ingest.
BENCH_LIMITS = (
    "--max-streams",
    "100000",
    "--max-streams-per-peer",
    "100000",
    "--node-reports-per-s",
    "1000000",
    "--node-bytes-per-s",
    "1e12",
)


def aggregator_argv(data_dir: Path, secrets: Path, ready: Path, *extra: str) -> list[str]:
    """`gpufleet aggregator run` on free loopback ports, quiet, writing a ready file, with the
    per-peer and per-node limits out of the way (BENCH_LIMITS)."""
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
        *BENCH_LIMITS,
        *extra,
    ]


def stop_server(server: subprocess.Popen[bytes]) -> None:
    """SIGTERM, and SIGKILL if it has not ended within 30 s."""
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()


def bench_load(args: argparse.Namespace, address: str, secret: str, columnar: bool = True) -> Load:
    """The load a bench's arguments ask for (nodes, GPUs, interval, mode, window, seconds, load
    generator processes), against address."""
    return Load(
        address=address,
        secret=secret,
        nodes=args.nodes,
        gpus=args.gpus,
        interval=args.interval,
        mode=getattr(args, "mode", "paced"),
        seconds=args.seconds,
        window=getattr(args, "window", 64),
        procs=args.loadgen_procs,
        columnar=columnar,
    )


def run_target(
    target: str, args: argparse.Namespace, tmp: Path, secrets: Path, secret: str, columnar: bool = True
) -> dict:
    ready = tmp / f"{target}.ready.json"
    ready.unlink(missing_ok=True)
    log = open(tmp / f"{target}.log", "ab")  # noqa: SIM115 (closed below)
    if target == "bare":
        argv = [sys.executable, str(HERE / "bare_server.py"), "--ready-file", str(ready)]
    else:
        data = tmp / f"data-{time.monotonic_ns()}"
        workers = () if args.ingest_workers is None else ("--ingest-workers", str(args.ingest_workers))
        argv = aggregator_argv(data, secrets, ready, *workers)
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        bound = wait_for_file(ready, server, 60)
        sampler = CpuSampler([server.pid], children=True)
        sampler.start()
        result = drive(bench_load(args, str(bound["ingest"]), secret, columnar))
        sampler.stop.set()
        sampler.join()
        result["cpu_pct"] = sampler.cpu_pct(result["window_wall_start"], result["window_wall_end"])
        result["peak_rss_mib"] = sampler.peak_rss_mib()
        start = result["window_wall_start"]
        for row in result["per_minute"]:
            lo, hi = start + 60 * row["minute"], start + 60 * (row["minute"] + 1)
            rss = [r for t, _, r in sampler.samples if lo <= t < hi]
            row["peak_rss_mib"] = max(rss) / 2**20 if rss else float("nan")
            row["cpu_pct"] = sampler.cpu_pct(lo, min(hi, result["window_wall_end"]))
        result["reports_per_s"] = result["acked"] / result["seconds"]
        result["gpu_samples_per_s"] = result["reports_per_s"] * args.gpus
        return result
    finally:
        stop_server(server)
        log.close()


def run_pair(args: argparse.Namespace, tmp: Path, secrets: Path, secret: str, label: str) -> dict[str, list]:
    """Each layout's bare and aggregator runs, interleaved run by run (a noisy minute hits all)."""
    names = [(f"{target} ({layout})", target, layout) for layout in args.layouts for target in args.targets]
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in names}
    offered = args.nodes / args.interval if args.mode == "paced" else 0.0
    for i in range(args.repeat):
        for name, target, layout in names:
            r = run_target(target, args, tmp, secrets, secret, columnar=layout == "columns")
            r["acked_fraction"] = r["acked"] / max(1, r["sent"])
            runs[name].append(r)
            print(
                f"  {label}run {i + 1} {name:22s}: {r['reports_per_s']:8.0f} reports/s"
                + (f" ({r['acked'] / (offered * args.seconds):.1%} of offered)" if offered else "")
                + f", CPU {r['cpu_pct']:5.0f}%, load generator CPU {r['loadgen_cpu_pct']:4.0f}%, "
                f"p99 ack {r['ack_latency_p99_ms'] or float('nan'):7.1f} ms, "
                f"RSS {r['peak_rss_mib']:4.0f} MiB, errors {r['error_count']}, rejected {r['rejected']}",
                flush=True,
            )
    return runs


KEYS = (
    "reports_per_s",
    "gpu_samples_per_s",
    "cpu_pct",
    "loadgen_cpu_pct",
    "peak_rss_mib",
    "ack_latency_p50_ms",
    "ack_latency_p99_ms",
)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def medians(runs: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    return {t: {k: _median([r[k] for r in rs if r[k] is not None]) for k in KEYS} for t, rs in runs.items()}


def peer_figures(args: argparse.Namespace, med: dict[str, dict[str, float]]) -> None:
    """CPU-seconds per million stored values: each target's, and a real Prometheus's scraping the
    same fleet's same seven values per GPU (bench/prom_peer.py), in the same run."""
    from prom_peer import VALUES_PER_GPU, run_peer

    every = f"every {args.interval:g} s for {args.seconds:g} s"
    print(f"peer: Prometheus scraping {args.nodes} static targets {every} ...")
    peer = run_peer(args.nodes, args.gpus, args.interval, args.seconds)

    def per_million(m: dict[str, float]) -> float:
        values_per_s = m["reports_per_s"] * args.gpus * VALUES_PER_GPU
        return (m["cpu_pct"] / 100) / (values_per_s / 1e6)

    print(
        f"  Prometheus: CPU {peer['cpu_pct']:.0f}%, {peer['values_per_s']:.0f} values/s stored, "
        f"{peer['cpu_s_per_million_values']:.2f} CPU-s per million values, "
        f"RSS {peer['peak_rss_mib']:.0f} MiB "
        f"(its static targets' server: CPU {peer['static_cpu_pct']:.0f}%, not counted)"
    )
    for name, m in med.items():
        mine = per_million(m)
        print(
            f"  {name}: {m['reports_per_s'] * args.gpus * VALUES_PER_GPU:.0f} values/s, {mine:.2f} CPU-s per "
            f"million values, ratio to Prometheus {mine / peer['cpu_s_per_million_values']:.2f}"
        )
    print()


def print_minutes(runs: dict[str, list[dict]]) -> None:
    """Each target's first run minute by minute: ack p50/p99, CPU and peak RSS, so a curve that
    climbs (a standing queue, memory that grows) shows where the whole window's figures hide it."""
    for target, rs in runs.items():
        print(f"{target}, minute by minute (run 1):")
        columns = ("minute", "acked", "ack p50 ms", "ack p99 ms", "CPU %", "peak RSS MiB")
        print("  " + "".join(f"{c:>{w}s}" for c, w in zip(columns, (6, 9, 12, 12, 8, 14), strict=True)))
        for row in rs[0]["per_minute"]:
            print(
                f"  {row['minute'] + 1:6d}{row['acked']:9d}{row['p50_ms'] or float('nan'):12.1f}"
                f"{row['p99_ms'] or float('nan'):12.1f}{row['cpu_pct']:8.0f}{row['peak_rss_mib']:14.0f}"
            )
    print()


def kept_up(runs: list[dict], offered: float, seconds: float) -> int:
    """Runs in which >= 99 % of the offered reports were acknowledged in the window."""
    return sum(1 for r in runs if r["acked"] >= 0.99 * offered * seconds)


def capacity(args: argparse.Namespace, tmp: Path, secrets: Path, secret: str) -> None:
    """The largest node count (args.gpus GPUs each) at args.interval that the aggregator keeps
    >= 99 % acknowledged in every one of args.repeat runs: doubling, then bisecting."""
    ok, bad = 0, 0
    nodes = args.nodes
    while True:
        args.nodes = nodes
        offered = nodes / args.interval
        runs = [run_target("aggregator", args, tmp, secrets, secret) for _ in range(args.repeat)]
        good = kept_up(runs, offered, args.seconds) == args.repeat
        p99 = _median([r["ack_latency_p99_ms"] or float("nan") for r in runs])
        print(
            f"  {nodes:6d} nodes ({nodes * args.gpus:6d} GPUs, offered {offered:.0f} reports/s): "
            f"{'kept up' if good else 'fell behind'} ({kept_up(runs, offered, args.seconds)} of "
            f"{args.repeat} runs >= 99 %), ack p99 {p99:.0f} ms, "
            f"CPU {_median([r['cpu_pct'] for r in runs]):.0f}%, "
            f"load generator CPU {_median([r['loadgen_cpu_pct'] for r in runs]):.0f}%",
            flush=True,
        )
        if good:
            ok = nodes
        else:
            bad = nodes
        if bad and bad - ok <= max(250, ok // 20):
            break
        nodes = nodes * 2 if not bad else (ok + bad) // 2
        if not ok and not bad:
            break
    print(
        f"\ncapacity at a {args.interval:g} s interval: {ok} nodes x {args.gpus} GPUs = "
        f"{ok * args.gpus} GPUs per box (>= 99 % acknowledged in {args.repeat} of {args.repeat} runs); "
        + (f"100,000 GPUs need {-(-100_000 // (ok * args.gpus))} such boxes" if ok else "none kept up")
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--interval", type=float, default=1.0, help="seconds between a node's reports (paced)")
    p.add_argument("--mode", choices=["paced", "flood"], default="paced")
    p.add_argument("--window", type=int, default=32, help="unacked reports per stream in flood mode")
    p.add_argument("--seconds", type=float, default=20.0, help="measurement window per run")
    p.add_argument("--repeat", type=int, default=1, help="runs of each target; medians are reported")
    p.add_argument("--loadgen-procs", type=int, default=2, help="load generator processes")
    p.add_argument(
        "--ingest-workers",
        type=int,
        default=None,
        help="the aggregator's ingest_workers (0: in one process; default: the aggregator's, one per core)",
    )
    p.add_argument(
        "--layouts",
        type=lambda s: s.split(","),
        default=["columns", "per-gpu"],
        help="GPU sample layouts to run, comma-separated: columns, per-gpu (default both)",
    )
    p.add_argument(
        "--targets",
        type=lambda s: s.split(","),
        default=["bare", "aggregator"],
        help="servers to run, comma-separated: bare, aggregator (default both; the ratios need both)",
    )
    p.add_argument(
        "--peer",
        choices=["none", "prometheus"],
        default="none",
        help="also run a real Prometheus scraping the same fleet's same values (bench/prom_peer.py) and "
        "print CPU-seconds per million stored values for both",
    )
    p.add_argument(
        "--spin",
        type=int,
        default=0,
        help="processes spinning on the CPU for the whole bench (a busy neighbour)",
    )
    p.add_argument(
        "--capacity",
        action="store_true",
        help="find the largest --nodes (from the given one up) kept >= 99%% acknowledged at --interval",
    )
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
    secrets = tmp / "secrets.toml"
    new_secrets_file(secrets, [])
    secret = tomllib.loads(secrets.read_text())["collector_secret"]
    print(f"machine: {machine()}", flush=True)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.spin)]
    if spinners:
        print(
            f"{len(spinners)} spinning process(es) keep {len(spinners)} core(s) busy throughout", flush=True
        )
    try:
        _bench(args, tmp, secrets, secret)
    finally:
        for s in spinners:
            s.kill()


def _bench(args: argparse.Namespace, tmp: Path, secrets: Path, secret: str) -> None:
    if args.capacity:
        print(
            f"capacity search: {args.gpus} GPUs a node, {args.interval:g} s interval, "
            f"{args.seconds:g} s window, {args.repeat} run(s) a size, {args.loadgen_procs} load "
            "generator processes on the same cores",
            flush=True,
        )
        capacity(args, tmp, secrets, secret)
        return
    offered = args.nodes / args.interval if args.mode == "paced" else float("nan")
    print(
        f"ingest benchmark: {args.nodes} nodes x {args.gpus} GPUs, mode {args.mode}"
        + (f", {args.interval:g}s interval (offered {offered:.0f} reports/s)" if args.mode == "paced" else "")
        + f", {args.seconds:g}s window, {args.repeat} run(s) each, "
        f"{args.loadgen_procs} load generator processes on the same cores, ingest_workers = "
        f"{'the default (one per core)' if args.ingest_workers is None else args.ingest_workers}",
        flush=True,
    )
    runs = run_pair(args, tmp, secrets, secret, "")
    med = medians(runs)
    print()
    print(
        f"{'':24s}{'reports/s':>12s}{'GPU samples/s':>15s}{'CPU %':>8s}{'loadgen %':>11s}"
        f"{'peak RSS MiB':>14s}{'ack p50 ms':>12s}{'ack p99 ms':>12s}"
    )
    for t, m in med.items():
        print(
            f"{t:24s}{m['reports_per_s']:12.0f}{m['gpu_samples_per_s']:15.0f}{m['cpu_pct']:8.0f}"
            f"{m['loadgen_cpu_pct']:11.0f}{m['peak_rss_mib']:14.0f}{m['ack_latency_p50_ms']:12.1f}"
            f"{m['ack_latency_p99_ms']:12.1f}"
        )
    print()
    if args.seconds >= 120:
        print_minutes(runs)
    if args.peer == "prometheus":
        peer_figures(args, med)
    for layout in args.layouts if set(args.targets) == {"bare", "aggregator"} else ():
        a, b = med[f"aggregator ({layout})"], med[f"bare ({layout})"]
        print(
            f"{layout}: ratio aggregator/bare (medians): throughput "
            f"{a['reports_per_s'] / b['reports_per_s']:.2f}, "
            f"CPU {a['cpu_pct'] / b['cpu_pct']:.2f}, CPU per report "
            f"{(a['cpu_pct'] / a['reports_per_s']) / (b['cpu_pct'] / b['reports_per_s']):.2f}"
        )
        if args.mode == "paced":
            n = kept_up(runs[f"aggregator ({layout})"], offered, args.seconds)
            p99 = [r["ack_latency_p99_ms"] for r in runs[f"aggregator ({layout})"]]
            print(
                f"  aggregator kept >= 99 % of the offered {offered:.0f} reports/s acknowledged in {n} of "
                f"{args.repeat} runs (median {a['reports_per_s'] / offered:.1%}); ack p99 per run: "
                + ", ".join(f"{x:.0f} ms" if x is not None else "-" for x in p99)
            )
    print(f"(logs and data in {tmp})")


if __name__ == "__main__":
    main()
