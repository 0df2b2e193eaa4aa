"""The Kubernetes repair backend, through the official client, against the stand-in API server
(tests/harness/k8s_standin.py: no real API server can run here)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from gpufleet.repair.backends.kubernetes import API_CALLS, TAINT_KEY
from harness.k8s_standin import KubeStandin
from harness.processes import Cluster
from harness.repair import FAST_POLICY, gpufleet_cli, repair_aggregator, repair_status, xid_scenario
from harness.waiting import wait_until


def node_state(agg: Any, cluster: Cluster, node: str) -> dict[str, Any] | None:
    return next((n for n in repair_status(agg, cluster)["nodes"] if n["node"] == node), None)


def k8s_aggregator(cluster: Cluster, kube: KubeStandin, *extra: str) -> Any:
    return repair_aggregator(
        cluster,
        "--repair-backend",
        "kubernetes",
        "--repair-kubeconfig",
        str(kube.kubeconfig(cluster.tmp / "kc")),
        "--repair-max-out-of-service-fraction",
        "1",
        *extra,
        policy=FAST_POLICY + '\n[buckets.RESTART_BM]\nladder = ["ticket"]\n',
    )


def faulty(cluster: Cluster, agg: Any, node: str) -> None:
    scenario = xid_scenario(cluster.tmp / f"{node}.toml", 79, gpu=0, lost=True)
    cluster.collector(node, agg.ingest, "--interval-s", "1", "--sim-scenario", str(scenario))


@pytest.mark.slow
def test_kubernetes_cordon_taint_condition_and_evictions_that_respect_budgets(
    kube: KubeStandin, cluster: Cluster
) -> None:
    for name in ("k8s-gpu-1", "k8s-gpu-2"):
        kube.add_node(name)
    kube.add_pod("gpu-operator", "dcgm-exporter-x1", "k8s-gpu-1", owner_kind="DaemonSet")
    kube.add_pod("default", "web-1", "k8s-gpu-1")
    kube.add_pod("ml", "trainer-0", "k8s-gpu-1", labels={"app": "trainer"})
    kube.add_pdb("ml", {"app": "trainer"}, min_available=1)  # trainer-0 may not go yet
    agg = k8s_aggregator(cluster, kube)
    faulty(cluster, agg, "k8s-gpu-1")
    cluster.collector("k8s-gpu-2", agg.ingest, "--interval-s", "1")

    node = kube.nodes["k8s-gpu-1"]
    wait_until(lambda: node["spec"].get("unschedulable"), 30, "the node cordoned")
    assert {"key": TAINT_KEY, "value": "automation", "effect": "NoSchedule"} in node["spec"]["taints"]
    assert node["metadata"]["annotations"]["gpufleet.io/cordoned-by"] == "automation"
    # The condition is a second request (the status subresource), right after the cordon's.
    condition = wait_until(
        lambda: next((c for c in node["status"]["conditions"] if c["type"] == "GpufleetHealthy"), None),
        30,
        "the GpufleetHealthy condition",
    )
    assert condition["status"] == "False" and condition["message"].startswith("gpufleet: xid_79")
    patches = [r for r in kube.requests if r["verb"] == "PATCH"]
    assert {r["content_type"] for r in patches} == {"application/strategic-merge-patch+json"}

    # The budget refuses trainer-0: the drain waits (it is never forced), web-1 is evicted.
    wait_until(lambda: ("default", "web-1") not in kube.pods, 30, "web-1 evicted")
    wait_until(
        lambda: "disruption budget" in (node_state(agg, cluster, "k8s-gpu-1") or {}).get("detail", ""),
        30,
        "the drain to report the budget",
    )
    assert ("ml", "trainer-0") in kube.pods
    refused = [r for r in kube.requests if r["path"].endswith("/trainer-0/eviction")]
    assert refused and all(
        r["body"]["kind"] == "Eviction" and r["body"]["apiVersion"] == "policy/v1" for r in refused
    )
    assert node_state(agg, cluster, "k8s-gpu-1")["state"] == "draining"

    kube.pdbs.clear()  # the training job moved elsewhere: the budget allows it now
    wait_until(lambda: node_state(agg, cluster, "k8s-gpu-1")["state"] == "quarantined", 30, "quarantined")
    assert ("ml", "trainer-0") not in kube.pods
    assert ("gpu-operator", "dcgm-exporter-x1") in kube.pods, "DaemonSet pods are not evicted"
    assert not [r for r in kube.requests if "dcgm-exporter" in r["path"]]

    # A person cordons the other node with kubectl (no gpufleet marker): it is theirs.
    kube.nodes["k8s-gpu-2"]["spec"]["unschedulable"] = True
    wait_until(
        lambda: (node_state(agg, cluster, "k8s-gpu-2") or {}).get("state") == "human_cordoned",
        30,
        "the person's cordon seen",
    )

    # An operator returns the quarantined node: taint, marker and condition are undone.
    out = gpufleet_cli(agg, cluster, "ops", "uncordon", "k8s-gpu-1", "--reason", "GPU replaced")
    assert out.returncode == 0, out.stderr
    assert not node["spec"]["unschedulable"] and not [
        t for t in node["spec"]["taints"] if t["key"] == TAINT_KEY
    ]
    assert "gpufleet.io/cordoned-by" not in node["metadata"]["annotations"]
    condition = next(c for c in node["status"]["conditions"] if c["type"] == "GpufleetHealthy")
    assert condition["status"] == "True"

    # The automation never wrote to the node a person cordoned.
    assert not [r for r in kube.requests if r["verb"] == "PATCH" and "k8s-gpu-2" in r["path"]]
    assert kube.nodes["k8s-gpu-2"]["spec"]["unschedulable"] is True
    # Every call the backend made is one its documented RBAC (API_CALLS) allows.
    assert kube.calls() <= API_CALLS, kube.calls() - API_CALLS


@pytest.mark.slow
def test_a_taint_someone_adds_between_our_read_and_write_survives(
    kube: KubeStandin, cluster: Cluster
) -> None:
    kube.add_node("k8s-gpu-1")
    maintenance = {"key": "example.com/maintenance", "value": "bios", "effect": "NoSchedule"}
    # The next read of the node is followed, before our write, by another writer's taint: our
    # patch carries the resourceVersion it read, gets 409 Conflict, and is redone on a fresh read.
    kube.interfere_once("k8s-gpu-1", lambda node: node["spec"].setdefault("taints", []).append(maintenance))
    agg = k8s_aggregator(cluster, kube)
    faulty(cluster, agg, "k8s-gpu-1")
    node = kube.nodes["k8s-gpu-1"]
    wait_until(lambda: node["spec"].get("unschedulable"), 30, "the node cordoned")
    keys = [t["key"] for t in node["spec"]["taints"]]
    assert sorted(keys) == sorted(["example.com/maintenance", TAINT_KEY]), keys
    writes = [r for r in kube.requests if r["verb"] == "PATCH" and not r["path"].endswith("/status")]
    assert [r["code"] for r in writes[:2]] == [409, 200], "refused once, redone on a fresh read"
    assert all(r["body"]["metadata"]["resourceVersion"] for r in writes)

    # Returned to service: only our taint goes; theirs stays. Read from the uncordon's own write:
    # the GPU is still lost, so a new incident may cordon the node again right after (a fresh-
    # clone run saw it 0.2 s later, before this test looked at the node).
    before = len(kube.requests)
    out = gpufleet_cli(agg, cluster, "ops", "uncordon", "k8s-gpu-1", "--reason", "GPU replaced")
    assert out.returncode == 0, out.stderr
    uncordon = next(
        r
        for r in kube.requests[before:]
        if r["verb"] == "PATCH" and not r["path"].endswith("/status") and r["code"] == 200
    )
    assert [t["key"] for t in uncordon["body"]["spec"]["taints"]] == ["example.com/maintenance"], uncordon
    assert "example.com/maintenance" in [t["key"] for t in node["spec"]["taints"]]
    assert kube.calls() <= API_CALLS and not kube.forbidden


@pytest.mark.slow
def test_a_kubectl_cordon_between_our_read_and_write_is_never_overwritten(
    kube: KubeStandin, cluster: Cluster
) -> None:
    kube.add_node("k8s-gpu-1")
    kube.interfere_once("k8s-gpu-1", lambda node: node["spec"].update(unschedulable=True))
    agg = k8s_aggregator(cluster, kube)
    faulty(cluster, agg, "k8s-gpu-1")
    wait_until(
        lambda: (node_state(agg, cluster, "k8s-gpu-1") or {}).get("state") == "human_cordoned",
        30,
        "the person's cordon found at the point of action",
    )
    node = kube.nodes["k8s-gpu-1"]
    assert node["spec"]["unschedulable"] is True and not node["spec"].get("taints")
    assert "gpufleet.io/cordoned-by" not in node["metadata"]["annotations"]
    writes = [r for r in kube.requests if r["verb"] == "PATCH"]
    assert all(r["code"] == 409 and r["body"]["metadata"]["resourceVersion"] for r in writes), writes

    out = gpufleet_cli(agg, cluster, "viewer", "incidents", "--all", "--json")
    (incident,) = json.loads(out.stdout)["incidents"]
    assert not incident["open"] and incident["outcome"].startswith("taken over by a person")


@pytest.mark.slow
def test_drain_waits_for_terminating_pods_and_budgets_that_count_ready_pods(
    kube: KubeStandin, cluster: Cluster
) -> None:
    kube.add_node("k8s-gpu-1")
    kube.add_node("k8s-gpu-2")
    kube.add_pod("default", "web-1", "k8s-gpu-1", grace_s=4)  # stays Terminating for 4 s
    # Two serving replicas, one of them not Ready: maxUnavailable 1 is already used up, so
    # the Ready one on the faulty node may not go until the other is Ready again.
    kube.add_pod("serve", "llm-0", "k8s-gpu-1", labels={"app": "llm"})
    kube.add_pod("serve", "llm-1", "k8s-gpu-2", labels={"app": "llm"}, ready=False)
    kube.add_pdb("serve", {"app": "llm"}, max_unavailable=1)
    agg = k8s_aggregator(cluster, kube)
    faulty(cluster, agg, "k8s-gpu-1")
    wait_until(
        lambda: (
            "disruption budget for serve/llm-0"
            in (node_state(agg, cluster, "k8s-gpu-1") or {}).get("detail", "")
        ),
        30,
        "the budget holding llm-0",
    )
    assert ("serve", "llm-0") in kube.pods and node_state(agg, cluster, "k8s-gpu-1")["state"] == "draining"
    with kube.lock:
        kube.pods[("serve", "llm-1")]["status"]["conditions"][0]["status"] = "True"
    wait_until(
        lambda: (
            kube.pods.get(("serve", "llm-0"), {}).get("metadata", {}).get("deletionTimestamp")
            or ("serve", "llm-0") not in kube.pods
        ),
        30,
        "llm-0 evicted",
    )
    evicted_at = time.monotonic()
    wait_until(lambda: node_state(agg, cluster, "k8s-gpu-1")["state"] == "quarantined", 30, "drained")
    assert time.monotonic() - evicted_at >= 2.5 or ("default", "web-1") not in kube.pods
    assert ("default", "web-1") not in kube.pods, "the drain waited out web-1's grace period"
    evictions = [r for r in kube.requests if r["path"].endswith("/web-1/eviction")]
    assert len(evictions) == 1, "a Terminating pod is not evicted again"


@pytest.mark.slow
def test_a_call_the_clusterrole_does_not_allow_fails_as_in_a_cluster(
    kube: KubeStandin, cluster: Cluster
) -> None:
    kube.granted.discard(("", "pods/eviction", "create"))  # a manifest that forgot evictions
    kube.add_node("k8s-gpu-1")
    kube.add_pod("default", "web-1", "k8s-gpu-1")
    agg = k8s_aggregator(cluster, kube)
    faulty(cluster, agg, "k8s-gpu-1")
    detail = wait_until(
        lambda: "HTTP 403" in (d := (node_state(agg, cluster, "k8s-gpu-1") or {}).get("detail", "")) and d,
        30,
        "the drain failing on RBAC",
    )
    assert 'cannot create resource \\"pods/eviction\\"' in detail or "cannot create resource" in detail
    assert ("default", "web-1") in kube.pods
    assert kube.forbidden and set(kube.forbidden) == {("", "pods/eviction", "create")}


@pytest.mark.slow
def test_an_api_server_that_cannot_answer_means_no_cordon_until_it_does(
    kube: KubeStandin, cluster: Cluster
) -> None:
    kube.add_node("k8s-gpu-1")
    kube.unavailable = True
    agg = k8s_aggregator(cluster, kube)
    faulty(cluster, agg, "k8s-gpu-1")
    detail = wait_until(
        lambda: (
            "cannot be read" in (d := (node_state(agg, cluster, "k8s-gpu-1") or {}).get("detail", "")) and d
        ),
        30,
        "the cordon held",
    )
    assert "HTTP 503" in detail and node_state(agg, cluster, "k8s-gpu-1")["state"] == "waiting"
    assert not [r for r in kube.requests if r["verb"] == "PATCH"], "no write was even tried"
    kube.unavailable = False
    wait_until(lambda: kube.nodes["k8s-gpu-1"]["spec"].get("unschedulable"), 30, "the cordon once it answers")


@pytest.mark.slow
@pytest.mark.parametrize("rail", ["--repair-dry-run", "--repair-breaker-nodes=1"])
def test_dry_run_and_a_tripped_breaker_write_nothing_to_the_api_server(
    kube: KubeStandin, cluster: Cluster, rail: str
) -> None:
    kube.add_node("k8s-gpu-1")
    kube.add_pod("default", "web-1", "k8s-gpu-1")
    agg = k8s_aggregator(cluster, kube, rail)
    faulty(cluster, agg, "k8s-gpu-1")
    expected = "dry-run: would cordon" if "dry" in rail else "breaker tripped"
    wait_until(
        lambda: expected in (node_state(agg, cluster, "k8s-gpu-1") or {}).get("detail", ""),
        30,
        "the cordon held",
    )
    passes = agg.metric_value("gpufleet_repair_passes_total")
    wait_until(lambda: agg.metric_value("gpufleet_repair_passes_total") > passes + 10, 30, "more passes")
    assert not [r for r in kube.requests if r["verb"] in ("PATCH", "POST")], "nothing written"
    assert not kube.nodes["k8s-gpu-1"]["spec"].get("unschedulable") and ("default", "web-1") in kube.pods


@pytest.mark.slow
def test_scheduler_names_reach_the_kubernetes_node(kube: KubeStandin, cluster: Cluster) -> None:
    """A collector named `rack4-gpu-2.example.com` is Kubernetes node `k8s-gpu-2` by the pattern:
    the automation's cordon and a person's uncordon patch that node, no other."""
    for name in ("k8s-gpu-1", "k8s-gpu-2"):
        kube.add_node(name)
    agg = k8s_aggregator(
        cluster,
        kube,
        "--scheduler-name-regex",
        r"rack\d+-gpu-(\d+)\.example\.com",
        "--scheduler-name-replace",
        r"k8s-gpu-\1",
    )
    faulty(cluster, agg, "rack4-gpu-2.example.com")
    node = kube.nodes["k8s-gpu-2"]
    wait_until(lambda: node["spec"].get("unschedulable"), 30, "k8s-gpu-2 cordoned for its collector")
    assert not kube.nodes["k8s-gpu-1"]["spec"].get("unschedulable")
    touched = {r["path"].split("/nodes/")[1].split("/")[0] for r in kube.requests if "/nodes/" in r["path"]}
    assert touched == {"k8s-gpu-2"}, "only the mapped node is read and patched"
    out = gpufleet_cli(agg, cluster, "ops", "uncordon", "rack4-gpu-2.example.com", "--reason", "GPU reseated")
    assert out.returncode == 0, out.stderr
    assert not node["spec"].get("unschedulable")
