"""Serving-aware repair end to end: real collectors scraping real HTTP engine endpoints
(vLLM's format, KV-cache usage set by the test), a real aggregator with repair on (the `none`
backend: its own records), the CLI and /metrics as a person and Prometheus read them.

A fault that may wait on one replica of a 3-replica pool at 0.85 KV-cache usage waits for
capacity (the node page, `gpufleet pools`, the repair status, the dashboard's Inference page and
the per-pool gauges all say so),
then drains once a 4th replica comes up."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from harness.dashboard import app
from harness.engine_endpoint import MODEL, EngineEndpoint
from harness.processes import AggregatorHandle, Cluster
from harness.repair import (
    FAST_POLICY,
    audit,
    declared_pool,
    gpufleet_cli,
    repair_aggregator,
    repair_status,
    xid_scenario,
)
from harness.waiting import wait_until

POLICY = FAST_POLICY + "\n[xid.79]\nmay_wait = true\n" + declared_pool(MODEL, ["s*"])


@pytest.fixture
def engines() -> Iterator[dict[str, EngineEndpoint]]:
    made = {n: EngineEndpoint(0.85) for n in ("s1", "s2", "s3")} | {"s4": EngineEndpoint(0.0)}
    yield made
    for endpoint in made.values():
        endpoint.close()


def collector(
    cluster: Cluster, agg: AggregatorHandle, node: str, engine: EngineEndpoint, *extra: str
) -> object:
    return cluster.collector(
        node, agg.ingest, "--interval-s", "1", "--engines", f"{engine.url} gpus=0,1", *extra
    )


def pools(agg: AggregatorHandle, cluster: Cluster) -> dict:
    out = gpufleet_cli(agg, cluster, "viewer", "pools", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def pool(agg: AggregatorHandle, cluster: Cluster) -> dict:
    return next((p for p in pools(agg, cluster)["pools"] if p["model"] == MODEL), {})


def node_state(agg: AggregatorHandle, cluster: Cluster, node: str) -> dict:
    return next((n for n in repair_status(agg, cluster)["nodes"] if n["node"] == node), {})


def test_a_deferrable_fault_waits_for_capacity_then_drains_when_a_fourth_replica_comes_up(
    cluster: Cluster, engines: dict[str, EngineEndpoint], monkeypatch: pytest.MonkeyPatch
) -> None:
    agg = repair_aggregator(cluster, "--repair-max-out-of-service-fraction", "1", policy=POLICY)
    s1 = collector(cluster, agg, "s1", engines["s1"])
    for node in ("s2", "s3"):
        collector(cluster, agg, node, engines[node])
    wait_until(lambda: pool(agg, cluster).get("replicas_serving") == 3, 30, "3 replicas serving")
    # The pool as a person reads it: 3 serving at 85 %, 127.5 % if one leaves, no headroom.
    p = pool(agg, cluster)
    assert p["cluster"] == "test" and p["headroom_replicas"] == 0
    assert p["kv_cache_usage_mean_ratio"] == pytest.approx(0.85)
    assert p["kv_cache_usage_if_one_leaves_ratio"] == pytest.approx(1.275)
    text = gpufleet_cli(agg, cluster, "viewer", "pools")
    assert text.returncode == 0, text.stderr
    assert "85" in text.stdout and "127" in text.stdout and "+0" in text.stdout, text.stdout
    node = gpufleet_cli(agg, cluster, "viewer", "node", "s2")
    assert (
        f"if drained: test/{MODEL} 3 → 2 replicas, KV 85 % → 127 % (breaks the serving floor)" in node.stdout
    ), node.stdout

    # s1 restarts with an XID the policy says may wait (its engine stays in the pool).
    s1.stop()
    collector(
        cluster, agg, "s1", engines["s1"], "--sim-scenario", str(xid_scenario(cluster.tmp / "x.toml", 79))
    )
    waiting = wait_until(
        lambda: (
            (st := node_state(agg, cluster, "s1")).get("detail", "").startswith("waiting for capacity") and st
        ),
        30,
        "s1 waiting for capacity",
    )
    assert waiting["state"] == "cordoned"
    listed = gpufleet_cli(agg, cluster, "viewer", "nodes")
    assert "cordoned, waiting for capacity" in next(
        ln for ln in listed.stdout.splitlines() if ln.startswith("s1 ")
    ), listed.stdout
    assert waiting["detail"] == f"waiting for capacity: {MODEL} 3 → 2 replicas, projected KV 85 % → 127 %"
    assert pool(agg, cluster)["nodes_waiting"] == ["s1"]
    assert agg.metric_value("gpufleet_pool_repairs_waiting_for_capacity", cluster="test", model=MODEL) == 1
    assert agg.metric_value("gpufleet_pool_headroom_replicas", cluster="test", model=MODEL) == 0
    assert not [a for a in audit(agg, cluster, "s1") if a["action"] == "drain" and a["outcome"] == "started"]
    # The dashboard's Inference page, as a person reads it: the pool, and s1 waiting, with why.
    at = app(monkeypatch, agg.fleet, cluster.secrets.tokens["viewer"]).run()
    at.sidebar.radio[0].set_value("Inference").run()
    assert not at.exception, at.exception
    frames = [d.value for d in at.dataframe]
    pools_table = next(f for f in frames if "headroom replicas" in f.columns)
    assert list(pools_table["serving"]) == [3] and list(pools_table["repairs waiting"]) == ["s1"]
    waiting_table = next(f for f in frames if "waiting for" in f.columns)
    assert list(waiting_table["node"]) == ["s1"]
    assert list(waiting_table["waiting for"]) == [f"{MODEL} 3 → 2 replicas, projected KV 85 % → 127 %"]
    assert any("Repairs waiting for capacity" in h.value for h in at.subheader)

    # A fourth replica comes up with room in its cache: the drain goes on.
    collector(cluster, agg, "s4", engines["s4"])
    wait_until(
        lambda: [
            a for a in audit(agg, cluster, "s1") if a["action"] == "drain" and a["outcome"] == "started"
        ],
        30,
        "s1's drain starting once s4 serves",
    )
    assert wait_until(lambda: pool(agg, cluster)["nodes_waiting"] == [], 10, "no repair waiting")
    assert agg.metric_value("gpufleet_pool_repairs_waiting_for_capacity", cluster="test", model=MODEL) == 0
    drains = [a for a in audit(agg, cluster, "s1") if a["action"] == "drain"]
    assert [d["outcome"].split(":")[0] for d in drains][:2] == ["held", "started"], drains


def test_collectors_that_name_their_pool_split_one_model_into_two_pools(
    cluster: Cluster, engines: dict[str, EngineEndpoint]
) -> None:
    """`pool=NAME` on an engine endpoint (the collector's engines setting) puts the replica in
    that pool, end to end: one model served by two deployments is listed, and weighed, apart."""
    named = declared_pool("llama-prod", ["s1", "s2"]) + declared_pool("llama-batch", ["s4"])
    agg = repair_aggregator(cluster, policy=POLICY + named)
    for node, name in (("s1", "llama-prod"), ("s2", "llama-prod"), ("s4", "llama-batch")):
        cluster.collector(
            node, agg.ingest, "--interval-s", "1", "--engines", f"{engines[node].url} gpus=0,1 pool={name}"
        )
    listed = wait_until(
        lambda: (
            (p := {x["model"]: x for x in pools(agg, cluster)["pools"]})
            and sum(x["replicas_serving"] for x in p.values()) == 3
            and p
        ),
        30,
        "three replicas serving in the named pools",
    )
    assert sorted(listed) == ["llama-batch", "llama-prod"], listed
    assert listed["llama-prod"]["replicas_serving"] == 2 and listed["llama-batch"]["replicas_serving"] == 1
    assert listed["llama-prod"]["kv_cache_usage_mean_ratio"] == pytest.approx(0.85)
