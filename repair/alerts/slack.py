"""Slack (and Mattermost, Rocket.Chat: the same incoming-webhook format): one message per change."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gpufleet.common.settings import setting
from gpufleet.repair.alerts.base import Alert, Request, Sink


def mrkdwn_text(text: str) -> str:
    """Text as Slack shows it and nothing more: '&', '<' and '>' escaped, the three characters
    Slack's message formatting reads as control characters, so a name or a reason from a node or
    a person (a pool "<!channel>", a "<https://...|link>") shows as written, never a mention or a
    link. Bold or italic marks are left (they can only style, and node names keep their '_' for
    copying into a shell)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


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
        what = mrkdwn_text(f"[{alert.key}] {alert.node}: {alert.state} — {alert.summary}")
        text = f"{icon} *{alert.status.upper()}* {what}"
        if alert.link:
            text += f" <{alert.link}|open in the dashboard>"
        return Request(self._url, {"text": text})
