"""Repair end to end on a real Slurm: simulated collectors with injected faults, the real
aggregator, real slurmctld/slurmd, a real HTTP alert receiver."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.alert_receiver import AlertReceiver
from harness.processes import Cluster
from harness.repair import (
    FAST_POLICY,
    audit,
    drained,
    gpufleet_cli,
    incidents,
    lines,
    repair_aggregator,
    repair_status,
    slurm_args,
    xid_scenario,
)
from harness.waiting import wait_until


@pytest.mark.slow
def test_xid79_is_drained_reset_rebooted_validated_and_resumed(
    alert_receiver: Callable[..., AlertReceiver], cluster: Cluster, slurm: Any
) -> None:
    node = "gpu-node-01"
    receiver = alert_receiver()
    agg = repair_aggregator(
        cluster, *slurm_args(slurm, cluster), "--alert-webhooks", receiver.url, "--alert-group-wait-s", "0.5"
    )
    resets = cluster.tmp / "resets.txt"
    reset = f"sh -c 'echo {{gpu_index}} >> {resets}'"
    scenario = xid_scenario(cluster.tmp / "xid79.toml", 79, gpu=3, lost=True)
    collector = cluster.collector(
        node, agg.ingest, "--interval-s", "1", "--sim-scenario", str(scenario), "--reset-command", reset
    )

    wait_until(lambda: drained(slurm, node), 30, "the node drained in Slurm")
    reason = slurm.state(node)[1]
    assert reason.startswith("gpufleet: xid_79 on GPU 3"), reason
    assert not drained(slurm, "gpu-node-02"), "only the faulty node is drained"

    # The GPU reset runs on the node, through the collector; the GPU stays lost, so the
    # workflow goes on to the reboot hook.
    wait_until(lambda: lines(resets) == ["3"], 30, "the GPU reset on the node")
    wait_until(lambda: lines(cluster.tmp / "reboots.txt") == [node], 30, "the reboot hook")
    assert drained(slurm, node), "still out of service while it reboots"

    # The "reboot": the node goes down and comes back with a fresh collector and healthy GPUs.
    collector.stop(signal.SIGKILL)
    cluster.collector(node, agg.ingest, "--interval-s", "1", "--reset-command", reset)

    wait_until(lambda: not drained(slurm, node), 60, "the node resumed in Slurm after validation")
    (incident,) = incidents(agg, cluster, "--all")
    assert not incident["open"] and incident["outcome"] == "repaired by reboot"
    assert {f["code"] for f in incident["findings"]} >= {"xid_79", "gpu_lost"}
    steps = [(a["action"], a["outcome"]) for a in audit(agg, cluster, node)]
    assert ("cordon", "ok") in steps and ("uncordon", "ok") in steps
    order = [a for a, _ in steps]
    assert (
        order.index("cordon")
        < order.index("drain")
        < order.index("reset_gpu")
        < order.index("reboot")
        < order.index("uncordon")
    ), order
    assert ("validate", "failed") in steps, "the reset was checked and found not to help"
    assert lines(resets) == ["3"], "the reset was done once"

    # One alert identity for the incident: fired, updated through the states, resolved.
    wait_until(
        lambda: any(a["status"] == "resolved" for a in receiver.for_key(incident["id"])),
        30,
        "the resolved alert",
    )
    alerts = receiver.for_key(incident["id"])
    assert alerts[0]["status"] == "firing" and alerts[0]["node"] == node
    assert alerts[-1]["status"] == "resolved" and "repaired by reboot" in alerts[-1]["summary"]


@pytest.mark.slow
def test_application_xid_does_not_cordon(cluster: Cluster, slurm: Any) -> None:
    node = "gpu-node-02"
    agg = repair_aggregator(cluster, *slurm_args(slurm, cluster))
    scenario = xid_scenario(cluster.tmp / "xid13.toml", 13, gpu=0)
    cluster.collector(node, agg.ingest, "--interval-s", "1", "--sim-scenario", str(scenario))

    def seen() -> dict[str, Any] | None:
        status = json.loads(gpufleet_cli(agg, cluster, "viewer", "breaker", "status", "--json").stdout)
        return next((n for n in status["nodes"] if n["node"] == node), None)

    finding = wait_until(seen, 30, "the XID 13 finding")["findings"][0]
    assert finding["code"] == "xid_13" and finding["action"] == "RESTART_APP" and not finding["cordon"]
    assert finding["severity"] == "info"
    # The finding is evaluated on every pass; several passes later the node is still in service.
    passes_then = agg.metric_value("gpufleet_repair_passes_total")
    wait_until(lambda: agg.metric_value("gpufleet_repair_passes_total") > passes_then + 5, 20, "more passes")
    assert not drained(slurm, node)
    assert incidents(agg, cluster, "--all") == []
    assert [a for a in audit(agg, cluster) if a["action"] == "cordon"] == []


@pytest.mark.slow
def test_xid_storm_trips_the_breaker_within_the_cap_and_pages_once(
    alert_receiver: Callable[..., AlertReceiver], cluster: Cluster, slurm: Any
) -> None:
    nodes = [f"gpu-node-0{i}" for i in range(1, 6)]  # a fleet of 5; 3 (60 %) fail at once
    receiver = alert_receiver()
    agg = repair_aggregator(
        cluster,
        *slurm_args(slurm, cluster),
        "--alert-webhooks",
        receiver.url,
        "--alert-group-wait-s",
        "3",
        "--repair-max-out-of-service",
        "1",
        "--repair-breaker-nodes",
        "2",
        "--repair-breaker-window-s",
        "60",
    )
    scenario = xid_scenario(cluster.tmp / "storm.toml", 79, gpu=1, lost=True, at_s=2.0)
    for node in nodes:
        faulty = node in nodes[:3]
        cluster.collector(
            node, agg.ingest, "--interval-s", "1", *(["--sim-scenario", str(scenario)] if faulty else [])
        )

    status = wait_until(
        lambda: (s := repair_status(agg, cluster))["breaker_tripped"] and s, 30, "the breaker to trip"
    )
    assert "2 nodes failed within 60 s" in status["breaker_reason"]
    # All three incidents are open and their alerts held: the storm is one page.
    wait_until(lambda: agg.metric_value("gpufleet_alerts_held") == 3, 30, "three incident alerts held")
    wait_until(lambda: len(receiver.received) >= 1, 30, "the breaker alert")
    assert [a["key"] for a in receiver.received] == ["breaker"]
    held_at_trip = set(receiver.received[0]["details"]["held_incidents"].values())
    assert len(held_at_trip) >= 2 and held_at_trip <= set(nodes[:3])
    assert sum(drained(slurm, n) for n in nodes) <= 1, "no more than the cap out of service"

    # It stays tripped, pass after pass, and nothing more is taken out.
    passes = agg.metric_value("gpufleet_repair_passes_total")
    wait_until(
        lambda: agg.metric_value("gpufleet_repair_passes_total") > passes + 10, 30, "more repair passes"
    )
    assert repair_status(agg, cluster)["breaker_tripped"]
    assert sum(drained(slurm, n) for n in nodes) <= 1
    assert len(receiver.received) == 1

    # A viewer cannot reset it; an operator can, with a reason that lands in the audit log.
    denied = gpufleet_cli(agg, cluster, "viewer", "breaker", "reset", "--reason", "storm over")
    assert denied.returncode == 4 and "permission denied" in denied.stderr
    reset = gpufleet_cli(agg, cluster, "ops", "breaker", "reset", "--reason", "storm over: PSU replaced")
    assert reset.returncode == 0, reset.stderr
    assert not repair_status(agg, cluster)["breaker_tripped"]
    entry = [a for a in audit(agg, cluster) if a["action"] == "breaker_reset"][-1]
    assert entry["actor"] == "ops" and entry["reason"] == "storm over: PSU replaced"
    wait_until(
        lambda: any(a["key"] == "breaker" and a["status"] == "resolved" for a in receiver.received),
        30,
        "the breaker's resolved alert",
    )


@pytest.mark.slow
def test_a_persons_cordon_wins_and_their_uncordon_cancels_the_workflow(cluster: Cluster, slurm: Any) -> None:
    human, auto = "gpu-node-04", "gpu-node-05"
    policy = FAST_POLICY + '\n[buckets.RESTART_BM]\nladder = ["ticket"]\n'  # XID 79 → ticket → quarantine
    # A fleet of two, one drained by a person: the cap (a fraction of the fleet) would hold the
    # other back, so it is lifted here.
    agg = repair_aggregator(
        cluster, *slurm_args(slurm, cluster), "--repair-max-out-of-service-fraction", "1", policy=policy
    )
    slurm.scontrol("update", f"NodeName={human}", "State=DRAIN", "Reason=alice: checking cables")
    scenario = xid_scenario(cluster.tmp / "x.toml", 79, gpu=2, lost=True)
    for node in (human, auto):
        cluster.collector(node, agg.ingest, "--interval-s", "1", "--sim-scenario", str(scenario))

    # The automation quarantines the node it cordoned, and leaves the person's drain alone: the
    # drain is seen at the controller's next read of Slurm, which may come a pass after the other
    # node's quarantine (a fresh-clone run read the status between the two).
    def settled() -> dict[str, dict[str, Any]] | None:
        states = {n["node"]: n for n in repair_status(agg, cluster)["nodes"]}
        both = states.get(auto, {}).get("state") == "quarantined" and human in states
        return states if both and states[human]["state"] != "healthy" else None

    states = wait_until(settled, 30, "the auto-cordoned node quarantined, the person's drain seen")
    assert states[human]["state"] == "human_cordoned"
    assert slurm.state(human)[1] == "alice: checking cables", "the person's reason is untouched"
    assert slurm.state(auto)[1].startswith("gpufleet: ")

    # The person looks once both faults are showing: the lost GPU is seen at the sampling tick after
    # the XID, and a ticket-only ladder can quarantine the node before that tick (a resume then
    # would come before the lost GPU was ever a finding, which may rightly cordon it again).
    wait_until(
        lambda: (
            {"xid_79", "gpu_lost"}
            <= {
                f["code"]
                for n in repair_status(agg, cluster)["nodes"]
                if n["node"] == auto
                for f in n["findings"]
            }
        ),
        30,
        "both findings active on the quarantined node",
    )
    # A person resumes the quarantined node in Slurm: the workflow is cancelled, and the same
    # findings do not cordon it again.
    slurm.scontrol("update", f"NodeName={auto}", "State=RESUME")
    wait_until(lambda: incidents(agg, cluster) == [], 30, "the incident closed")
    (closed,) = [i for i in incidents(agg, cluster, "--all") if i["node"] == auto]
    assert closed["outcome"] == "cancelled: a person uncordoned the node"
    passes = agg.metric_value("gpufleet_repair_passes_total")
    wait_until(
        lambda: agg.metric_value("gpufleet_repair_passes_total") > passes + 10, 30, "more repair passes"
    )
    assert not drained(slurm, auto), "the automation does not fight the person's decision"
    assert drained(slurm, human) and slurm.state(human)[1] == "alice: checking cables"
    cordons = [
        a
        for a in audit(agg, cluster)
        if a["action"] == "cordon" and a["actor"] == "automation" and a["outcome"] == "ok"
    ]
    assert [a["node"] for a in cordons] == [auto]


@pytest.mark.slow
def test_manual_cordon_and_uncordon_through_the_fleet_api(cluster: Cluster, slurm: Any) -> None:
    node = "gpu-node-06"
    agg = repair_aggregator(cluster, *slurm_args(slurm, cluster))
    cluster.collector(node, agg.ingest, "--interval-s", "1")
    wait_until(lambda: gpufleet_cli(agg, cluster, "viewer", "node", node).returncode == 0, 30, "the node")

    denied = gpufleet_cli(agg, cluster, "viewer", "cordon", node, "--reason", "want to")
    assert denied.returncode == 4 and "PERMISSION" in denied.stderr.upper(), denied.stderr
    assert not drained(slurm, node)
    unknown = gpufleet_cli(agg, cluster, "ops", "cordon", "no-such-node", "--reason", "x")
    assert unknown.returncode == 5 and "not known" in unknown.stderr

    done = gpufleet_cli(agg, cluster, "ops", "cordon", node, "--reason", "firmware update", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"] == "human_cordoned"
    assert slurm.state(node)[1] == "gpufleet-manual [ops]: firmware update"
    nodes = json.loads(gpufleet_cli(agg, cluster, "viewer", "nodes", "--json").stdout)["nodes"]
    assert [n["health"] for n in nodes if n["node"] == node] == ["human_cordoned"]

    done = gpufleet_cli(agg, cluster, "ops", "uncordon", node, "--reason", "firmware done")
    assert done.returncode == 0, done.stderr
    assert not drained(slurm, node)
    trail = [(a["actor"], a["action"], a["reason"], a["outcome"]) for a in audit(agg, cluster, node)]
    assert trail == [("ops", "cordon", "firmware update", "ok"), ("ops", "uncordon", "firmware done", "ok")]


@pytest.mark.slow
def test_aggregator_killed_mid_reset_resumes_without_repeating_it(cluster: Cluster, slurm: Any) -> None:
    from harness.processes import free_port

    node = "gpu-node-07"
    ingest_port, fleet_port = free_port(), free_port()
    args = [*slurm_args(slurm, cluster)]
    policy_file = cluster.tmp / "policy.toml"
    policy_file.write_text(FAST_POLICY)
    extra = ["--repair-policy-file", str(policy_file), "--repair-interval-s", "0.2", *args]
    data = cluster.tmp / "agg-data"
    agg = cluster.aggregator("agg1", ingest_port, fleet_port, data, *extra)
    resets = cluster.tmp / "resets.txt"
    # A slow reset: the aggregator is killed while it runs, so its result never reaches it.
    reset = f"sh -c 'echo {{gpu_index}} >> {resets}; sleep 3'"
    scenario = xid_scenario(cluster.tmp / "x.toml", 79, gpu=5, lost=True)
    collector = cluster.collector(
        node, agg.ingest, "--interval-s", "1", "--sim-scenario", str(scenario), "--reset-command", reset
    )
    wait_until(lambda: lines(resets) == ["5"], 30, "the reset to start")
    agg.proc.stop(signal.SIGKILL)

    agg = cluster.aggregator("agg2", ingest_port, fleet_port, data, *extra)
    wait_until(lambda: lines(cluster.tmp / "reboots.txt") == [node], 60, "the reboot after the restart")
    assert lines(resets) == ["5"], "the reset was not sent again"
    collector.stop(signal.SIGKILL)
    cluster.collector(node, agg.ingest, "--interval-s", "1", "--reset-command", reset)
    wait_until(lambda: not drained(slurm, node), 60, "the node resumed")
    assert lines(resets) == ["5"] and lines(cluster.tmp / "reboots.txt") == [node]
    resumed = [a for a in audit(agg, cluster, node) if a["outcome"] == "unknown"]
    assert resumed and resumed[0]["action"] == "reset_gpu" and "not repeated" in resumed[0]["reason"]


@pytest.mark.slow
def test_scheduler_names_map_collector_nodes_to_slurm_nodes(
    cluster: Cluster, slurm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Collector names that are not Slurm NodeNames: a pattern maps `gpu-node-03.dc1.example.com`
    to gpu-node-03, a table maps `rack7-slot2` to gpu-node-04. The automation's drain, a person's
    cordon and uncordon, and the node's detail all go through the mapping."""
    table = cluster.tmp / "scheduler-names.toml"
    table.write_text('[nodes]\n"rack7-slot2" = "gpu-node-04"\n')
    agg = repair_aggregator(
        cluster,
        *slurm_args(slurm, cluster),
        "--scheduler-name-regex",
        r"(gpu-node-\d+)\.dc1\.example\.com",
        "--scheduler-name-replace",
        r"\1",
        "--scheduler-names-file",
        str(table),
    )
    faulty, by_hand = "gpu-node-03.dc1.example.com", "rack7-slot2"
    scenario = xid_scenario(cluster.tmp / "xid79.toml", 79, gpu=1, lost=True)
    cluster.collector(faulty, agg.ingest, "--interval-s", "1", "--sim-scenario", str(scenario))
    cluster.collector(by_hand, agg.ingest, "--interval-s", "1")

    wait_until(lambda: drained(slurm, "gpu-node-03"), 30, "gpu-node-03 drained in Slurm for its collector")
    assert slurm.state("gpu-node-03")[1].startswith("gpufleet: xid_79 on GPU 1")
    (incident,) = incidents(agg, cluster)
    assert incident["node"] == faulty, "gpufleet keeps the collector's name"

    out = gpufleet_cli(agg, cluster, "ops", "cordon", by_hand, "--reason", "bad fan, ticket HW-1")
    assert out.returncode == 0, out.stderr
    assert drained(slurm, "gpu-node-04") and "bad fan" in slurm.state("gpu-node-04")[1]
    shown = json.loads(gpufleet_cli(agg, cluster, "viewer", "nodes", "--json").stdout)["nodes"]
    assert {n["node"]: n["scheduler_node"] for n in shown} == {faulty: "gpu-node-03", by_hand: "gpu-node-04"}
    assert "in the scheduler: gpu-node-04" in gpufleet_cli(agg, cluster, "viewer", "node", by_hand).stdout
    # The node page says which scheduler node it is (Streamlit's AppTest on the real aggregator).
    from harness.dashboard import app

    at = app(monkeypatch, agg.fleet, cluster.secrets.tokens["viewer"]).run()
    at.sidebar.radio[0].set_value("Node").run()
    at.selectbox[0].set_value(faulty).run()
    assert not at.exception, at.exception
    from gpufleet.dashboard.look import md  # the caption's Markdown source escapes the name

    assert any(f"In the scheduler: **{md('gpu-node-03')}**" in c.value for c in at.caption)
    out = gpufleet_cli(agg, cluster, "ops", "uncordon", by_hand, "--reason", "fan replaced")
    assert out.returncode == 0, out.stderr
    assert not drained(slurm, "gpu-node-04")
    assert not drained(slurm, "gpu-node-01") and not drained(slurm, "gpu-node-02"), "no other node touched"


def test_scheduler_name_settings_refuse_what_cannot_work(tmp_path: Path) -> None:
    from gpufleet.aggregator.config import AggregatorConfig

    with pytest.raises(ValueError, match="scheduler_name_regex and scheduler_name_replace go together"):
        AggregatorConfig(scheduler_name_regex="(.*)")
    with pytest.raises(ValueError, match=r"scheduler_name_regex='\(' is not a regular expression"):
        AggregatorConfig(scheduler_name_regex="(", scheduler_name_replace="x")
    with pytest.raises(ValueError, match="does not fit"):
        AggregatorConfig(scheduler_name_regex="(a)", scheduler_name_replace=r"\2")
    clash = tmp_path / "names.toml"
    clash.write_text('[nodes]\na = "n1"\nb = "n1"\n')
    with pytest.raises(ValueError, match="several collector nodes to 'n1'"):
        AggregatorConfig(scheduler_names_file=str(clash))
    with pytest.raises(ValueError, match="cannot be read"):
        AggregatorConfig(scheduler_names_file=str(tmp_path / "missing.toml"))
    not_a_table = tmp_path / "flat.toml"
    not_a_table.write_text('nodes = "n1"\n')
    with pytest.raises(ValueError, match=r"\[nodes\] must map collector node names"):
        AggregatorConfig(scheduler_names_file=str(not_a_table))
    empty = tmp_path / "empty.toml"
    empty.write_text('[nodes]\na = ""\n')
    with pytest.raises(ValueError, match=r"\['a'\] is not"):
        AggregatorConfig(scheduler_names_file=str(empty))
