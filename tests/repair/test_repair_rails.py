"""The repair rails on the real Slurm (real slurmctld/slurmd, real batch jobs), the real
aggregator and simulated collectors: the breaker stops every automatic step in every state,
dry-run survives a restart, an unreadable scheduler means no cordon and no uncordon, the
scheduler is read within its polling budget, and alert delivery survives a restart."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.alert_receiver import AlertReceiver
from harness.processes import AggregatorHandle, Cluster, free_port
from harness.repair import (
    audit_rows,
    drained,
    gpufleet_cli,
    incidents,
    lines,
    repair_flags,
    repair_status,
    saved_state,
    slurm_args,
    xid_scenario,
)
from harness.waiting import wait_until

POLICY = """
[workflow]
validate_s = {validate_s}
reboot_timeout_s = 300.0
reset_timeout_s = 20.0
"""


def xid_collector(cluster: Cluster, agg: AggregatorHandle, node: str, xid: int = 79) -> Any:
    scenario = xid_scenario(cluster.tmp / f"{node}.toml", xid)
    return cluster.collector(node, agg.ingest, "--interval-s", "1", "--sim-scenario", str(scenario))


def job_and_fault(
    cluster: Cluster, slurm: Any, agg: AggregatorHandle, node: str, gpu: int, resets: Path
) -> str:
    """A real batch job on the node, then XID 79 on one of its GPUs; resets are logged to `resets`."""
    job = slurm.submit(node, 600)
    cluster.collector(
        node,
        agg.ingest,
        "--interval-s",
        "1",
        "--sim-scenario",
        str(xid_scenario(cluster.tmp / "x.toml", 79, gpu=gpu)),
        "--reset-command",
        f"sh -c 'echo {{gpu_index}} >> {resets}'",
    )
    return job


def read_failing_aggregator(cluster: Cluster, slurm: Any, scontrol: Any, **kwargs: Any) -> AggregatorHandle:
    return start_aggregator(
        cluster, slurm, cluster.tmp / "data", (0, 0), "--repair-slurm-scontrol", str(scontrol.path), **kwargs
    )


def state_of(agg: AggregatorHandle, cluster: Cluster, node: str) -> str:
    return next((n["state"] for n in repair_status(agg, cluster)["nodes"] if n["node"] == node), "healthy")


def start_aggregator(
    cluster: Cluster, slurm: Any, data: Path, ports: tuple[int, int], *extra: str, validate_s: float = 4.0
) -> AggregatorHandle:
    policy = cluster.tmp / "policy.toml"
    policy.write_text(POLICY.format(validate_s=validate_s))
    return cluster.aggregator(
        f"agg-{time.monotonic_ns()}",
        ports[0],
        ports[1],
        data,
        *repair_flags(policy),
        *slurm_args(slurm, cluster),
        *extra,
    )


@pytest.mark.slow
def test_breaker_holds_every_node_in_every_state_until_reset(cluster: Cluster, slurm: Any) -> None:
    draining, repairing, validating, trips = "gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"
    agg = start_aggregator(
        cluster,
        slurm,
        cluster.tmp / "data",
        (0, 0),
        "--repair-breaker-nodes",
        "4",
        validate_s=40.0,  # long enough to trip inside it on a loaded machine
    )
    resets = cluster.tmp / "resets.txt"
    reset = f"sh -c 'echo {{node}} >> {resets}'"

    def collector(node: str, *scenario: str) -> Any:
        return cluster.collector(
            node, agg.ingest, "--interval-s", "1", *scenario, "--reset-command", reset.replace("{node}", node)
        )

    # One drain at a time: the nodes that drain at once (no jobs) go first, the job's node last.
    # XID 79 with the GPU lost: the reset does not bring it back, the reboot hook runs, and the
    # workflow waits for the node to come back (a new boot).
    lost = xid_scenario(cluster.tmp / "b.toml", 79, gpu=2, lost=True)
    old_boot = cluster.collector(repairing, agg.ingest, "--interval-s", "1", "--sim-scenario", str(lost))
    wait_until(lambda: lines(cluster.tmp / "reboots.txt") == [repairing], 60, "the reboot hook")
    collector(validating, "--sim-scenario", str(xid_scenario(cluster.tmp / "c.toml", 79, gpu=3)))
    wait_until(lambda: state_of(agg, cluster, validating) == "validating", 60, "the reset node validating")
    validating_since = time.monotonic()
    job = slurm.submit(draining, 600)  # a real job: the drain waits for it
    collector(draining, "--sim-scenario", str(xid_scenario(cluster.tmp / "a.toml", 79, gpu=1)))
    wait_until(lambda: state_of(agg, cluster, draining) == "draining", 30, "the job's node draining")
    assert "DRAIN" in slurm.state(draining)[0] and slurm.state(draining)[0] & {"ALLOCATED", "MIXED"}
    collector(trips, "--sim-scenario", str(xid_scenario(cluster.tmp / "d.toml", 79, gpu=4, at_s=0.5)))
    status = wait_until(lambda: (s := repair_status(agg, cluster))["breaker_tripped"] and s, 30, "the trip")
    assert "4 nodes failed" in status["breaker_reason"]
    assert state_of(agg, cluster, validating) == "validating", "tripped inside the validation period"
    assert draining not in lines(resets), "no reset while the job runs"

    # While it is tripped, each node's next step would be due: the job ends, the rebooted node
    # comes back, the validation period runs out. None of them may happen.
    slurm.run("scancel", job)
    wait_until(lambda: not (slurm.state(draining)[0] & {"ALLOCATED", "MIXED"}), 30, "the job to end")
    old_boot.stop(signal.SIGKILL)
    cluster.collector(repairing, agg.ingest, "--interval-s", "1")
    wait_until(lambda: time.monotonic() - validating_since > 45, 60, "the validation period to run out")
    passes = agg.metric_value("gpufleet_repair_passes_total")
    wait_until(lambda: agg.metric_value("gpufleet_repair_passes_total") > passes + 20, 30, "more passes")

    states = {n: state_of(agg, cluster, n) for n in (draining, repairing, validating, trips)}
    assert states == {
        draining: "draining",
        repairing: "repairing",
        validating: "validating",
        trips: "waiting",
    }
    assert drained(slurm, validating) and not drained(slurm, trips)
    assert draining not in lines(resets)
    rows = audit_rows(agg.data_dir)
    trip = next(i for i, a in enumerate(rows) if a["action"] == "breaker_trip")
    after = [a for a in rows[trip + 1 :] if a["actor"] == "automation"]
    acted = [a for a in after if not a["outcome"].startswith("held: breaker tripped")]
    assert acted == [], f"automatic actions while the breaker was tripped: {acted}"
    held = [(a["node"], a["action"]) for a in rows if a["outcome"].startswith("held: breaker")]
    assert sorted(held) == sorted(
        [(draining, "drain"), (repairing, "validate"), (validating, "uncordon"), (trips, "cordon")]
    ), "each held step is audited once"

    # A person resets it: every workflow carries on from where it stood.
    out = gpufleet_cli(agg, cluster, "ops", "breaker", "reset", "--reason", "rack PSU replaced")
    assert out.returncode == 0, out.stderr
    wait_until(lambda: not drained(slurm, validating), 30, "the validated node returned")
    wait_until(lambda: drained(slurm, trips), 30, "the held cordon done")
    wait_until(lambda: draining in lines(resets), 30, "the drained node's GPU reset")
    wait_until(lambda: state_of(agg, cluster, repairing) in ("validating", "healthy"), 30, "validating")


@pytest.mark.slow
def test_restart_into_dry_run_touches_nothing(cluster: Cluster, slurm: Any) -> None:
    node, other = "gpu-node-05", "gpu-node-06"
    ports, data = (free_port(), free_port()), cluster.tmp / "data"
    agg = start_aggregator(cluster, slurm, data, ports)
    resets = cluster.tmp / "resets.txt"
    job = job_and_fault(cluster, slurm, agg, node, 0, resets)
    # Killed once its draining is on disk: what the restart resumes from (the Fleet API shows a
    # pass's state before the pass writes it).
    wait_until(lambda: saved_state(agg.data_dir, node) == "draining", 30, "draining behind the job, saved")
    reason = slurm.state(node)[1]
    agg.proc.stop(signal.SIGKILL)

    agg = start_aggregator(cluster, slurm, data, ports, "--repair-dry-run")
    slurm.run("scancel", job)  # the drain is done: the next step would be the reset
    xid_collector(cluster, agg, other)
    wait_until(
        lambda: any(a["node"] == other and a["outcome"] == "dry-run" for a in audit_rows(agg.data_dir)),
        30,
        "the new fault's dry-run cordon",
    )
    passes = agg.metric_value("gpufleet_repair_passes_total")
    wait_until(lambda: agg.metric_value("gpufleet_repair_passes_total") > passes + 20, 30, "more passes")
    assert slurm.state(node)[1] == reason and drained(slurm, node), "the drained node is left as it was"
    assert not drained(slurm, other), "dry-run cordons nothing"
    assert lines(resets) == [], "dry-run resets nothing"
    assert state_of(agg, cluster, node) == "draining"
    dry = [(a["node"], a["action"]) for a in audit_rows(agg.data_dir) if a["outcome"] == "dry-run"]
    assert sorted(dry) == [(node, "drain"), (other, "cordon")], "what would have been done, once each"


@pytest.mark.slow
def test_an_unreadable_scheduler_means_no_cordon_and_no_uncordon(cluster: Cluster, slurm: Any) -> None:
    node = "gpu-node-07"
    scontrol = slurm.wrapper(cluster.tmp / "scontrol")
    scontrol.fail_reads(100)
    agg = read_failing_aggregator(cluster, slurm, scontrol, validate_s=8.0)
    xid_collector(cluster, agg, node)
    wait_until(
        lambda: any(
            a["outcome"].startswith("held: the scheduler cannot be read") for a in audit_rows(agg.data_dir)
        ),
        30,
        "the cordon held",
    )
    passes = agg.metric_value("gpufleet_repair_passes_total")
    wait_until(lambda: agg.metric_value("gpufleet_repair_passes_total") > passes + 10, 30, "more passes")
    assert not drained(slurm, node)
    assert (
        "Socket timed out"
        in next(n for n in repair_status(agg, cluster)["nodes"] if n["node"] == node)["detail"]
    )
    assert not [c for c in scontrol.calls() if c.startswith("update")], "no scheduler write at all"

    scontrol.fail_reads(0)
    wait_until(lambda: drained(slurm, node), 30, "the cordon once the scheduler answers")
    wait_until(lambda: state_of(agg, cluster, node) == "validating", 30, "validating after the reset")
    scontrol.fail_reads(100)
    since = time.monotonic()
    wait_until(lambda: time.monotonic() - since > 12, 15, "longer than the validation period")
    assert drained(slurm, node), "no uncordon while the scheduler cannot be read"
    held = [
        a for a in audit_rows(agg.data_dir) if a["outcome"].startswith("held: the scheduler cannot be read")
    ]
    assert [a["action"] for a in held] == ["cordon", "uncordon"]
    scontrol.fail_reads(0)
    wait_until(lambda: not drained(slurm, node), 30, "the uncordon once the scheduler answers")


@pytest.mark.slow
def test_the_scheduler_is_read_within_its_polling_budget(cluster: Cluster, slurm: Any) -> None:
    nodes = ["gpu-node-08", "gpu-node-09", "gpu-node-10"]
    scontrol = slurm.wrapper(cluster.tmp / "scontrol")
    agg = start_aggregator(
        cluster,
        slurm,
        cluster.tmp / "data",
        (0, 0),
        "--repair-slurm-scontrol",
        str(scontrol.path),
        "--repair-observe-interval-s",
        "3",
    )
    for node in nodes:
        cluster.collector(node, agg.ingest, "--interval-s", "1")
    wait_until(lambda: agg.metric_value("gpufleet_repair_passes_total") >= 2, 30, "passes over the fleet")
    start_calls, started = len(scontrol.calls()), time.monotonic()
    passes = agg.metric_value("gpufleet_repair_passes_total")
    wait_until(lambda: time.monotonic() - started > 9, 12, "nine seconds of passes")
    calls = scontrol.calls()[start_calls:]
    passes = agg.metric_value("gpufleet_repair_passes_total") - passes
    whole = [c for c in calls if c == "-o show node"]
    # A healthy fleet: a full pass, with its whole-fleet read, every 3 s (one may straddle the
    # window); the passes between them (a node whose report poked the controller) read nothing.
    assert 2 <= len(whole) <= 4 and passes >= 2, (passes, calls)
    assert len(calls) == len(whole), f"healthy nodes are not read one by one: {calls}"


@pytest.mark.slow
def test_alerts_queued_or_sent_before_a_restart_are_delivered_and_resolved(
    alert_receiver: Callable[..., AlertReceiver], cluster: Cluster, slurm: Any
) -> None:
    node = "gpu-node-11"
    port = free_port()  # the receiver is down at first: the firing alert waits in the outbox
    ports, data = (free_port(), free_port()), cluster.tmp / "data"
    hook = ("--alert-webhooks", f"http://127.0.0.1:{port}/hook", "--alert-group-wait-s", "0.2")
    agg = start_aggregator(cluster, slurm, data, ports, *hook, validate_s=6.0)
    collector = cluster.collector(
        node,
        agg.ingest,
        "--interval-s",
        "1",
        "--sim-scenario",
        str(xid_scenario(cluster.tmp / "x.toml", 79, gpu=1, lost=True)),
    )
    wait_until(
        lambda: agg.metric_value("gpufleet_alerts_total", sink="webhook", outcome="failed_attempt") >= 1,
        30,
        "a failed delivery",
    )
    agg.proc.stop(signal.SIGKILL)

    receiver = alert_receiver(port=port)
    agg = start_aggregator(cluster, slurm, data, ports, *hook, validate_s=6.0)
    firing = wait_until(lambda: receiver.received, 30, "the queued alert delivered after the restart")
    key = firing[0]["key"]
    assert firing[0]["status"] == "firing" and firing[0]["node"] == node
    wait_until(lambda: lines(cluster.tmp / "reboots.txt") == [node], 60, "the reboot hook")
    agg.proc.stop(signal.SIGKILL)  # a second restart, with the firing sent and the incident open

    agg = start_aggregator(cluster, slurm, data, ports, *hook, validate_s=6.0)
    collector.stop(signal.SIGKILL)  # "rebooted": back with healthy GPUs and a new boot
    cluster.collector(node, agg.ingest, "--interval-s", "1")
    wait_until(lambda: not drained(slurm, node), 60, "the node repaired and returned")
    resolved = wait_until(
        lambda: [a for a in receiver.for_key(key) if a["status"] == "resolved"], 30, "the resolved alert"
    )
    assert "repaired by reboot" in resolved[0]["summary"]
    assert receiver.for_key(key)[-1]["status"] == "resolved"


@pytest.mark.slow
def test_a_persons_drain_first_seen_after_an_unreadable_pass_is_theirs_with_no_incident_left(
    cluster: Cluster, slurm: Any
) -> None:
    # The cause of the once-flaky test_a_persons_cordon_wins_and_their_uncordon_cancels_the_workflow:
    # a pass that could not read Slurm took the person's node for free, opened an incident
    # for it, and when the next pass saw the person's drain the incident was never closed.
    node = "gpu-node-12"
    slurm.scontrol("update", f"NodeName={node}", "State=DRAIN", "Reason=alice: checking cables")
    scontrol = slurm.wrapper(cluster.tmp / "scontrol")
    scontrol.fail_reads(100)
    agg = read_failing_aggregator(cluster, slurm, scontrol)
    xid_collector(cluster, agg, node)
    wait_until(lambda: state_of(agg, cluster, node) == "waiting", 30, "the cordon held: Slurm unreadable")
    scontrol.fail_reads(0)
    wait_until(lambda: state_of(agg, cluster, node) == "human_cordoned", 30, "the person's drain seen")
    wait_until(lambda: incidents(agg, cluster) == [], 30, "the incident closed as the person's")
    assert slurm.state(node)[1] == "alice: checking cables"
    assert not [c for c in scontrol.calls() if c.startswith("update")], "the person's node was never written"


@pytest.mark.slow
def test_a_real_job_holds_the_drain_and_no_reset_happens_while_it_runs(cluster: Cluster, slurm: Any) -> None:
    node = "gpu-node-13"
    agg = start_aggregator(cluster, slurm, cluster.tmp / "data", (0, 0))
    resets = cluster.tmp / "resets.txt"
    job = job_and_fault(cluster, slurm, agg, node, 6, resets)
    wait_until(lambda: state_of(agg, cluster, node) == "draining", 30, "draining")
    passes = agg.metric_value("gpufleet_repair_passes_total")
    wait_until(lambda: agg.metric_value("gpufleet_repair_passes_total") > passes + 10, 30, "more passes")
    words = slurm.state(node)[0]
    assert "DRAIN" in words and words & {"ALLOCATED", "MIXED"}, f"DRAINING: the job still runs ({words})"
    assert lines(resets) == [] and state_of(agg, cluster, node) == "draining"
    slurm.run("scancel", job)
    wait_until(lambda: lines(resets) == ["6"], 30, "the reset once the job is gone (DRAINED)")
    steps = [(a["action"], a["outcome"]) for a in audit_rows(agg.data_dir) if a["node"] == node]
    assert (
        steps.index(("drain", "started"))
        < steps.index(("drain", "ok"))
        < steps.index(("reset_gpu", "started"))
    )
