"""A generic JSON webhook: the alert as JSON (Alert.to_json), POSTed to a URL."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.repair.alerts.base import Alert, Request, Sink


class WebhookSink(Sink):
    name = "webhook"

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> list[Sink]:
        urls = [u.strip() for u in str(settings.get("webhooks", "")).split(",") if u.strip()]
        sinks: list[Sink] = []
        for i, url in enumerate(urls):
            sink = cls(url)
            sink.name = f"webhook{i + 1}" if len(urls) > 1 else "webhook"
            sinks.append(sink)
        return sinks

    def __init__(self, url: str, bearer_token: str = "") -> None:
        self._url = url
        self._headers = {"Authorization": f"Bearer {bearer_token}"} if bearer_token else {}

    def request(self, alert: Alert) -> Request:
        return Request(self._url, alert.to_json(), self._headers)
