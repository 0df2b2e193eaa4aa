"""Alertmanager (its v2 API, `POST /api/v2/alerts`): where SREs already route, group, silence and
inhibit. Each gpufleet incident is one Alertmanager alert, identified by its labels
(`alertname="GpufleetIncident"`, `incident`, `node`, `severity`, `state`, `source="gpufleet"`;
the breaker is `alertname="GpufleetRepairBreaker"`), with the summary, a description, the
dashboard page and the runbook as annotations and `generatorURL` the incident's page.

Like Prometheus, gpufleet sends a firing alert again every `alert_alertmanager_refresh_s`
(`endsAt` a few refreshes ahead): Alertmanager keeps it active while it keeps coming, and
resolves it by itself if gpufleet stops (an aggregator that is gone pages through its own rule,
GpufleetAggregatorDown). When the incident closes, the alert is sent with `endsAt` = the close:
resolved at once. A bearer token (alert_alertmanager_token_file) goes in the Authorization header,
for an Alertmanager behind an authenticating proxy."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar

from gpufleet.common.settings import require, setting
from gpufleet.repair.alerts.base import Alert, Request, Sink, read_token

RUNBOOK = "docs/runbooks.md#gpufleet-incidents"
# A firing alert's endsAt: this many refreshes ahead (one lost refresh does not resolve it).
ENDS_AFTER_REFRESHES = 3


def _iso(unix_ns: float) -> str:
    return (
        datetime.fromtimestamp(unix_ns / 1e9, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


@dataclass
class AlertmanagerSettings:
    chosen_by: ClassVar[str] = "alert sink alertmanager"
    alert_alertmanager_url: str = setting(
        "", "Alertmanager to send every incident to (its v2 API), e.g. http://alertmanager:9093"
    )
    alert_alertmanager_token_file: str = setting(
        "", "file holding a bearer token for Alertmanager (behind an authenticating proxy); empty: none"
    )
    alert_alertmanager_refresh_s: float = setting(
        60.0,
        "a firing incident is sent to Alertmanager again this often (it resolves one that stops "
        "coming after a few of these)",
    )


class AlertmanagerSink(Sink):
    name = "alertmanager"
    help = "Alertmanager's v2 API: one alert per incident, refreshed while it fires"
    settings = AlertmanagerSettings

    @classmethod
    def check_settings(cls, settings: Any, chosen: bool) -> None:
        require(
            10.0 <= settings.alert_alertmanager_refresh_s <= 3600.0,
            f"alert_alertmanager_refresh_s={settings.alert_alertmanager_refresh_s:g} must be 10..3600",
        )

    @classmethod
    def from_settings(cls, settings: AlertmanagerSettings) -> list[Sink]:
        url = settings.alert_alertmanager_url.strip()
        if not url:
            return []
        token_file = settings.alert_alertmanager_token_file
        token = read_token(token_file, "alert_alertmanager_token_file") if token_file else ""
        return [cls(url, settings.alert_alertmanager_refresh_s, token)]

    def __init__(self, url: str, refresh_s: float = 60.0, bearer_token: str = "") -> None:
        self._url = url.rstrip("/") + "/api/v2/alerts"
        self.refresh_s = refresh_s
        self._headers = {"Authorization": f"Bearer {bearer_token}"} if bearer_token else {}

    def request(self, alert: Alert) -> Request:
        breaker = alert.key == "breaker"
        labels = {
            "alertname": "GpufleetRepairBreaker" if breaker else "GpufleetIncident",
            "source": "gpufleet",
            "severity": alert.severity,
        }
        if alert.labels:  # a waste finding's own: routed by its owner (repair/waste_desk.py)
            labels.update(alert.labels, node=alert.node)
        elif not breaker:
            labels.update(incident=alert.key, node=alert.node)
        annotations = {
            "summary": alert.summary[:1024],
            "description": (f"{alert.node}: " if alert.node else "")
            + f"{alert.state} — {alert.summary}"[:2048],
            "state": alert.state,
            "runbook_url": "docs/runbooks.md#gpufleetrepairbreakertripped" if breaker else RUNBOOK,
        }
        if alert.link:
            annotations["dashboard_url"] = alert.link
        starts_ns = alert.details.get("opened_unix_ns") or alert.time_ns
        ends_ns = (
            alert.time_ns
            if alert.status == "resolved"
            else time.time_ns() + ENDS_AFTER_REFRESHES * self.refresh_s * 1e9
        )
        body = {
            "labels": labels,
            "annotations": annotations,
            "startsAt": _iso(min(starts_ns, alert.time_ns)),
            "endsAt": _iso(max(ends_ns, starts_ns)),
        }
        if alert.link:
            body["generatorURL"] = alert.link
        return Request(self._url, [body], self._headers)
