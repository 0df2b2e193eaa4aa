"""A generic JSON webhook: the alert as JSON (Alert.to_json), POSTed to a URL."""

from __future__ import annotations

from gpufleet.repair.alerts.base import Alert, Request, Sink


class WebhookSink(Sink):
    name = "webhook"

    def __init__(self, url: str, bearer_token: str = "") -> None:
        self._url = url
        self._headers = {"Authorization": f"Bearer {bearer_token}"} if bearer_token else {}

    def request(self, alert: Alert) -> Request:
        return Request(self._url, alert.to_json(), self._headers)
