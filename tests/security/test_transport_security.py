"""In transit (docs/security.md "In transit"): no plaintext port off loopback unless asked for,
no collector sending its token in clear to another host, and mTLS: a collector proves its node
with a client certificate whose name is the node, and only that node."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import grpc
import pytest

from gpufleet.protos import fleet_pb2, fleet_pb2_grpc
from harness.pki import Pki
from harness.processes import Cluster, gpufleet_argv
from harness.streams import RawStream, hello
from harness.waiting import wait_until


def test_a_plaintext_port_off_loopback_is_refused_unless_allowed(cluster: Cluster) -> None:
    base = gpufleet_argv(
        "aggregator",
        "run",
        "--data-dir",
        str(cluster.tmp / "data"),
        "--secrets-file",
        str(cluster.secrets_path),
        "--ingest-listen",
        "0.0.0.0:0",
        "--fleet-listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "",
    )
    out = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out
    assert "refusing to listen on 0.0.0.0:0 without TLS" in out.stderr, out.stderr
    assert "tls_cert" in out.stderr and "allow_plaintext" in out.stderr
    ready = cluster.tmp / "ready.json"
    proc = cluster.spawn("plain", [*base, "--allow-plaintext", "--ready-file", str(ready)])
    wait_until(lambda: ready.exists() or not proc.alive(), 30, "the aggregator to start")
    assert proc.alive(), proc.log()
    assert "in plaintext (allow_plaintext = true)" in proc.log()


def test_a_collector_does_not_send_its_token_in_clear_to_another_host(tmp_path: Path) -> None:
    out = subprocess.run(
        gpufleet_argv(
            "collector", "run", "--simulate", "--node", "n1", "--aggregator", "10.255.0.1:7710",
            "--metrics-listen", "",
        ),
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )  # fmt: skip
    assert out.returncode == 2, out
    assert "aggregator 10.255.0.1:7710 is not on this machine and tls_ca is not set" in out.stderr, out.stderr


def test_an_mtls_collector_is_accepted_for_its_own_node_only(cluster: Cluster, tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    key, cert = pki.server()
    a_key, a_cert = pki.client("cert-node-a")
    agg = cluster.aggregator(
        "aggregator",
        0,
        0,
        None,
        "--tls-cert",
        str(cert),
        "--tls-key",
        str(key),
        "--tls-client-ca",
        str(pki.ca),
        "--collector-auth",
        "mtls",
    )
    # No token at all: the certificate is the credential.
    cluster.collector(
        "cert-node-a",
        agg.ingest,
        "--interval-s",
        "0.2",
        "--tls-ca",
        str(pki.ca),
        "--tls-client-cert",
        str(a_cert),
        "--tls-client-key",
        str(a_key),
        token="",
    )
    ca = pki.ca.read_bytes()
    stub = fleet_pb2_grpc.FleetStub(grpc.secure_channel(agg.fleet, grpc.ssl_channel_credentials(ca)))
    meta = cluster.secrets.metadata()

    def reporting() -> bool:
        nodes = stub.ListNodes(fleet_pb2.ListNodesRequest(), metadata=meta, timeout=5).nodes
        return any(n.node == "cert-node-a" and n.last_seq >= 2 for n in nodes)

    wait_until(reporting, 30, "the certificate-authenticated collector to report")
    with_a = grpc.ssl_channel_credentials(ca, a_key.read_bytes(), a_cert.read_bytes())
    # Node A's certificate, a hello for node B.
    err = _refused(RawStream(agg.ingest, None, with_a), "cert-node-b")
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "belongs to the collector on node 'cert-node-a', not 'cert-node-b'" in err.details(), err.details()
    # Node A's certificate, claiming to be node B in the metadata.
    err = _refused(RawStream(agg.ingest, None, with_a, (("x-gpufleet-node", "cert-node-b"),)), "cert-node-b")
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "names 'cert-node-a', not node 'cert-node-b'" in err.details(), err.details()
    # No client certificate: the TLS handshake itself fails.
    no_cert = grpc.ssl_channel_credentials(ca)
    err = _refused(
        RawStream(agg.ingest, cluster.secrets.collector_token("cert-node-a"), no_cert), "cert-node-a"
    )
    assert err.code() == grpc.StatusCode.UNAVAILABLE, err
    out = subprocess.run(
        gpufleet_argv("nodes", "--json", "--fleet", agg.fleet, "--token", cluster.secrets.tokens["viewer"]),
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GPUFLEET_TLS_CA": str(pki.ca)},
    )
    assert out.returncode == 0, out.stderr
    assert [n["node"] for n in json.loads(out.stdout)["nodes"]] == ["cert-node-a"]


def _refused(s: RawStream, node: str) -> grpc.RpcError:
    s.send(hello(node))
    with pytest.raises(grpc.RpcError) as info:
        while True:
            s.recv(15)
    s.close()
    return info.value
