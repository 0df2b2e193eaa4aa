"""A generic JSON webhook: the alert as JSON (Alert.to_json, with its dashboard links), POSTed to
a URL, with a bearer token read from alert_webhook_token_file when one is set (a secret belongs
in a file, not in the URL)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gpufleet.common.settings import setting
from gpufleet.repair.alerts.base import Alert, Request, Sink, read_token


@dataclass
class WebhookSettings:
    chosen_by: ClassVar[str] = "alert sink webhook"
    alert_webhooks: str = setting("", "comma-separated URLs that get every alert as JSON (POST)")
    alert_webhook_token_file: str = setting(
        "", "file holding a bearer token sent to the webhooks (Authorization: Bearer ...); empty: none"
    )


class WebhookSink(Sink):
    name = "webhook"
    help = "the alert as JSON, POSTed to each URL"
    settings = WebhookSettings

    @classmethod
    def from_settings(cls, settings: WebhookSettings) -> list[Sink]:
        urls = [u.strip() for u in settings.alert_webhooks.split(",") if u.strip()]
        token_file = settings.alert_webhook_token_file
        token = read_token(token_file, "alert_webhook_token_file") if urls and token_file else ""
        sinks: list[Sink] = []
        for i, url in enumerate(urls):
            sink = cls(url, token)
            sink.name = f"webhook{i + 1}" if len(urls) > 1 else "webhook"
            sinks.append(sink)
        return sinks

    def __init__(self, url: str, bearer_token: str = "") -> None:
        self._url = url
        self._headers = {"Authorization": f"Bearer {bearer_token}"} if bearer_token else {}

    def request(self, alert: Alert) -> Request:
        return Request(self._url, alert.to_json(), self._headers)
