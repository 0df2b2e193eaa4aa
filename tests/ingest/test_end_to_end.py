"""Collector and aggregator as separate processes over real loopback gRPC."""

from __future__ import annotations

import re
import signal
import time

import pytest

from harness.processes import Cluster, Proc, free_port
from harness.stored import stored_seqs
from harness.waiting import wait_until

NODES = ["e2e-node-1", "e2e-node-2", "e2e-node-3"]
OUTAGE_S = 10.0
WORKERS = ("--ingest-workers", "2")  # the default on two cores: killed with its workers


def last_seq(collector: Proc) -> int:
    match = re.search(r"collector stopped after seq (\d+) with 0 unacknowledged", collector.log())
    assert match, f"collector did not stop cleanly with everything acknowledged:\n{collector.log()[-2000:]}"
    return int(match.group(1))


@pytest.mark.slow
def test_aggregator_killed_mid_stream_loses_and_doubles_nothing(cluster: Cluster) -> None:
    ingest_port, fleet_port = free_port(), free_port()
    agg = cluster.aggregator("aggregator-1", ingest_port, fleet_port, None, *WORKERS)
    collectors = [
        cluster.collector(n, agg.ingest, "--interval-s", "0.2", "--backoff-max-s", "2") for n in NODES
    ]
    wait_until(
        lambda: all(len(stored_seqs(agg.data_dir, [n])[n]) >= 10 for n in NODES),
        30,
        "every node to land 10 reports",
    )

    agg.proc.stop(signal.SIGKILL)  # mid-stream: no chance to flush or say goodbye
    killed_at = time.monotonic()
    # The outage lasts at least OUTAGE_S, and until every collector has seen it (failed to
    # reconnect at least once after the kill).
    wait_until(
        lambda: (
            time.monotonic() - killed_at >= OUTAGE_S and all("retrying in" in c.log() for c in collectors)
        ),
        OUTAGE_S + 30,
        "the outage to be seen",
    )
    before_restart = {n: max(stored_seqs(agg.data_dir, [n])[n]) for n in NODES}

    agg2 = cluster.aggregator("aggregator-2", ingest_port, fleet_port, agg.data_dir, *WORKERS)
    # The reports sampled during the outage (~50 per node at 0.2 s) are replayed.
    wait_until(
        lambda: all(
            max(stored_seqs(agg2.data_dir, [n])[n]) >= before_restart[n] + OUTAGE_S / 0.2 for n in NODES
        ),
        60,
        "the replayed outage reports to land",
    )
    for c in collectors:
        assert c.stop(signal.SIGTERM) == 0
    assert agg2.proc.stop(signal.SIGTERM) == 0

    for node, collector in zip(NODES, collectors, strict=True):
        seqs = stored_seqs(agg.data_dir, [node])[node]
        final = last_seq(collector)
        assert final >= before_restart[node] + OUTAGE_S / 0.2
        assert sorted(seqs) == list(range(1, final + 1)), f"{node}: every seq exactly once"
        assert "dropped" not in collector.log().split("collector stopped")[0].lower()
