"""Slack (and Mattermost, Rocket.Chat: the same incoming-webhook format): one message per change."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gpufleet.common.settings import setting
from gpufleet.repair.alerts.base import Alert, Request, Sink

_ICON = {"critical": ":red_circle:", "warning": ":warning:", "info": ":information_source:"}


@dataclass
class SlackSettings:
    chosen_by: ClassVar[str] = "alert sink slack"
    alert_slack_url: str = setting("", "Slack (or Mattermost) incoming-webhook URL")


class SlackSink(Sink):
    name = "slack"
    help = "a message per change to an incoming webhook"
    settings = SlackSettings

    @classmethod
    def from_settings(cls, settings: SlackSettings) -> list[Sink]:
        return [cls(settings.alert_slack_url)] if settings.alert_slack_url else []

    def __init__(self, url: str) -> None:
        self._url = url

    def request(self, alert: Alert) -> Request:
        icon = ":white_check_mark:" if alert.status == "resolved" else _ICON.get(alert.severity, "")
        text = f"{icon} *{alert.status.upper()}* [{alert.key}] {alert.node}: {alert.state} — {alert.summary}"
        if alert.link:
            text += f" <{alert.link}|open in the dashboard>"
        return Request(self._url, {"text": text})
