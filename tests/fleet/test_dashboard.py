"""The dashboard's pages, run with Streamlit's AppTest against a real aggregator and a real
simulated collector (the browser test comes with the dashboard issue)."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pandas as pd
import pytest

from gpufleet.dashboard.data import NODE_GPU_GLANCE
from gpufleet.protos import fleet_pb2
from gpufleet.protos.names import health_name
from harness.processes import Cluster, free_port
from harness.repair import audit, gpufleet_cli

pytest.importorskip("streamlit")
from harness.dashboard import app
from harness.fleets import fleet_of_200_nodes, fleet_with_a_quarantined_node


def viewer_meta(cluster: Cluster) -> tuple[tuple[str, str], ...]:
    return cluster.secrets.metadata()


def test_every_page_against_a_simulated_fleet(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    agg = fleet_with_a_quarantined_node(cluster)
    at = app(monkeypatch, agg.fleet, cluster.secrets.tokens["viewer"]).run()
    assert not at.exception, at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["nodes"] == "2" and metrics["GPUs in service"] == "4"
    assert metrics["GPUs out of service"] == "4"
    in_repair = next(m for m in at.metric if m.label == "GPUs out of service").delta
    assert in_repair == "0 in repair", in_repair
    # One meaning of "out of service", in nodes, on the overview, the Repairs page and the CLI.
    assert metrics["nodes out of service"] == "1" and metrics["GPUs silent"] == "0"
    breaker = gpufleet_cli(agg, cluster, "viewer", "breaker", "status")
    assert "nodes out of service: 1 of a cap of" in breaker.stdout, breaker.stdout
    # Quarantined with steps skipped for want of a command: the node's detail says which, and what
    # to set (issue 55: the demo's skipped reboot said nothing on screen).
    assert "reboot skipped: no repair_reboot_command set" in breaker.stdout, breaker.stdout
    assert metrics["fleet mean utilization"].endswith("%")
    table = at.dataframe[0].value
    assert list(table["node"]) == ["dash-1", "dash-2"] and list(table["state"]) == ["healthy", "quarantined"]
    at.multiselect[2].set_value(["quarantined"]).run()  # the state filter
    assert list(at.dataframe[0].value["node"]) == ["dash-2"]

    at.sidebar.radio[0].set_value("Inference").run()
    assert not at.exception, at.exception
    assert any("KV-bound" in m.value and "compute-bound" in m.value for m in at.markdown), (
        "the rule is stated"
    )
    pools = at.dataframe[0].value  # the aggregator's pools: one model, one replica
    assert list(pools["serving"]) == [1] and list(pools["headroom replicas"]) == [0]
    replicas = at.dataframe[1].value
    assert list(replicas["node"]) == ["dash-1"] and list(replicas["engine"]) == ["vllm"]
    assert replicas["class"][0] in ("KV-bound", "compute-bound", "light", "idle")
    assert 0 <= replicas["KV %"][0] <= 100 and replicas["GPUs"][0] == "0,1,2,3"

    at.sidebar.radio[0].set_value("Failures and repairs").run()
    assert not at.exception, at.exception
    assert any("Repair breaker ok" in s.value for s in at.success)
    assert {m.label: m.value for m in at.metric}["nodes out of service"] == metrics["nodes out of service"]
    queue = at.dataframe[0].value
    assert list(queue["node"]) == ["dash-2"] and list(queue["workflow"]) == ["quarantined"]
    incidents = at.dataframe[1].value
    assert list(incidents["node"]) == ["dash-2"] and "xid_79" in incidents["findings"][0]
    steps = at.dataframe[3].value  # the chosen incident's actions
    assert {"cordon", "reset_gpu"} <= set(steps["action"])
    audit = at.dataframe[4].value
    assert "cordon" in set(audit["action"]) and set(audit["who"]) == {"automation"}

    at.sidebar.radio[0].set_value("Node").run()
    assert not at.exception, at.exception
    assert any("need an operator token" in c.value for c in at.caption), "a viewer sees no actions"
    glance, gpus = at.dataframe[0].value, at.dataframe[1].value  # the table, then every column of it
    assert list(glance.columns) == [c for c in NODE_GPU_GLANCE if c in gpus.columns], glance.columns
    assert glance.equals(gpus[glance.columns])
    assert list(gpus["GPU"]) == [0, 1, 2, 3] and gpus["UUID"].str.startswith("GPU-").all()
    # People's column names with units, values rounded as a person reads them.
    assert {"GPU util %", "HBM used GiB", "HBM used %", "temp °C", "power W"} <= set(gpus.columns)
    assert all(v == round(v, 1) for v in gpus["HBM used %"].dropna())
    assert all(v == round(v) for v in gpus["power W"].dropna())
    assert not any("_" in c for c in gpus.columns), "no raw field names"
    engines = at.dataframe[2].value
    assert list(engines["engine"]) == ["vllm"] and list(engines["status"]) == ["ok"]
    at.selectbox[0].set_value("dash-2").run()
    assert not at.exception, at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["state"] == "quarantined"
    assert_node_events(at.dataframe[2].value)
    assert any("No inference engines found on this node" in c.value for c in at.caption)
    node_incidents = at.dataframe[3].value
    assert list(node_incidents["workflow"]) == ["quarantined"]

    at.sidebar.radio[0].set_value("History explorer").run()
    assert not at.exception, at.exception
    history = at.dataframe[0].value
    assert {"time", "series", "util_gpu_pct", "node", "gpu"} <= set(history.columns)
    assert set(history["node"]) == {"dash-1", "dash-2"}
    at.multiselect[1].set_value([2]).run()  # GPU 2 only
    assert set(at.dataframe[0].value["gpu"]) == {"2"}


def assert_node_events(events: Any) -> None:
    """dash-2's stored events, as the node page lists them: the XID, the findings, the repairs."""
    xids = events[events["kind"] == "xid"]
    assert list(xids["what"]) == ["XID 79"] and list(xids["gpu"]) == [1]
    assert "gpu_lost" in set(events["kind"])
    health = events[events["kind"] == "health"]
    assert {"xid_79", "gpu_lost"} <= set(health["source"])
    repairs = events[events["kind"] == "repair"]
    assert "cordon ok" in set(repairs["what"])
    assert any(w.startswith("reset_gpu failed: GPU 1") for w in repairs["what"]), list(repairs["what"])
    assert list(events["time"]) == sorted(events["time"]), "oldest first"


@pytest.mark.slow
def test_node_page_events_survive_an_aggregator_restart(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node page's events come from history: after the aggregator restarts (its live view
    empty of events; the collectors cannot reach the new one), dash-2 still shows its XID,
    findings and repair actions."""
    import signal

    agg = fleet_with_a_quarantined_node(cluster)
    for proc in cluster.procs:
        proc.stop(signal.SIGTERM, timeout_s=15)
    again = cluster.aggregator("aggregator-again", 0, 0, agg.data_dir)
    detail = again.fleet_stub().GetNode(
        fleet_pb2.GetNodeRequest(node="dash-2"), metadata=cluster.secrets.metadata()
    )
    assert not [e for e in detail.recent_events if e.xid == 79], "the live view starts without the XID"
    at = app(monkeypatch, again.fleet, cluster.secrets.tokens["viewer"]).run()
    at.sidebar.radio[0].set_value("Node").run()
    at.selectbox[0].set_value("dash-2").run()
    assert not at.exception, at.exception
    assert_node_events(at.dataframe[2].value)

    # The same history from `gpufleet events`: JSON, CSV, filters by XID and kind.
    def events(*args: str) -> str:
        out = gpufleet_cli(again, cluster, "viewer", "events", "--since", "1h", *args)
        assert out.returncode == 0, out.stderr
        return out.stdout

    listed = json.loads(events("--node", "dash-2", "--json"))["events"]
    assert_node_events(pd.DataFrame(listed).assign(time=lambda f: pd.to_datetime(f["time"])))
    only = json.loads(events("--xid", "79", "--json"))["events"]
    assert [(e["node"], e["gpu"], e["what"]) for e in only] == [("dash-2", 1, "XID 79")]
    rows = list(csv.DictReader(io.StringIO(events("--kind", "repair", "--csv"))))
    assert rows and {r["kind"] for r in rows} == {"repair"} and {r["node"] for r in rows} == {"dash-2"}
    assert "XID 79" in events("--node", "dash-2")
    assert events("--node", "dash-1", "--kind", "xid").startswith("no events in")
    # Steps of one repair pass share its nanosecond: history lists them in the audit log's order
    # (issue 55: "drain ok" read before "drain_engines ok").
    stored = json.loads(events("--node", "dash-2", "--kind", "repair", "--limit", "1000", "--json"))["events"]
    logged = [(a["action"], a["outcome"]) for a in audit(again, cluster, "dash-2")]
    said = [(e["what"].split(" ", 1)[0], e["outcome"]) for e in stored]
    assert len(said) >= 3 and said == logged[: len(said)], (
        [(e["time"], e["what"]) for e in stored],
        [(a["time"], a["action"], a["outcome"]) for a in audit(again, cluster, "dash-2")],
    )  # exported: the oldest
    shown = gpufleet_cli(again, cluster, "viewer", "node", "dash-2")
    assert shown.returncode == 0 and "(from history" in shown.stdout and "XID 79" in shown.stdout
    times = [line.split()[0] for line in shown.stdout.split("(from history")[1].splitlines()[1:] if line]
    assert times == sorted(times), "oldest first, newest last"
    as_json = json.loads(gpufleet_cli(again, cluster, "viewer", "node", "dash-2", "--json").stdout)
    assert "XID 79" in {e["what"] for e in as_json["events"]} and as_json["recent_events"] == []
    bad = gpufleet_cli(again, cluster, "viewer", "events", "--since", "1h", "--until", "2h")
    assert bad.returncode == 2 and "must be before --until 2h" in bad.stderr, bad.stderr


def test_history_explorer_groups_200_nodes_into_one_line_per_cluster(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    agg = fleet_of_200_nodes(cluster)
    at = app(monkeypatch, agg.fleet, cluster.secrets.tokens["viewer"]).run()
    at.sidebar.radio[0].set_value("History explorer").run()
    assert not at.exception, at.exception
    # 1,600 GPUs: "auto" draws one line per cluster, not 1,600.
    assert any("4 groups, mean across each cluster" in c.value for c in at.caption), [
        c.value for c in at.caption
    ]
    frame = at.dataframe[0].value
    assert sorted(set(frame["series"])) == ["east", "north", "south", "west"]
    assert set(frame.columns) >= {"time", "series", "util_gpu_pct", "cluster"}
    assert "node" not in frame.columns and "gpu" not in frame.columns
    at.selectbox(key="history_aggregate").set_value("p95").run()
    at.selectbox(key="history_group_by").set_value("model").run()
    assert not at.exception, at.exception
    frame = at.dataframe[0].value
    assert sorted(set(frame["series"])) == ["H100", "H200"]
    assert frame["util_gpu_pct"].between(0, 99).all()
    at.selectbox(key="history_group_by").set_value("node").run()
    assert len(set(at.dataframe[0].value["series"])) == 200


def test_operator_uncordons_from_the_node_page(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    agg = fleet_with_a_quarantined_node(cluster)
    at = app(monkeypatch, agg.fleet, cluster.secrets.tokens["ops"]).run()
    at.sidebar.radio[0].set_value("Node").run()
    at.selectbox[0].set_value("dash-2").run()
    assert at.radio[0].value == "uncordon", "a quarantined node is offered uncordon first"
    at.button[0].click().run()  # no reason, no confirmation
    assert any("A reason is required" in e.value for e in at.error)
    at.text_input[0].set_value("GPU 1 reseated")
    at.checkbox[0].check()
    at.button[0].click().run()
    assert not at.exception, at.exception
    assert any("uncordon done, now healthy" in s.value for s in at.success), [s.value for s in at.success]
    nodes = (
        agg.fleet_stub().ListNodes(fleet_pb2.ListNodesRequest(), metadata=cluster.secrets.metadata()).nodes
    )
    assert {n.node: health_name(n.health) for n in nodes}["dash-2"] == "healthy"
    audit = agg.fleet_stub().ListAudit(
        fleet_pb2.ListAuditRequest(node="dash-2"), metadata=cluster.secrets.metadata()
    )
    assert (audit.entries[-1].actor, audit.entries[-1].action, audit.entries[-1].reason) == (
        "ops",
        "uncordon",
        "GPU 1 reseated",
    )


def test_unreachable_aggregator_is_a_plain_error(monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(monkeypatch, f"127.0.0.1:{free_port()}", "whatever").run()
    assert not at.exception
    assert any("cannot reach the Fleet API" in e.value for e in at.error)


def test_rejected_token_is_a_plain_error(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    agg = cluster.aggregator()
    at = app(monkeypatch, agg.fleet, "gfv1_wrong").run()
    assert not at.exception
    assert any("rejected the credential" in e.value for e in at.error)
