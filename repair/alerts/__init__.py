"""Alert sinks, registered by name (common/registry.py): a new one is a file with a Sink subclass
(its name, help, its settings dataclass and their check, from_settings) and a line in SINKS; the
aggregator's settings include each sink's.

Why not a notification library (apprise and the like): each sink here is one HTTP POST of a
documented JSON body, and what we need around it — one alert identity per incident
(PagerDuty's dedup_key, resolve events), per-sink ordered retries with backoff, counts per
outcome, never blocking the controller — is the part such libraries leave to the caller.
The sinks stay a few lines each, on the standard library's HTTP client."""

from __future__ import annotations

from typing import Any

from gpufleet.common.registry import Registry
from gpufleet.repair.alerts.alertmanager import AlertmanagerSink
from gpufleet.repair.alerts.base import Sink
from gpufleet.repair.alerts.pagerduty import PagerDutySink
from gpufleet.repair.alerts.slack import SlackSink
from gpufleet.repair.alerts.webhook import WebhookSink

SINKS: Registry[type[Sink]] = Registry(
    "alert sink", (WebhookSink, SlackSink, PagerDutySink, AlertmanagerSink)
)


def open_sinks(settings: Any) -> list[Sink]:
    """Every sink the aggregator's settings configure, of every kind."""
    return [sink for kind in SINKS.values() for sink in kind.from_settings(settings)]
