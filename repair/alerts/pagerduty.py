"""PagerDuty Events API v2: trigger on firing, resolve on recovery, one dedup_key per incident
so updates land on the same page instead of paging again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gpufleet.common.settings import setting
from gpufleet.repair.alerts.base import Alert, Request, Sink

EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
_SEVERITY = {"critical": "critical", "warning": "warning", "info": "info"}


@dataclass
class PagerDutySettings:
    chosen_by: ClassVar[str] = "alert sink pagerduty"
    alert_pagerduty_routing_key: str = setting("", "PagerDuty Events API v2 routing key")
    alert_pagerduty_url: str = setting(EVENTS_URL, "PagerDuty Events API v2 endpoint")


class PagerDutySink(Sink):
    name = "pagerduty"
    help = "Events API v2: trigger and resolve, one dedup key per incident"
    settings = PagerDutySettings

    @classmethod
    def from_settings(cls, settings: PagerDutySettings) -> list[Sink]:
        key = settings.alert_pagerduty_routing_key
        return [cls(key, settings.alert_pagerduty_url)] if key else []

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
