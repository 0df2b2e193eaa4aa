"""gpufleet's incidents in a real Alertmanager (Debian's prometheus-alertmanager, started here):
routed by severity to different receivers, held by a silence, resolved when the incident closes
even after an aggregator restart, with the incident's dashboard page in every alert; webhooks
with a bearer token from a file; `gpufleet alert test` through every sink."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.alert_receiver import AlertReceiver
from harness.alertmanager import Alertmanager
from harness.processes import Cluster, free_port, gpufleet_argv
from harness.repair import FAST_POLICY, incidents, repair_aggregator, repair_status
from harness.waiting import wait_until

DASHBOARD = "https://gpufleet.example"
# Thermal slowdown: a warning, alert-only, within a second; validation long enough to restart in.
POLICY = FAST_POLICY.replace("validate_s = 2.0", "validate_s = 8.0") + (
    "\n[rules.thermal_slowdown]\nwindow_s = 1.0\n"
)


@pytest.fixture
def receivers() -> Iterator[dict[str, AlertReceiver]]:
    made = {"pager": AlertReceiver(), "chat": AlertReceiver(), "hook": AlertReceiver()}
    yield made
    for r in made.values():
        r.close()


@pytest.fixture
def alertmanager(cluster: Cluster, receivers: dict[str, AlertReceiver]) -> Iterator[Alertmanager]:
    config = {
        "route": {
            "receiver": "chat",
            "group_by": ["alertname", "incident"],
            "group_wait": "1s",
            "group_interval": "1s",
            "repeat_interval": "1h",
            "routes": [{"matchers": ['severity="critical"'], "receiver": "pager"}],
        },
        "receivers": [
            {"name": name, "webhook_configs": [{"url": f"{receivers[name].url}/am", "send_resolved": True}]}
            for name in ("pager", "chat")
        ],
    }
    am = Alertmanager(cluster.tmp / "alertmanager", config)
    yield am
    am.stop()


def _notified(receiver: AlertReceiver, **labels: str) -> list[dict[str, Any]]:
    """The alerts Alertmanager's webhook notifications carried, with these labels."""
    return [
        a
        for note in list(receiver.received)
        for a in note.get("alerts", [])
        if all(a["labels"].get(k) == v for k, v in labels.items())
    ]


@pytest.mark.slow
def test_incidents_are_routed_silenced_and_resolved_in_a_real_alertmanager(
    cluster: Cluster, alertmanager: Alertmanager, receivers: dict[str, AlertReceiver]
) -> None:
    token = cluster.tmp / "webhook.token"
    token.write_text("s3cret-hook-token\n")
    ports, data = (free_port(), free_port()), cluster.tmp / "data"
    flags = (
        "--alert-alertmanager-url",
        alertmanager.url,
        "--alert-alertmanager-refresh-s",
        "10",
        "--alert-webhooks",
        f"{receivers['hook'].url}/hook",
        "--alert-webhook-token-file",
        str(token),
        "--alert-group-wait-s",
        "0.2",
        "--dashboard-url",
        DASHBOARD,
        "--repair-max-out-of-service-fraction",
        "1",
    )
    agg = repair_aggregator(cluster, *flags, policy=POLICY, data_dir=data, ports=ports)
    # node-b's alerts are silenced before it fails: Alertmanager holds them, nobody is paged.
    alertmanager.api(
        "silences",
        {
            "matchers": [{"name": "node", "value": "node-b", "isRegex": False, "isEqual": True}],
            "startsAt": "2020-01-01T00:00:00Z",
            "endsAt": "2099-01-01T00:00:00Z",
            "createdBy": "test",
            "comment": "maintenance on node-b",
        },
    )
    ecc = cluster.tmp / "ecc.toml"
    ecc.write_text('[[fault]]\nat_s = 1\ngpu = 2\nkind = "ecc_uncorrected"\n')
    hot = cluster.tmp / "hot.toml"
    hot.write_text('[[fault]]\nat_s = 1\ngpu = 0\nkind = "thermal"\n')
    # node-b's fault is one no reset fixes (a GPU to replace): its incident, and the alert the
    # silence holds, stay open however long the checks below take (an ECC error it once had
    # was repaired and resolved before they looked, in 4 of 20 runs on a busy machine).
    worn = cluster.tmp / "worn.toml"
    worn.write_text('[[fault]]\nat_s = 1\ngpu = 2\nkind = "remap_failure"\n')
    for node, scenario in (("node-a", ecc), ("node-b", worn), ("node-c", hot)):
        cluster.collector(node, agg.ingest, "--interval-s", "0.5", "--sim-scenario", str(scenario))

    # The aggregator restarts while node-a validates, waited for first: its validation lasts
    # validate_s, and the alert checks below, made first, once outlasted it on a loaded machine.
    # The incident then closes, and the resolved alert still reaches Alertmanager, which tells
    # the pager it is resolved (the alerts checked below were sent before or after the restart).
    wait_until(lambda: _state(agg, cluster, "node-a") == "validating", 60, "node-a validating")
    agg.proc.stop(signal.SIGTERM)
    agg = repair_aggregator(cluster, *flags, policy=POLICY, data_dir=data, ports=ports)

    # Critical to the pager, warning to chat: Alertmanager's routing, on gpufleet's labels.
    paged = wait_until(lambda: _notified(receivers["pager"], node="node-a"), 30, "node-a paged")
    assert (
        paged[0]["labels"]["alertname"] == "GpufleetIncident" and paged[0]["labels"]["severity"] == "critical"
    )
    key = paged[0]["labels"]["incident"]
    assert paged[0]["annotations"]["dashboard_url"] == f"{DASHBOARD}/?page=repairs&incident={key}"
    assert paged[0]["generatorURL"] == paged[0]["annotations"]["dashboard_url"]
    assert paged[0]["annotations"]["runbook_url"].startswith("docs/runbooks.md#")
    chat = wait_until(lambda: _notified(receivers["chat"], node="node-c"), 30, "node-c's warning in chat")
    assert chat[0]["labels"]["severity"] == "warning"
    assert not _notified(receivers["chat"], node="node-a"), "a critical incident is not sent to chat"
    # Silenced: Alertmanager has node-b's alert, suppressed by the silence, and told nobody.
    held = wait_until(lambda: alertmanager.alerts(node="node-b"), 30, "node-b's alert in Alertmanager")
    assert held[0]["status"]["state"] == "suppressed" and held[0]["status"]["silencedBy"]
    assert not _notified(receivers["pager"], node="node-b") and not _notified(
        receivers["chat"], node="node-b"
    )

    # The webhook got the same incident with the bearer token from the file, and its links.
    hooked = wait_until(lambda: receivers["hook"].for_key(key), 30, "the webhook's alert")
    assert hooked[0]["authorization"] == "Bearer s3cret-hook-token"
    assert hooked[0]["links"]["node"] == f"{DASHBOARD}/?page=node&node=node-a"

    wait_until(
        lambda: any(i["id"] == key and not i["open"] for i in incidents(agg, cluster, "--all")),
        60,
        "node-a's incident closed after the restart",
    )
    resolved = wait_until(
        lambda: [a for a in _notified(receivers["pager"], incident=key) if a["status"] == "resolved"],
        60,
        "the pager told it is resolved",
    )
    assert resolved[0]["labels"]["node"] == "node-a"
    assert not [a for a in alertmanager.alerts(incident=key) if a["status"]["state"] == "active"]


def _state(agg: Any, cluster: Cluster, node: str) -> str:
    return {n["node"]: n["state"] for n in repair_status(agg, cluster)["nodes"]}.get(node, "healthy")


def test_alert_test_sends_through_every_sink_and_says_what_each_answered(
    cluster: Cluster, alertmanager: Alertmanager, receivers: dict[str, AlertReceiver]
) -> None:
    token = cluster.tmp / "hook.token"
    token.write_text("t0ken")
    argv = (
        "alert",
        "test",
        "--data-dir",
        str(cluster.tmp / "data"),
        "--alert-alertmanager-url",
        alertmanager.url,
        "--alert-webhooks",
        f"{receivers['hook'].url}/hook,http://127.0.0.1:{free_port()}/nobody",
        "--alert-webhook-token-file",
        str(token),
        "--dashboard-url",
        DASHBOARD,
        "--json",
    )
    out = subprocess.run(gpufleet_argv(*argv), capture_output=True, text=True, timeout=60)
    answers = json.loads(out.stdout)
    assert out.returncode == 1, "one sink failed"
    assert answers["alertmanager"] == "sent" and answers["webhook1"] == "sent"
    assert answers["webhook2"].startswith("http://127.0.0.1:") and "Connection refused" in answers["webhook2"]
    sent = receivers["hook"].received[-1]
    assert sent["state"] == "test" and sent["authorization"] == "Bearer t0ken"
    test_key = f"test-{socket.gethostname()}"
    shown = wait_until(lambda: alertmanager.alerts(incident=test_key), 10, "the test alert in Alertmanager")
    assert shown[0]["annotations"]["state"] == "test" and shown[0]["labels"]["severity"] == "info"


def test_a_webhook_token_file_that_cannot_be_read_stops_the_start_with_its_setting_named(
    tmp_path: Path,
) -> None:
    out = subprocess.run(
        gpufleet_argv(
            "config",
            "check",
            str(_config(tmp_path, 'alert_webhooks = "http://x/hook"\nalert_webhook_token_file = "/nope"')),
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        out.returncode == 2 and "alert_webhook_token_file='/nope': cannot read the token file" in out.stdout
    )


def _config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "gpufleet.toml"
    path.write_text(f"[aggregator]\n{body}\n")
    return path
