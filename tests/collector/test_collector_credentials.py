"""A collector's credential is bound to its node, on Kubernetes too.

The aggregator runs with collector_auth = kubernetes against the Kubernetes API stand-in
(tests/harness/k8s_standin.py: no API server can run here), which answers TokenReview for the
projected ServiceAccount tokens it issues and serves the pods they are bound to, as the real
server does. A token taken from node A's collector is refused when it names node B, and so
are a token for another audience, another ServiceAccount's token, the token of a pod that is
gone, and an HMAC token when only Kubernetes tokens are accepted. The fleet-wide shared
secret on a node is an explicit opt-in."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from gpufleet.collector.config import CollectorConfig
from harness.k8s_standin import KubeStandin
from harness.processes import AggregatorHandle, Cluster
from harness.streams import RawStream, hello, report
from harness.waiting import wait_until

AUDIENCE = "gpufleet-aggregator"
SA = "gpufleet-collector"


@pytest.fixture(scope="module")
def k8s(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, AggregatorHandle, KubeStandin]]:
    tmp = tmp_path_factory.mktemp("k8s-auth")
    kube = KubeStandin()
    for node in ("gpu-a", "gpu-b"):
        kube.add_node(node)
        kube.add_pod("gpufleet", f"collector-{node}", node, owner_kind="DaemonSet")
    kube.add_pod("default", "intruder", "gpu-b")
    cluster = Cluster(tmp)
    try:
        agg = cluster.aggregator(
            "aggregator",
            0,
            0,
            None,
            "--collector-auth",
            "kubernetes",
            "--collector-k8s-kubeconfig",
            str(kube.kubeconfig(tmp / "kubeconfig")),
        )
        yield cluster, agg, kube
    finally:
        cluster.stop_all()
        kube.close()


def refused(agg: AggregatorHandle, token: str, node: str) -> grpc.RpcError:
    s = RawStream(agg.ingest, token)
    s.send(hello(node))
    with pytest.raises(grpc.RpcError) as info:
        s.recv()
    s.close()
    return info.value


def test_a_pods_token_lets_its_own_node_report(k8s: tuple[Cluster, AggregatorHandle, KubeStandin]) -> None:
    _, agg, kube = k8s
    token = kube.issue_token("gpufleet", SA, "collector-gpu-a", [AUDIENCE])
    s = RawStream(agg.ingest, token)
    s.send(hello("gpu-a"))
    assert s.recv().WhichOneof("body") == "welcome"
    s.send(report("gpu-a", 1))
    assert list(s.recv().ack.seqs) == [1]
    s.close()
    reviews = [r for r in kube.requests if r["path"].endswith("/tokenreviews")]
    assert reviews and reviews[-1]["body"]["spec"]["audiences"] == [AUDIENCE]


def test_node_as_token_naming_node_b_is_unauthenticated(
    k8s: tuple[Cluster, AggregatorHandle, KubeStandin],
) -> None:
    _, agg, kube = k8s
    token = kube.issue_token("gpufleet", SA, "collector-gpu-a", [AUDIENCE])
    err = refused(agg, token, "gpu-b")
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "belongs to the collector on node 'gpu-a', not 'gpu-b'" in err.details()
    before = agg.metric_value("gpufleet_ingest_rejections_total", reason="unauthenticated")
    refused(agg, token, "gpu-b")  # answered from the cache of reviews, refused the same way
    assert agg.metric_value("gpufleet_ingest_rejections_total", reason="unauthenticated") == before + 1


@pytest.mark.parametrize(
    "namespace,account,pod,audiences,text",
    [
        ("gpufleet", SA, "collector-gpu-b", ["vault"], "is invalid for the target audiences"),
        (
            "default",
            "default",
            "intruder",
            [AUDIENCE],
            "only 'system:serviceaccount:gpufleet:gpufleet-collector'",
        ),
    ],
    ids=["another_audience", "another_service_account"],
)
def test_tokens_not_minted_for_gpufleet_collectors_are_unauthenticated(
    k8s: tuple[Cluster, AggregatorHandle, KubeStandin],
    namespace: str,
    account: str,
    pod: str,
    audiences: list[str],
    text: str,
) -> None:
    _, agg, kube = k8s
    err = refused(agg, kube.issue_token(namespace, account, pod, audiences), "gpu-b")
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert text in err.details(), err.details()


def test_the_token_of_a_pod_that_is_gone_is_unauthenticated(
    k8s: tuple[Cluster, AggregatorHandle, KubeStandin],
) -> None:
    _, agg, kube = k8s
    kube.add_pod("gpufleet", "collector-old", "gpu-b", owner_kind="DaemonSet")
    token = kube.issue_token("gpufleet", SA, "collector-old", [AUDIENCE])
    del kube.pods[("gpufleet", "collector-old")]
    err = refused(agg, token, "gpu-b")
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert (
        'refused the collector\'s token: [invalid bearer token, pod "collector-old" not found]'
        in err.details()
    )


def test_hmac_tokens_are_refused_when_only_kubernetes_tokens_are_accepted(
    k8s: tuple[Cluster, AggregatorHandle, KubeStandin],
) -> None:
    cluster, agg, _ = k8s
    err = refused(agg, cluster.secrets.collector_token("gpu-a"), "gpu-a")
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "takes only Kubernetes ServiceAccount tokens" in err.details()


def test_the_shared_fleet_secret_on_a_node_is_an_explicit_opt_in(tmp_path: object) -> None:
    with pytest.raises(ValueError, match="allow_shared_secret = true"):
        CollectorConfig(node="gpu-a", secret_file="/etc/gpufleet/collector-secret")
    CollectorConfig(node="gpu-a", secret_file="/etc/gpufleet/collector-secret", allow_shared_secret=True)


def test_a_token_bound_to_no_pod_incarnation_is_refused(
    k8s: tuple[Cluster, AggregatorHandle, KubeStandin],
) -> None:
    _, agg, kube = k8s
    token = kube.issue_token("gpufleet", SA, "collector-gpu-a", [AUDIENCE], bind_uid=False)
    err = refused(agg, token, "gpu-a")
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "but no pod uid" in err.details(), err.details()


def test_a_reviewed_token_is_trusted_no_longer_than_it_is_valid(
    k8s: tuple[Cluster, AggregatorHandle, KubeStandin],
) -> None:
    """The review of a token is remembered, but never past the token's `exp`: the open stream
    ends when it expires, and a new one with it is refused, though the cache is younger than
    its 60 s."""
    _, agg, kube = k8s
    token = kube.issue_token("gpufleet", SA, "collector-gpu-b", [AUDIENCE], expires_in_s=3)
    s = RawStream(agg.ingest, token)
    s.send(hello("gpu-b"))
    assert s.recv().WhichOneof("body") == "welcome"
    s.send(report("gpu-b", 1))
    assert list(s.recv().ack.seqs) == [1]
    exp = kube.tokens[token]["exp"]
    wait_until(lambda: time.time() > exp + 0.2, 10, "the token to expire")
    s.send(report("gpu-b", 2))
    with pytest.raises(grpc.RpcError) as info:
        while True:
            s.recv()
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED and "expired" in info.value.details()
    s.close()
    err = refused(agg, token, "gpu-b")
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED and "expired" in err.details(), err.details()
