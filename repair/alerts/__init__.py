"""Alert sinks, registered by name: a new one is a file with a Sink subclass and a line here.

Why not a notification library (apprise and the like): each sink here is one HTTP POST of a
documented JSON body, and what we need around it — one alert identity per incident
(PagerDuty's dedup_key, resolve events), per-sink ordered retries with backoff, counts per
outcome, never blocking the controller — is the part such libraries leave to the caller.
The sinks stay a few lines each, on the standard library's HTTP client."""

from __future__ import annotations

from gpufleet.repair.alerts.base import Sink
from gpufleet.repair.alerts.pagerduty import PagerDutySink
from gpufleet.repair.alerts.slack import SlackSink
from gpufleet.repair.alerts.webhook import WebhookSink


def open_sinks(webhook_urls: list[str], slack_url: str, pagerduty_key: str, pagerduty_url: str) -> list[Sink]:
    sinks: list[Sink] = []
    for i, url in enumerate(webhook_urls):
        sink = WebhookSink(url)
        sink.name = f"webhook{i + 1}" if len(webhook_urls) > 1 else "webhook"
        sinks.append(sink)
    if slack_url:
        sinks.append(SlackSink(slack_url))
    if pagerduty_key:
        sinks.append(PagerDutySink(pagerduty_key, pagerduty_url))
    return sinks
