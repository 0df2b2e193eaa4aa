"""Fleet-scale history on the embedded store: a grouped query against the per-series one and
against the per-series SQL the store ran before group_by existed (the baseline, in the same run).

    python bench/history_group_bench.py                  # 200 nodes x 8 GPUs, 1 h of 10 s samples
    python bench/history_group_bench.py --nodes 1000 --repeat 5

Each query reads util_gpu_pct over the whole hour at a 60 s step (what the history explorer asks
for an hour). Printed: the median of --repeat runs of each, the series returned, and the ratios
to the baseline:
- baseline: the store's per-series query as it was before group_by (`series_id IN json_each(...)`,
  GROUP BY series and bucket, and its loop building the series), run beside the store;
- per-series: `query_history` without group_by (the same answer through the new SQL);
- grouped by cluster / by node: `query_history` with group_by (4 / N series back).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from loadgen import machine  # bench/ is on sys.path when a bench script runs

from gpufleet.aggregator.store import EmbeddedStore, HistoryQuery, Point, Series
from gpufleet.protos import fleet_pb2

S = 1_000_000_000
CLUSTERS = ("east", "west", "north", "south")


def fill(store: EmbeddedStore, nodes: int, gpus: int, samples: int, start: int) -> int:
    written = 0
    for n in range(nodes):
        cluster = CLUSTERS[n % len(CLUSTERS)]
        points = []
        for g in range(gpus):
            tags = {
                "node": f"node-{n:04d}",
                "gpu": str(g),
                "uuid": f"GPU-{n}-{g}",
                "model": "H100",
                "cluster": cluster,
            }
            for i in range(samples):
                points.append(
                    Point("gpu", tags, {"util_gpu_pct": float((n + g * 7 + i * 3) % 100)}, start + i * 10 * S)
                )
        store.write(points)
        written += len(points)
    return written


def baseline(conn: sqlite3.Connection, start: int, end: int, step: int) -> int:
    """The per-series query_history as the store ran it before group_by (its SQL and its loop
    building the series), on a reader connection of its own to the same file, kept open like the
    store's. Kept here, not in the store."""
    tags = {
        sid: dict(json.loads(t))
        for sid, t in conn.execute("SELECT id, tags FROM series WHERE measurement = 'gpu'")
    }
    rows = conn.execute(
        f"SELECT series_id, ts / {step}, AVG(util_gpu_pct) FROM m_gpu WHERE series_id IN "
        "(SELECT value FROM json_each(?)) AND ts >= ? AND ts < ? AND util_gpu_pct IS NOT NULL "
        "GROUP BY 1, 2 ORDER BY 1, 2",
        (json.dumps(list(tags)), start, end),
    ).fetchall()
    out: dict[int, Series] = {}
    for sid, bucket, value in rows:
        series = out.get(sid)
        if series is None:
            series = out[sid] = Series(dict(tags[sid]), [], [])
        series.times_unix_ns.append(bucket * step)
        series.values.append(float(value))
    return len(sorted(out.values(), key=lambda s: sorted(s.tags.items())))


def timed(fn, repeat: int) -> tuple[float, int]:
    times, n = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--samples", type=int, default=360, help="10 s samples per GPU (360: one hour)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "store.sqlite3"
        store = EmbeddedStore(path, retention_s=86400 * 30, synchronous="OFF")
        start = int(time.time()) // 3600 * 3600 * S - 3600 * S
        t0 = time.perf_counter()
        written = fill(store, args.nodes, args.gpus, args.samples, start)
        print(
            f"store: {args.nodes} nodes x {args.gpus} GPUs x {args.samples} samples = {written:,} points "
            f"(written in {time.perf_counter() - t0:.1f} s)"
        )
        end, step = start + args.samples * 10 * S, 60 * S

        def query(*group_by: str) -> int:
            q = HistoryQuery("gpu", "util_gpu_pct", start, end, step, "mean", {}, group_by=group_by)
            return len(store.query_history(q))

        def wire_bytes(*group_by: str) -> int:
            """What the Fleet API would send the dashboard for the answer."""
            q = HistoryQuery("gpu", "util_gpu_pct", start, end, step, "mean", {}, group_by=group_by)
            return fleet_pb2.HistoryResponse(
                series=[
                    fleet_pb2.Series(tags=s.tags, times_unix_ns=s.times_unix_ns, values=s.values)
                    for s in store.query_history(q)
                ]
            ).ByteSize()

        conn = sqlite3.connect(path)
        store.query_history(HistoryQuery("gpu", "util_gpu_pct", start, end, step))  # warm the caches
        baseline(conn, start, end, step)
        rows = [
            ("baseline (old per-series SQL)", *timed(lambda: baseline(conn, start, end, step), args.repeat)),
            ("per-series (no group_by)", *timed(query, args.repeat)),
            ("grouped by cluster", *timed(lambda: query("cluster"), args.repeat)),
            ("grouped by node", *timed(lambda: query("node"), args.repeat)),
            (
                "p95 grouped by cluster",
                *timed(
                    lambda: len(
                        store.query_history(
                            HistoryQuery(
                                "gpu", "util_gpu_pct", start, end, step, "p95", {}, group_by=("cluster",)
                            )
                        )
                    ),
                    args.repeat,
                ),
            ),
        ]
        base = rows[0][1]
        print(f"{'query':32} {'median s':>9} {'series':>7} {'vs baseline':>12}")
        for name, seconds, series in rows:
            print(f"{name:32} {seconds:9.3f} {series:7d} {seconds / base:11.2f}x")
        each, grouped = wire_bytes(), wire_bytes("cluster")
        print(
            f"Fleet API answer: {each:,} bytes per series, {grouped:,} grouped by cluster "
            f"({each / grouped:.0f}x less)"
        )
        conn.close()
        store.close()


if __name__ == "__main__":
    main()
