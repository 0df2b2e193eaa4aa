"""Fleets built for the dashboard tests: two live nodes, one quarantined; and 200 nodes of
stored history over four clusters, as an aggregator holds them after a restart."""

from __future__ import annotations

import math
from typing import Any

from gpufleet.collector.simnvml.engine_server import MODELS as ENGINE_MODELS
from gpufleet.protos import fleet_pb2
from gpufleet.protos.names import health_name
from harness.processes import Cluster
from harness.repair import declared_pool, repair_flags
from harness.waiting import wait_until

FAULTS = """
[[fault]]
at_s = 1.0
gpu = 1
kind = "xid"
xid = 79
node = "dash-2"

[[fault]]
at_s = 1.0
gpu = 1
kind = "lost"
node = "dash-2"
"""


def fleet_with_a_quarantined_node(cluster: Cluster) -> Any:
    """dash-1 healthy with a vLLM replica; dash-2 quarantined (XID 79, its GPU lost: the
    simulated reset fails and no reboot or ticket command is configured)."""
    policy = cluster.tmp / "policy.toml"
    # dash-1's replica is in the pool of its model, as an operator declares it (repair/placement.py).
    policy.write_text("[workflow]\nvalidate_s = 2.0\n" + declared_pool(ENGINE_MODELS["vllm"], ["dash-1"]))
    agg = cluster.aggregator(
        "aggregator",
        0,
        0,
        None,
        *repair_flags(policy),
    )
    (cluster.tmp / "faults.toml").write_text(FAULTS)
    for node, extra in (("dash-1", ["--sim-engine", "vllm"]), ("dash-2", [])):
        cluster.collector(
            node,
            agg.ingest,
            "--interval-s",
            "0.5",
            "--sim-gpus",
            "4",
            "--sim-scenario",
            str(cluster.tmp / "faults.toml"),
            *extra,
        )
    stub = agg.fleet_stub()

    def ready() -> bool:
        nodes = stub.ListNodes(fleet_pb2.ListNodesRequest(), metadata=cluster.secrets.metadata()).nodes
        history = stub.QueryHistory(
            fleet_pb2.HistoryRequest(metric="util_gpu_pct", nodes=["dash-1"]),
            metadata=cluster.secrets.metadata(),
        ).series
        states = {n.node: health_name(n.health) for n in nodes}
        return states == {"dash-1": "healthy", "dash-2": "quarantined"} and len(history) == 4

    wait_until(ready, 60, "two nodes with history, dash-2 quarantined")

    def in_history() -> bool:
        # The repair controller's actions reach history through the export (aggregator/fleet/export.py).
        events = stub.QueryEvents(
            fleet_pb2.EventsRequest(nodes=["dash-2"]), metadata=cluster.secrets.metadata()
        ).events
        # The lost GPU's finding joins the incident at the first pass that sees the lost sample,
        # which may come after the ticket: both are waited for.
        findings = {e.code for e in events if e.kind == "health"}
        return findings >= {"xid_79", "gpu_lost"} and any(
            e.kind == "repair" and e.code == "ticket" for e in events
        )

    wait_until(
        in_history, 30, "dash-2's findings and last repair step (the skipped ticket) in stored history"
    )
    return agg


CLUSTERS = {"east": "H100", "west": "H100", "north": "H200", "south": "H200"}


LOAD = {"east": (25.0, 15.0), "west": (50.0, 10.0), "north": (70.0, 12.0), "south": (88.0, 6.0)}


S = 1_000_000_000


def fleet_of_200_nodes(cluster: Cluster) -> Any:
    """An aggregator started over a store holding 30 minutes of 200 nodes x 8 GPUs (4 clusters
    of 50): what a fleet's aggregator holds after a restart. The points are written with the
    real embedded store in the schema's layout (aggregator/ingest/schema.py)."""
    import time

    from gpufleet.aggregator.store import EmbeddedStore, Point

    data_dir = cluster.tmp / "data200"
    store = EmbeddedStore(data_dir / "store.sqlite3", retention_s=86400)
    now = time.time_ns() // (30 * S) * (30 * S)
    points = []
    for n in range(200):
        name, cl = f"node-{n:03d}", list(CLUSTERS)[n % 4]
        for i in range(60):
            t = now - (59 - i) * 30 * S
            for g in range(8):
                tags = {
                    "node": name,
                    "gpu": str(g),
                    "uuid": f"GPU-{n:03d}-{g}",
                    "model": CLUSTERS[cl],
                    "cluster": cl,
                }
                # Each cluster its own level and spread, a slow swing over the half hour.
                level, spread = LOAD[cl]
                jitter = ((n * 7 + g * 13 + i * 3) % 21 - 10) / 10
                util = round(min(99.0, max(0.0, level + spread * jitter + 8 * math.sin(i / 9))), 1)
                points.append(Point("gpu", tags, {"util_gpu_pct": util, "lost": False}, t))
            points.append(
                Point(
                    "collector",
                    {"node": name, "cluster": cl},
                    {"seq": i + 1, "boot_id": "b", "interval_s": 30.0, "gpu_count": 8},
                    t,
                )
            )
    store.write(points)
    store.close()
    return cluster.aggregator("aggregator", 0, 0, data_dir)
