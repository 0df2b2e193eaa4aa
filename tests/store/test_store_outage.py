"""Zero-loss delivery through store outages, against a real influxd that is killed and
restarted: the aggregator spools to disk, keeps acknowledging, and drains in order."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from typing import Any

import pytest

from gpufleet.aggregator.store.influx import InfluxStore
from harness.influx import InfluxServer
from harness.processes import Cluster, Proc, free_port, gpufleet_argv
from harness.waiting import wait_until

NODES = ["spool-node-1", "spool-node-2", "spool-node-3"]


def seqs(url: str, database: str, node: str) -> list[int]:
    store = InfluxStore(url, database, create_database=False)
    try:
        return [
            int(p.fields["seq"])
            for p in store.query_points("collector", 0, time.time_ns() + 10**12, {"node": [node]})
        ]
    finally:
        store.close()


def status(agg_fleet: str, token: str) -> dict[str, object]:
    env = {
        **os.environ,
        "GPUFLEET_FLEET": agg_fleet,
        "GPUFLEET_TOKEN": token,
        "GPUFLEET_CLIENT_CONFIG": "/none",
    }
    r = subprocess.run(gpufleet_argv("status", "--json"), env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def last_seq(collector: Proc) -> int:
    match = re.search(r"collector stopped after seq (\d+) with 0 unacknowledged", collector.log())
    assert match, collector.log()[-2000:]
    return int(match.group(1))


def start(
    cluster: Cluster, influx: InfluxServer, database: str, ingest: int, fleet: int, name: str, *extra: str
) -> Any:
    return cluster.aggregator(
        name,
        ingest,
        fleet,
        cluster.tmp / "data",
        "--store",
        "influxdb",
        "--influx-url",
        influx.url,
        "--influx-database",
        database,
        "--ingest-workers",  # the default on two cores: the outage reaches the workers' writes
        "2",
        *extra,
    )


@pytest.mark.slow
def test_influxdb_down_for_30s_loses_and_doubles_nothing(cluster: Cluster) -> None:
    influx = InfluxServer(cluster.tmp / "influx")
    influx.start()
    try:
        ingest, fleet = free_port(), free_port()
        agg = start(cluster, influx, "outage", ingest, fleet, "aggregator")
        viewer = cluster.secrets.tokens["viewer"]
        collectors = [cluster.collector(n, agg.ingest, "--interval-s", "0.2") for n in NODES]
        wait_until(
            lambda: all(len(seqs(influx.url, "outage", n)) >= 10 for n in NODES), 30, "reports in InfluxDB"
        )

        influx.kill()
        down_at = time.monotonic()
        wait_until(
            lambda: time.monotonic() - down_at >= 30 and status(agg.fleet, viewer)["spool"]["batches"] > 0,
            60,
            "30 s of outage with the spool taking the reports",
        )
        during = status(agg.fleet, viewer)
        assert during["store_ok"] is False and "cannot reach InfluxDB" in during["store_error"]
        assert during["spool"]["points"] > 0 and during["spool"]["oldest_age_s"] >= 25
        assert agg.metric_value("gpufleet_spool_batches") > 0

        influx.start()
        wait_until(lambda: status(agg.fleet, viewer)["spool"]["batches"] == 0, 60, "the spool to drain")
        assert status(agg.fleet, viewer)["store_ok"] is True
        for c in collectors:
            assert c.stop(signal.SIGTERM) == 0
        for node, collector in zip(NODES, collectors, strict=True):
            got = seqs(influx.url, "outage", node)
            final = last_seq(collector)
            assert sorted(got) == list(range(1, final + 1)), f"{node}: every seq exactly once"
            log = collector.log()
            assert "stream to aggregator ended" not in log and "rejected" not in log, (
                "no collector saw an error"
            )
    finally:
        influx.kill()


@pytest.mark.slow
def test_aggregator_restart_with_a_full_spool_loses_and_doubles_nothing(cluster: Cluster) -> None:
    influx = InfluxServer(cluster.tmp / "influx")
    influx.start()
    try:
        ingest, fleet = free_port(), free_port()
        agg = start(cluster, influx, "restart", ingest, fleet, "aggregator-1")
        viewer = cluster.secrets.tokens["viewer"]
        collectors = [
            cluster.collector(n, agg.ingest, "--interval-s", "0.2", "--backoff-max-s", "1") for n in NODES
        ]
        wait_until(
            lambda: all(len(seqs(influx.url, "restart", n)) >= 5 for n in NODES), 30, "reports in InfluxDB"
        )
        influx.kill()
        wait_until(lambda: status(agg.fleet, viewer)["spool"]["batches"] >= 10, 30, "batches in the spool")
        agg.proc.stop(signal.SIGKILL)  # acknowledged means fsynced in the spool: nothing to flush
        agg2 = start(cluster, influx, "restart", ingest, fleet, "aggregator-2")
        assert status(agg2.fleet, viewer)["spool"]["batches"] >= 10, "the spool survived the restart"
        influx.start()
        wait_until(lambda: status(agg2.fleet, viewer)["spool"]["batches"] == 0, 60, "the spool to drain")
        # The collectors' reports from the kill on wait for a stream to the new aggregator: stopped
        # before they reconnect, a collector without a state_dir rightly exits with them unsent.
        wait_until(
            lambda: status(agg2.fleet, viewer)["streams_open"] == len(NODES), 30, "the collectors back"
        )
        for c in collectors:
            assert c.stop(signal.SIGTERM) == 0
        for node, collector in zip(NODES, collectors, strict=True):
            assert sorted(seqs(influx.url, "restart", node)) == list(range(1, last_seq(collector) + 1)), node
    finally:
        influx.kill()


@pytest.mark.slow
def test_repair_actions_reach_history_through_an_influxdb_outage(cluster: Cluster) -> None:
    """The repair controller acts while InfluxDB is down: its audit rows and findings are spooled
    by the history export and reach the store when it comes back; after the aggregator is
    SIGKILLed and restarted every one is there once (tests/fleet/test_dashboard.py has the restart on
    the embedded store)."""
    from harness.repair import audit, repair_flags, xid_scenario

    influx = InfluxServer(cluster.tmp / "influx")
    influx.start()
    try:
        policy = cluster.tmp / "policy.toml"
        policy.write_text("[workflow]\nvalidate_s = 2.0\n")
        ingest, fleet = free_port(), free_port()
        agg = start(cluster, influx, "repairs", ingest, fleet, "aggregator", *repair_flags(policy))
        viewer = cluster.secrets.tokens["viewer"]
        wait_until(lambda: status(agg.fleet, viewer)["store_ok"], 30, "the store to be up")
        influx.kill()
        scenario = xid_scenario(cluster.tmp / "xid79.toml", 79, gpu=2, lost=True, at_s=2.0)
        cluster.collector("outage-node", agg.ingest, "--interval-s", "0.5", "--sim-scenario", str(scenario))

        def done() -> list[dict[str, object]]:
            rows = audit(agg, cluster, "outage-node")
            return rows if any(r["action"] == "ticket" for r in rows) else []

        actions = wait_until(done, 60, "the repair, down to the skipped ticket, while InfluxDB is down")
        wait_until(
            lambda: agg.metric_value("gpufleet_history_export_points_total") > 0, 30, "the export spooled"
        )
        assert status(agg.fleet, viewer)["spool"]["batches"] > 0
        agg.proc.stop(signal.SIGKILL)
        influx.start()
        agg2 = start(cluster, influx, "repairs", ingest, fleet, "aggregator-2", *repair_flags(policy))
        wait_until(lambda: status(agg2.fleet, viewer)["spool"]["batches"] == 0, 60, "the spool to drain")

        def repairs() -> list[object]:
            store = InfluxStore(influx.url, "repairs", create_database=False)
            try:
                return store.query_points("repair", 0, time.time_ns() + 10**12, {"node": ["outage-node"]})
            finally:
                store.close()

        def caught_up() -> list[tuple[str, str]]:
            # The node's whole audit log (the restarted aggregator's rows too) is in history, once.
            want = sorted((a["action"], a["outcome"]) for a in audit(agg2, cluster, "outage-node"))
            got = sorted((p.tags["action"], p.fields["outcome"]) for p in repairs())
            return got if got == want else []

        stored = wait_until(caught_up, 30, "every audit row of the node in InfluxDB, once")
        assert len(stored) >= len(actions) and ("cordon", "ok") in stored

        def findings() -> bool:
            # The lost GPU's finding may join the incident a pass after the ticket: waited for.
            store = InfluxStore(influx.url, "repairs", create_database=False)
            try:
                codes = {p.tags["code"] for p in store.query_points("health", 0, time.time_ns() + 10**12)}
            finally:
                store.close()
            return {"xid_79", "gpu_lost"} <= codes

        wait_until(findings, 30, "both findings in InfluxDB")
    finally:
        influx.kill()
