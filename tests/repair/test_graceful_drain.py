"""Graceful drain of inference nodes, end to end: replicas serving a request stream behind a
router (collector/simnvml/serving.py), real collectors scraping their /metrics, a real
aggregator, and the Kubernetes stand-in or the hook backend calling an operator's API.

Without graceful drain the eviction aborts the requests in flight; with it the replica leaves
rotation first, the eviction waits until its engine reported 0 running, and 0 requests are
aborted."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpufleet.collector.simnvml.serving import Control, Replica, Router
from harness.k8s_standin import KubeStandin
from harness.processes import AggregatorHandle, Cluster
from harness.repair import FAST_POLICY, audit, repair_aggregator, xid_scenario
from harness.waiting import wait_until

ROTATION = "gpufleet.io/in-rotation"
NODES = ("g1", "g2")
# XID 79 with the GPU lost: urgent, so the capacity guard never holds it (2 replicas at low load).
POLICY = FAST_POLICY + '\n[buckets.RESTART_BM]\nladder = ["ticket"]\n'


@pytest.fixture
def engines() -> Iterator[dict[str, Replica]]:
    made = {n: Replica(n) for n in NODES}
    yield made
    for engine in made.values():
        engine.close()


def serve(cluster: Cluster, agg: AggregatorHandle, engines: dict[str, Replica]) -> None:
    """g1 gets XID 79 (GPU lost) once it has served a while; g2 stays healthy."""
    for node, engine in engines.items():
        extra = ["--engines", f"{engine.url} gpus=0,1"]
        if node == "g1":
            scenario = xid_scenario(cluster.tmp / "g1.toml", 79, gpu=3, lost=True, at_s=4.0)
            extra += ["--sim-scenario", str(scenario)]
        cluster.collector(node, agg.ingest, "--interval-s", "1", *extra)


def drained(agg: AggregatorHandle, cluster: Cluster, node: str) -> list[dict[str, Any]]:
    return [a for a in audit(agg, cluster, node) if a["action"] == "drain" and a["outcome"] == "ok"]


def kubernetes_run(
    cluster: Cluster, kube: KubeStandin, engines: dict[str, Replica], policy: str
) -> tuple[AggregatorHandle, Router]:
    for node in NODES:
        kube.add_node(node)
        kube.add_pod("llm", f"vllm-{node}", node, labels={"app": "vllm", ROTATION: "true"})

    def evicted(pod: dict[str, Any]) -> None:
        if pod["metadata"].get("deletionTimestamp"):
            engines[pod["spec"]["nodeName"]].terminate()

    kube.pod_listeners.append(evicted)

    def in_rotation(engine: Replica) -> bool:  # the Service's selector, as its endpoints follow it
        pod = kube.pods.get(("llm", f"vllm-{engine.node}"))
        return pod is not None and pod["metadata"]["labels"].get(ROTATION) == "true"

    agg = repair_aggregator(
        cluster,
        "--repair-backend",
        "kubernetes",
        "--repair-kubeconfig",
        str(kube.kubeconfig(cluster.tmp / "kc")),
        "--repair-max-out-of-service-fraction",
        "1",
        policy=policy,
    )
    router = Router(list(engines.values()), in_rotation)
    serve(cluster, agg, engines)
    return agg, router


@pytest.mark.slow
def test_without_graceful_drain_the_eviction_aborts_requests_in_flight(
    cluster: Cluster, kube: KubeStandin, engines: dict[str, Replica]
) -> None:
    agg, router = kubernetes_run(cluster, kube, engines, POLICY + "\n[serving]\ngraceful_drain = false\n")
    try:
        wait_until(lambda: engines["g1"].terminated, 60, "g1's pod evicted")
    finally:
        router.stop()
    assert engines["g1"].aborted > 0, "the baseline: requests in flight are cut"
    assert not [a for a in audit(agg, cluster, "g1") if a["action"] == "drain_engines"]


def test_kubernetes_graceful_drain_aborts_nothing_and_evicts_after_the_engine_reported_idle(
    cluster: Cluster, kube: KubeStandin, engines: dict[str, Replica]
) -> None:
    agg, router = kubernetes_run(cluster, kube, engines, POLICY)
    try:
        wait_until(lambda: engines["g1"].terminated, 60, "g1's pod evicted")
        wait_until(lambda: drained(agg, cluster, "g1"), 30, "g1's drain done")
    finally:
        router.stop()
    g1 = engines["g1"]
    assert g1.accepted > 0 and g1.running_at_termination == 0 and g1.aborted == 0
    assert engines["g2"].aborted == 0 and router.sent > g1.accepted, "g2 took the traffic"
    steps = [(a["action"], a["outcome"].split(":")[0]) for a in audit(agg, cluster, "g1")]
    start = steps.index(("drain_engines", "started"))
    assert steps[start : start + 3] == [
        ("drain_engines", "started"),
        ("drain_engines", "ok"),
        ("drain", "ok"),
    ]
    idle = next(
        a for a in audit(agg, cluster, "g1") if a["action"] == "drain_engines" and a["outcome"] == "ok"
    )
    assert idle["reason"].startswith("engines idle after ")
    patches = [
        r
        for r in kube.requests
        if r["verb"] == "PATCH" and r["path"] == "/api/v1/namespaces/llm/pods/vllm-g1"
    ]
    assert patches and patches[0]["body"]["metadata"]["labels"] == {ROTATION: "false"}
    assert kube.pods.get(("llm", "vllm-g2"), {}).get("metadata", {}).get("labels", {}).get(ROTATION) == "true"


@pytest.mark.slow
def test_hook_backend_graceful_drain_calls_the_operators_api_and_aborts_nothing(
    cluster: Cluster, engines: dict[str, Replica]
) -> None:
    control = Control(engines)
    try:
        agg = repair_aggregator(
            cluster,
            "--repair-backend",
            "hook",
            "--repair-hook-cordon",
            "true",
            "--repair-hook-uncordon",
            "true",
            "--repair-hook-drain",
            control.command("evict", "{node}"),
            "--repair-drain-engine-command",
            control.command("leave", "{node}", "{port}"),
            "--repair-max-out-of-service-fraction",
            "1",
            policy=POLICY,
        )
        router = Router(list(engines.values()), lambda e: not e.left_rotation)
        serve(cluster, agg, engines)
        try:
            wait_until(lambda: engines["g1"].terminated, 60, "g1 evicted by the drain hook")
        finally:
            router.stop()
        assert engines["g1"].accepted > 0 and engines["g1"].aborted == 0
        leave = [c for c in control.calls if c.startswith("/leave/")]
        assert leave == [f"/leave/g1/{engines['g1'].url.split(':')[2].split('/')[0]}"], control.calls
        assert control.calls.index(leave[0]) < control.calls.index("/evict/g1")
    finally:
        control.close()
