"""The aggregator on a real influxd: the CLI and the Fleet API answer as on the embedded store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid

import pytest

from harness.processes import Cluster, free_port, gpufleet_argv
from harness.waiting import wait_until


@pytest.mark.slow
def test_history_nodes_and_restart_on_influxdb(cluster: Cluster, influxd: str) -> None:
    database = f"agg_{uuid.uuid4().hex[:10]}"
    store_flags = ("--store", "influxdb", "--influx-url", influxd, "--influx-database", database)
    ingest, fleet = free_port(), free_port()
    agg = cluster.aggregator("aggregator-1", ingest, fleet, None, *store_flags)
    collector = cluster.collector("influx-node", agg.ingest, "--interval-s", "0.2", "--sim-gpus", "4")
    env = {
        **os.environ,
        "GPUFLEET_FLEET": agg.fleet,
        "GPUFLEET_TOKEN": cluster.secrets.tokens["viewer"],
        "GPUFLEET_CLIENT_CONFIG": "/nonexistent",
    }

    def history() -> list[dict[str, object]]:
        r = subprocess.run(
            gpufleet_argv(
                "history", "util_gpu_pct", "--node", "influx-node", "--since", "5m", "--step", "1s", "--json"
            ),
            env=env,
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr
        series = json.loads(r.stdout)["series"]
        return series if len(series) == 4 and all(len(s["points"]) >= 2 for s in series) else []

    series = wait_until(history, 30, "history from InfluxDB")
    assert {s["tags"]["gpu"] for s in series} == {"0", "1", "2", "3"}
    assert all(0 <= p["value"] <= 100 for s in series for p in s["points"])
    collector.stop(signal.SIGTERM)
    agg.proc.stop(signal.SIGTERM)
    agg2 = cluster.aggregator("aggregator-2", ingest, fleet, None, *store_flags)
    nodes = json.loads(
        subprocess.run(gpufleet_argv("nodes", "--json"), env=env, capture_output=True, text=True).stdout
    )["nodes"]
    (node,) = nodes
    assert node["node"] == "influx-node" and len(node["gpus"]) == 4, "restored from InfluxDB after a restart"
    assert all("util_gpu_pct" in g for g in node["gpus"])
    assert agg2.proc.alive()
