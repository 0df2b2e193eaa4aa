"""PagerDuty Events API v2: trigger on firing, resolve on recovery, one dedup_key per incident
so updates land on the same page instead of paging again."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.repair.alerts.base import Alert, Request, Sink

EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
_SEVERITY = {"critical": "critical", "warning": "warning", "info": "info"}


class PagerDutySink(Sink):
    name = "pagerduty"

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> list[Sink]:
        key = settings.get("pagerduty_routing_key")
        return [cls(key, settings.get("pagerduty_url", EVENTS_URL))] if key else []

    def __init__(self, routing_key: str, url: str = EVENTS_URL) -> None:
        self._key = routing_key
        self._url = url or EVENTS_URL

    def request(self, alert: Alert) -> Request:
        body: dict[str, object] = {
            "routing_key": self._key,
            "event_action": "resolve" if alert.status == "resolved" else "trigger",
            "dedup_key": f"gpufleet-{alert.key}",
        }
        if alert.link:
            body["links"] = [{"href": alert.link, "text": "gpufleet dashboard"}]
        if alert.status != "resolved":
            body["payload"] = {
                "summary": f"{alert.node}: {alert.state} — {alert.summary}"[:1024],
                "source": alert.node or "gpufleet",
                "severity": _SEVERITY.get(alert.severity, "error"),
                "component": "gpu",
                "custom_details": alert.details,
            }
        return Request(self._url, body)
