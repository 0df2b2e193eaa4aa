"""Slack (and Mattermost, Rocket.Chat: the same incoming-webhook format): one message per change."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.repair.alerts.base import Alert, Request, Sink

_ICON = {"critical": ":red_circle:", "warning": ":warning:", "info": ":information_source:"}


class SlackSink(Sink):
    name = "slack"

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> list[Sink]:
        return [cls(settings["slack_url"])] if settings.get("slack_url") else []

    def __init__(self, url: str) -> None:
        self._url = url

    def request(self, alert: Alert) -> Request:
        icon = ":white_check_mark:" if alert.status == "resolved" else _ICON.get(alert.severity, "")
        text = f"{icon} *{alert.status.upper()}* [{alert.key}] {alert.node}: {alert.state} — {alert.summary}"
        if alert.link:
            text += f" <{alert.link}|open in the dashboard>"
        return Request(self._url, {"text": text})
