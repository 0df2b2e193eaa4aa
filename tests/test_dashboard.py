"""The dashboard's pages, run with Streamlit's AppTest against a real aggregator and a real
simulated collector (the browser test comes with the dashboard issue)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Cluster, free_port, wait_until

from gpufleet.protos import fleet_pb2

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parent.parent / "dashboard" / "app.py")


def app(monkeypatch: pytest.MonkeyPatch, fleet: str, token: str) -> AppTest:
    import streamlit as st

    st.cache_resource.clear()  # the Fleet API client is cached per process
    monkeypatch.setenv("GPUFLEET_FLEET", fleet)
    monkeypatch.setenv("GPUFLEET_TOKEN", token)
    monkeypatch.setenv("GPUFLEET_CLIENT_CONFIG", "/nonexistent/client.toml")
    return AppTest.from_file(APP, default_timeout=60)


def test_overview_node_and_history_pages(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    agg = cluster.aggregator()
    cluster.collector("dash-1", agg.ingest, "--interval-s", "0.2", "--sim-gpus", "4", "--sim-engine", "vllm")
    cluster.collector("dash-2", agg.ingest, "--interval-s", "0.2", "--sim-gpus", "4")
    viewer = cluster.secrets.tokens["viewer"]
    stub = agg.fleet_stub()
    wait_until(
        lambda: (
            len(
                stub.ListNodes(
                    fleet_pb2.ListNodesRequest(), metadata=(("authorization", f"Bearer {viewer}"),)
                ).nodes
            )
            == 2
            and len(
                stub.QueryHistory(
                    fleet_pb2.HistoryRequest(metric="util_gpu_pct", nodes=["dash-1"]),
                    metadata=(("authorization", f"Bearer {viewer}"),),
                ).series
            )
            == 4
        ),
        30,
        "two nodes with history",
    )
    at = app(monkeypatch, agg.fleet, viewer).run()
    assert not at.exception, at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["nodes"] == "2" and metrics["reporting"] == "2" and metrics["GPUs"] == "8"
    assert metrics["GPUs lost"] == "0" and metrics["fleet mean utilization"].endswith("%")
    table = at.dataframe[0].value
    assert list(table["node"]) == ["dash-1", "dash-2"] and list(table["GPUs"]) == [4, 4]

    at.sidebar.radio[0].set_value("Node").run()
    assert not at.exception, at.exception
    gpus = at.dataframe[1].value
    assert list(gpus["gpu"]) == [0, 1, 2, 3] and gpus["uuid"].str.startswith("GPU-").all()
    engines = at.dataframe[2].value
    assert list(engines["engine"]) == ["vllm"] and list(engines["status"]) == ["ok"]
    assert 0 <= engines["KV-cache usage"][0] <= 1 and engines["GPUs"][0] == "0,1,2,3"
    at.selectbox[0].set_value("dash-2").run()
    assert any("No inference engines" in c.value for c in at.caption)

    at.sidebar.radio[0].set_value("History explorer").run()
    assert not at.exception, at.exception
    history = at.dataframe[0].value
    assert {"time", "series", "util_gpu_pct", "node", "gpu"} <= set(history.columns)
    assert set(history["node"]) == {"dash-1", "dash-2"}


def test_unreachable_aggregator_is_a_plain_error(monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(monkeypatch, f"127.0.0.1:{free_port()}", "whatever").run()
    assert not at.exception
    assert any("cannot reach the Fleet API" in e.value for e in at.error)


def test_rejected_token_is_a_plain_error(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    agg = cluster.aggregator()
    at = app(monkeypatch, agg.fleet, "gfv1_wrong").run()
    assert not at.exception
    assert any("rejected the credential" in e.value for e in at.error)
