"""The Kubernetes repair backend, through the official client, against the stand-in API server
(tests/k8s_standin.py: no real API server can run here)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Cluster, wait_until
from k8s_standin import KubeStandin
from test_repair_slurm import FAST_POLICY, gpufleet_cli, repair_aggregator, repair_status, xid_scenario

from gpufleet.repair.backends.kubernetes import API_CALLS, TAINT_KEY


def node_state(agg: Any, cluster: Cluster, node: str) -> dict[str, Any] | None:
    return next((n for n in repair_status(agg, cluster)["nodes"] if n["node"] == node), None)


@pytest.mark.slow
def test_kubernetes_cordon_taint_condition_and_evictions_that_respect_budgets(cluster: Cluster) -> None:
    kube = KubeStandin()
    for name in ("k8s-gpu-1", "k8s-gpu-2"):
        kube.add_node(name)
    kube.add_pod("gpu-operator", "dcgm-exporter-x1", "k8s-gpu-1", owner_kind="DaemonSet")
    kube.add_pod("default", "web-1", "k8s-gpu-1")
    kube.add_pod("ml", "trainer-0", "k8s-gpu-1", labels={"app": "trainer"})
    kube.add_pdb("ml", {"app": "trainer"}, min_available=1)  # trainer-0 may not go yet
    policy = FAST_POLICY + '\n[buckets.RESTART_BM]\nladder = ["ticket"]\n'
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
    cluster.collector(
        "k8s-gpu-1",
        agg.ingest,
        "--interval-s",
        "1",
        "--sim-scenario",
        str(xid_scenario(cluster.tmp / "x.toml", 79, gpu=0, lost=True)),
    )
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
    kube.close()
