"""Long history queries answered from roll-ups, through the real aggregator and CLI."""

from __future__ import annotations

import json
import os
import subprocess
import time

from gpufleet.aggregator.fleet import rollups
from gpufleet.aggregator.store import EmbeddedStore, Point
from harness.processes import Cluster, gpufleet_argv

S = 1_000_000_000


def test_a_5_day_query_reads_the_hourly_rollup_and_p95_reads_raw(cluster: Cluster) -> None:
    data = cluster.tmp / "data"
    store = EmbeddedStore(data / "store.sqlite3", retention_s=14 * 86400)
    now = time.time_ns()
    start = (now - 5 * 86400 * S) // (3600 * S) * 3600 * S
    # Five days of one GPU at a 5-minute interval, util cycling 0..99, written before the
    # aggregator starts, and its roll-ups built as the aggregator would.
    store.write(
        [
            Point(
                "gpu",
                {"node": "old-node", "gpu": "0", "cluster": "c"},
                {"util_gpu_pct": float(i % 100)},
                start + i * 300 * S,
            )
            for i in range(5 * 288)
        ]
    )
    rollups.run_once(store, now, {"1m": 5 * 86400, "1h": 5 * 86400})
    store.close()
    agg = cluster.aggregator("aggregator", 0, 0, data)
    env = {
        **os.environ,
        "GPUFLEET_FLEET": agg.fleet,
        "GPUFLEET_TOKEN": cluster.secrets.tokens["viewer"],
        "GPUFLEET_CLIENT_CONFIG": "/nonexistent",
    }

    def history(*extra: str) -> dict[str, object]:
        r = subprocess.run(
            gpufleet_argv("history", "util_gpu_pct", "--node", "old-node", "--since", "5d", "--json", *extra),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    hourly = history("--step", "1h")
    assert hourly["source"] == "gpu_1h"
    points = hourly["series"][0]["points"]
    assert len(points) >= 100 and all(0 <= p["value"] <= 99 for p in points)
    # Each hour holds 12 samples i%100: the mean of the bucket means is the raw mean here.
    raw = history("--step", "1h", "--agg", "p95")
    assert raw["source"] == "gpu", "p95 cannot come from a roll-up"
    assert history("--step", "1h", "--agg", "max")["series"][0]["points"][0]["value"] <= 99
