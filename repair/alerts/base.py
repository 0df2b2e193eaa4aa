"""An alert, and the one interface every alert sink has: turn an alert into an HTTP request."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Alert:
    key: str  # the incident id, or "breaker": one alert identity, updated in place
    status: str  # firing | resolved
    node: str
    state: str  # the node's workflow state (NodeHealth name), or tripped/reset
    severity: str  # info | warning | critical
    summary: str  # one line for people
    time_ns: int
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": "gpufleet",
            "key": self.key,
            "status": self.status,
            "node": self.node,
            "state": self.state,
            "severity": self.severity,
            "summary": self.summary,
            "time_unix_ns": self.time_ns,
            "details": self.details,
        }


@dataclass(frozen=True)
class Request:
    url: str
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


class Sink(abc.ABC):
    name = ""

    @classmethod
    @abc.abstractmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> list[Sink]:
        """The sinks of this kind the aggregator's alert settings (alert_* without the prefix)
        configure: none when its settings are empty."""

    @abc.abstractmethod
    def request(self, alert: Alert) -> Request:
        """The HTTP request that delivers this alert."""
