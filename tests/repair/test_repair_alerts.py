"""Alerts to a real HTTP receiver (webhook, Slack and PagerDuty formats) with failed deliveries
retried without holding up repairs; the command-hook backend; a sampled finding waiting out
its persistence window."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpufleet.protos import fleet_pb2
from harness.alert_receiver import AlertReceiver
from harness.processes import Cluster, free_port
from harness.repair import FAST_POLICY, gpufleet_cli, lines, repair_aggregator, repair_status
from harness.waiting import wait_until

THERMAL = """
[[fault]]
at_s = 1.0
gpu = 6
kind = "thermal"
"""

POLICY = (
    FAST_POLICY
    + """
[rules.thermal_slowdown]
severity = "critical"
cordon = true
window_s = 3.0
ladder = ["ticket"]
"""
)


@pytest.mark.slow
def test_sustained_thermal_slowdown_is_cordoned_by_hook_and_alerted_everywhere(
    alert_receiver: Callable[..., AlertReceiver], cluster: Cluster
) -> None:
    node = "hot-node"
    receiver = alert_receiver(fail_first=4)  # the first deliveries fail: they are retried
    hooks = cluster.tmp / "hook.txt"
    agg = repair_aggregator(
        cluster,
        "--repair-backend",
        "hook",
        "--repair-hook-cordon",
        f"sh -c 'echo cordon {{node}} >> {hooks}'",
        "--repair-hook-uncordon",
        f"sh -c 'echo uncordon {{node}} >> {hooks}'",
        "--repair-ticket-command",
        f"sh -c 'echo ticket {{node}} {{incident}} >> {hooks}'",
        "--alert-webhooks",
        f"{receiver.url}/hook",
        "--alert-slack-url",
        f"{receiver.url}/slack",
        "--alert-pagerduty-routing-key",
        "R0UT1NG",
        "--alert-pagerduty-url",
        f"{receiver.url}/pd",
        "--alert-group-wait-s",
        "0.5",
        policy=POLICY,
    )
    (cluster.tmp / "thermal.toml").write_text(THERMAL)
    cluster.collector(
        node, agg.ingest, "--interval-s", "1", "--sim-scenario", str(cluster.tmp / "thermal.toml")
    )

    def state() -> str:
        return next(
            (n["state"] for n in repair_status(agg, cluster)["nodes"] if n["node"] == node), "healthy"
        )

    wait_until(lambda: state() == "suspect", 30, "the finding to be suspected first")
    wait_until(
        lambda: "cordon hot-node" in hooks.read_text() if hooks.exists() else False, 30, "the cordon hook"
    )
    # The window, as the aggregator timed it (not as this test's polling saw it, which a busy
    # machine delays): the cordon began at least 3 s after the finding was first seen.
    meta = cluster.secrets.metadata()
    stub = agg.fleet_stub()
    (repairing,) = [
        n
        for n in stub.GetRepairStatus(fleet_pb2.RepairStatusRequest(), metadata=meta).nodes
        if n.node == node
    ]
    (finding,) = [f for f in repairing.findings if f.code == "thermal_slowdown"]
    audit_rows = stub.ListAudit(fleet_pb2.ListAuditRequest(node=node), metadata=meta).entries
    (started,) = [a for a in audit_rows if a.action == "cordon" and str(a.outcome) == "started"]
    waited_s = (started.time_unix_ns - finding.first_seen_unix_ns) / 1e9
    assert waited_s >= 3.0, f"cordoned {waited_s:.2f} s after the finding: the 3 s window was not waited out"
    wait_until(lambda: state() == "quarantined", 30, "the ticket and quarantine")
    (incident_id,) = {n["incident"] for n in repair_status(agg, cluster)["nodes"] if n["node"] == node}
    assert f"ticket hot-node {incident_id}" in hooks.read_text()

    # The receiver refused the first deliveries; every sink still got the incident.
    wait_until(
        lambda: {a["path"] for a in receiver.received} >= {"/hook", "/slack", "/pd"},
        60,
        "deliveries to every sink after retries",
    )
    assert receiver.attempts > len(receiver.received), "some deliveries were retried"
    assert agg.metric_value("gpufleet_alerts_total", outcome="failed_attempt") >= 4
    pages = [a for a in receiver.received if a["path"] == "/pd"]
    assert pages[0]["event_action"] == "trigger" and pages[0]["dedup_key"] == f"gpufleet-{incident_id}"
    assert pages[0]["routing_key"] == "R0UT1NG" and "thermal_slowdown" in pages[0]["payload"]["summary"]
    slack = [a for a in receiver.received if a["path"] == "/slack"]
    assert node in slack[0]["text"] and "FIRING" in slack[0]["text"]

    out = gpufleet_cli(agg, cluster, "ops", "uncordon", node, "--reason", "fans replaced")
    assert out.returncode == 0, out.stderr
    assert lines(hooks)[-2:] == ["uncordon", node]
    wait_until(
        lambda: any(a["path"] == "/pd" and a["event_action"] == "resolve" for a in receiver.received),
        60,
        "the page resolved",
    )
    resolved = [a for a in receiver.received if a["path"] == "/pd" and a["event_action"] == "resolve"]
    assert resolved[0]["dedup_key"] == f"gpufleet-{incident_id}", "the same page is resolved, not a new one"
    webhook = [a for a in receiver.received if a["path"] == "/hook" and a["key"] == incident_id]
    assert webhook[-1]["status"] == "resolved" and "fans replaced" in webhook[-1]["summary"]


def test_delivery_state_survives_a_restart_of_the_dispatcher(
    alert_receiver: Callable[..., AlertReceiver], tmp_path: Path
) -> None:
    """In-process, on the real repair state and a real HTTP receiver: an alert queued while the
    receiver is down, a firing waiting out its group wait, and one held by the breaker are all
    still there for the next process; each firing that went out gets its resolved."""
    from gpufleet.repair.alerts.base import Alert
    from gpufleet.repair.alerts.dispatcher import AlertDispatcher
    from gpufleet.repair.alerts.webhook import WebhookSink
    from gpufleet.repair.state import open_state

    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"

    def alert(key: str, status: str) -> Alert:
        return Alert(key, status, f"node-{key}", "cordoned", "critical", f"{key} {status}", time.time_ns())

    async def first_process() -> None:
        state = open_state("sqlite", str(tmp_path / "repair.sqlite3"))
        store = state.kept
        quick = AlertDispatcher([WebhookSink(url)], group_wait_s=0.05, store=store)
        quick.start()
        quick.notify(alert("queued", "firing"))  # out after its group wait: the receiver is down
        deadline = time.monotonic() + 20
        while not store.queued_alerts() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert store.queued_alerts(), "the alert is in the sink's outbox"
        await quick.close()
        slow = AlertDispatcher([WebhookSink(url)], group_wait_s=60.0, store=store)
        slow.start()
        slow.notify(alert("waiting", "firing"))  # still in its group wait when the process dies
        await slow.close()
        state.close()

    async def second_process(receiver: AlertReceiver) -> None:
        state = open_state("sqlite", str(tmp_path / "repair.sqlite3"))
        store = state.kept
        alerts = AlertDispatcher([WebhookSink(url)], group_wait_s=0.05, store=store)
        alerts.start()
        deadline = time.monotonic() + 20
        while len(receiver.received) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        alerts.notify(alert("queued", "resolved"))
        alerts.notify(alert("waiting", "resolved"))
        while len(receiver.received) < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await alerts.close()
        state.close()

    asyncio.run(first_process())
    receiver = alert_receiver(port=port)
    asyncio.run(second_process(receiver))
    got = [(a["key"], a["status"]) for a in receiver.received]
    assert sorted(got[:2]) == [("queued", "firing"), ("waiting", "firing")], got
    assert sorted(got[2:]) == [("queued", "resolved"), ("waiting", "resolved")], got


def test_an_incident_closed_by_a_process_killed_before_its_resolve_is_resolved_at_the_next_start(
    alert_receiver: Callable[..., AlertReceiver], tmp_path: Path
) -> None:
    """Closing an incident and queueing its resolve are two writes: a process killed between
    them (a chaos run found one, its page left open) is made good at the next start. In-process,
    on the real repair state and a real HTTP receiver."""
    from gpufleet.repair.alerts.dispatcher import AlertDispatcher
    from gpufleet.repair.alerts.webhook import WebhookSink
    from gpufleet.repair.incidents import IncidentDesk
    from gpufleet.repair.model import Finding
    from gpufleet.repair.outcome import repaired
    from gpufleet.repair.state import Workflow, open_state

    port = free_port()
    receiver = alert_receiver(port=port)
    url = f"http://127.0.0.1:{port}/hook"
    path = str(tmp_path / "repair.sqlite3")
    finding = Finding("n1", 3, "xid_79", "critical", "reset_gpu", True, "fell off the bus", "XID 79")

    async def until(what: str, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 20
        while not done():
            assert time.monotonic() < deadline, f"no {what} in 20 s: {receiver.received}"
            await asyncio.sleep(0.02)

    async def first_process() -> str:
        state = open_state("sqlite", path)
        alerts = AlertDispatcher([WebhookSink(url)], group_wait_s=0.05, store=state.kept)
        alerts.start()
        incident = IncidentDesk(state, alerts, lambda *_: None).note(Workflow("n1"), [finding])
        # Paged, and its delivery recorded (else the next process delivers it again: at least once).
        await until("page", lambda: bool(receiver.received) and not state.kept.queued_alerts())
        # Killed here: the close is written, its resolve never queued.
        incident.closed_ns, incident.outcome = time.time_ns(), repaired("reset_gpu")
        state.put_incident(incident)
        await alerts.close()
        state.close()
        return incident.id

    async def second_process() -> list[str]:
        state = open_state("sqlite", path)
        alerts = AlertDispatcher([WebhookSink(url)], group_wait_s=0.05, store=state.kept)
        alerts.start()
        resolved = IncidentDesk(state, alerts, lambda *_: None).resolve_closed(state.workflows())
        await until("resolve", lambda: any(a["status"] == "resolved" for a in receiver.received))
        await alerts.close()
        state.close()
        return resolved

    incident_id = asyncio.run(first_process())
    assert asyncio.run(second_process()) == [incident_id]
    got = [(a["key"], a["status"], a["summary"]) for a in receiver.received]
    assert got[0][:2] == (incident_id, "firing") and got[1] == (
        incident_id,
        "resolved",
        "repaired by reset_gpu",
    )
