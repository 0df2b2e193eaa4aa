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


def test_passes_between_full_ones_recompute_only_what_can_have_changed() -> None:
    """The roll-up loop's windows (issue 57): the whole trailing windows on the first pass and
    every FULL_PASS_EVERY-th; between them the last minutes of the 1-minute tier, and the hourly
    tier only once an hour has completed since the pass before (every complete hour bucket is
    still written: the one just completed, and the one before it)."""
    hour = 3600 * 1_000_000_000
    t0 = 100 * hour + 10 * 60 * 1_000_000_000  # 10 minutes into an hour
    full = {t.name: t.lookback_s for t in rollups.TIERS}
    assert rollups.pass_lookbacks(0, t0, None) == full
    assert rollups.pass_lookbacks(1, t0 + 60 * 10**9, t0) == {"1m": rollups.RECENT_1M_S, "1h": 0}
    crossed = rollups.pass_lookbacks(2, t0 + 51 * 60 * 10**9, t0 + 49 * 60 * 10**9)
    assert crossed == {"1m": rollups.RECENT_1M_S, "1h": 2 * 3600}
    assert rollups.pass_lookbacks(rollups.FULL_PASS_EVERY, t0, t0 - 60 * 10**9) == full
    assert rollups.RECENT_1M_S >= 2 * 60, (
        "a minute's bucket is complete and rolled at least once after it ends"
    )
