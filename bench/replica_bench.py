"""Ingest through aggregator replicas sharing one PostgreSQL control plane and one InfluxDB,
all on this box, with a real influxd and a real PostgreSQL started for the run.

    python bench/replica_bench.py                  # 200 nodes x 8 GPUs, flood, 15 s windows
    python bench/replica_bench.py --repeat 3

Three configurations, each in the same run, each driven by bench/loadgen.py in flood mode
(every stream keeps `--window` reports in flight):

1. one box: one aggregator, the SQLite control plane (the baseline);
2. one replica: the same aggregator with the PostgreSQL control plane (its live view, the
   lease, heartbeats: what replicas cost one aggregator);
3. two replicas: two aggregators on the same PostgreSQL and InfluxDB, the load's nodes split
   between them.

Prints acknowledged reports/s, the ratio to the baseline, PostgreSQL's committed transactions
and rows written per second (pg_stat_database over the window), the rows written per report,
and the CPU of aggregators, load generators, influxd and PostgreSQL (100 = one core). From the
per-replica figures it projects the replicas and the PostgreSQL write rate 100,000 GPUs at a
10 s interval need. On a box with two cores every process here shares them: more replicas on
the same box cannot add cores, the projection assumes a replica per box.
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from influx_bench import start_influxd  # bench/ is on sys.path when a bench script runs
from ingest_bench import aggregator_argv, wait_for_file
from loadgen import CpuSampler, Load, drive, machine

from gpufleet.aggregator.auth.tokens import new_secrets_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from pg_harness import PostgresServer

GPUS_PER_NODE = 8


def pg_counters(url: str) -> tuple[int, int]:
    """(transactions committed, rows inserted + updated + deleted) of the database so far."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        row = conn.execute(
            "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted FROM pg_stat_database "
            "WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def run_config(
    label: str, replicas: int, control_plane: str, args: argparse.Namespace, tmp: Path, influx_url: str
) -> dict[str, Any]:
    secrets = tmp / "secrets.toml"
    if not secrets.exists():
        new_secrets_file(secrets, [])
    secret = tomllib.loads(secrets.read_text())["collector_secret"]
    database = f"bench_{time.time_ns()}"
    procs, addresses = [], []
    try:
        for i in range(replicas):
            ready = tmp / f"{label}-{i}.ready.json"
            ready.unlink(missing_ok=True)  # a file of an earlier run names a port long closed
            procs.append(
                subprocess.Popen(
                    aggregator_argv(
                        tmp / f"data-{label}-{i}-{time.monotonic_ns()}",
                        secrets,
                        ready,
                        "--store",
                        "influxdb",
                        "--influx-url",
                        influx_url,
                        "--influx-database",
                        database,
                        "--ingest-workers",
                        str(args.ingest_workers),
                        "--control-plane",
                        control_plane,
                        "--replica-id",
                        f"bench-{i}",
                    )
                )
            )
            addresses.append(str(wait_for_file(ready, procs[-1], 60)["ingest"]))
        servers = CpuSampler([p.pid for p in procs], children=True)
        servers.start()
        before = pg_counters(control_plane) if control_plane != "sqlite" else (0, 0)
        started = time.time()
        result = drive(
            Load(
                address=",".join(addresses),
                secret=secret,
                nodes=args.nodes,
                gpus=GPUS_PER_NODE,
                mode="flood",
                window=args.window,
                seconds=args.seconds,
            )
        )
        after = pg_counters(control_plane) if control_plane != "sqlite" else (0, 0)
        span_s = time.time() - started  # the counters cover connect, warm-up and drain too
        servers.stop.set()
        servers.join()
        w0, w1 = result["window_wall_start"], result["window_wall_end"]
        acked_per_s = result["acked"] / result["seconds"]
        return {
            "reports_per_s": acked_per_s,
            "pg_commits_per_s": (after[0] - before[0]) / span_s,
            "pg_rows_per_s": (after[1] - before[1]) / span_s,
            "aggregator_cpu_pct": servers.cpu_pct(w0, w1),
            "loadgen_cpu_pct": result["loadgen_cpu_pct"],
            "p99_ms": result["ack_latency_p99_ms"],
            "errors": result["error_count"],
        }
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=200)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--window", type=int, default=16, help="reports in flight per stream (flood)")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--ingest-workers", type=int, default=0, help="each aggregator's ingest_workers")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-replica-bench-"))
    print(f"machine: {machine()}", flush=True)
    influxd, influx_url = start_influxd(tmp / "influx")
    pg = PostgresServer()
    pg.start()
    others = CpuSampler([influxd.pid, pg.proc.pid if pg.proc else 0], children=True)
    others.start()
    configs = [("one-box", 1, "sqlite"), ("1-replica", 1, ""), ("2-replicas", 2, "")]
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in configs}
    try:
        for i in range(args.repeat):
            for label, replicas, cp in configs:
                url = cp or pg.new_database()
                t0 = time.time()
                r = run_config(label, replicas, url, args, tmp, influx_url)
                r["db_cpu_pct"] = others.cpu_pct(t0, time.time())
                runs[label].append(r)
                print(
                    f"  run {i + 1} {label}: {r['reports_per_s']:,.0f} reports/s acked, "
                    f"p99 {r['p99_ms']} ms, "
                    f"PostgreSQL {r['pg_commits_per_s']:,.0f} commits/s {r['pg_rows_per_s']:,.0f} rows/s, "
                    f"aggregators {r['aggregator_cpu_pct']:.0f} %, load {r['loadgen_cpu_pct']:.0f} %, "
                    f"influxd+postgres {r['db_cpu_pct']:.0f} %",
                    flush=True,
                )
    finally:
        others.stop.set()
        pg.cleanup()
        influxd.terminate()
        influxd.wait(timeout=60)

    def med(label: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[label])

    base = med("one-box", "reports_per_s")
    print(
        f"\nflood, {args.nodes} nodes x {GPUS_PER_NODE} GPUs, {args.window} in flight per stream, "
        f"medians of {args.repeat}:"
    )
    for label, _, _ in configs:
        rps = med(label, "reports_per_s")
        rows = med(label, "pg_rows_per_s")
        print(
            f"  {label:10s} {rps:8,.0f} reports/s  ratio {rps / base:.2f}  "
            f"PostgreSQL {med(label, 'pg_commits_per_s'):6,.0f} commits/s {rows:7,.0f} rows/s "
            f"({rows / rps if rps else 0:.2f} rows a report)  "
            f"aggregator CPU {med(label, 'aggregator_cpu_pct'):.0f} %"
        )
    per_replica = med("1-replica", "reports_per_s")
    # A replica writes one live-view row per node that reported since its last sync (live_sync_s,
    # 1 s by default), plus its heartbeat and the lease: under flood every node reports in every
    # sync, so rows/s over (nodes / live_sync_s) is what one node's sync costs, measured.
    rows_per_node_sync = med("1-replica", "pg_rows_per_s") / args.nodes
    nodes_needed = 100_000 / GPUS_PER_NODE
    need = nodes_needed / 10.0  # reports/s for 100,000 GPUs at a 10 s interval
    print(
        f"projection for 100,000 GPUs ({nodes_needed:,.0f} nodes) at a 10 s interval "
        f"({need:,.0f} reports/s): "
        f"{math.ceil(need / per_replica)} replica(s) at the flood ceiling of one replica here "
        f"({per_replica:,.0f} reports/s; give each its own box and keep headroom), and PostgreSQL "
        f"about {need * rows_per_node_sync:,.0f} rows/s written (each node's row once per report at a "
        f"10 s interval; {rows_per_node_sync:.2f} rows per node per sync, measured)"
    )


if __name__ == "__main__":
    main()
