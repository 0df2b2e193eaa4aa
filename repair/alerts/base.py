"""An alert, and the one interface every alert sink has: turn an alert into an HTTP request."""

from __future__ import annotations

import abc
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar


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
    # The dashboard pages that explain it (dashboard_url set): "incident" and "node" (links()).
    links: dict[str, str] = field(default_factory=dict)
    # Labels of its own (a waste finding's: alertname, finding, workload and its owner), which
    # sinks with labels (Alertmanager) send in place of an incident's.
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def link(self) -> str:
        """The one page to open first: the incident's, else the node's (or the repairs page)."""
        first = self.links.get("incident") or self.links.get("workloads") or self.links.get("node")
        return first or self.links.get("repairs", "")

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
            "links": self.links,
            "labels": self.labels,
        }


def links(alert: Alert, dashboard_url: str) -> dict[str, str]:
    """The dashboard's pages for this alert, as addressable URLs (dashboard/app.py reads
    `page` and its parameters from the query string); none without dashboard_url."""
    if not dashboard_url:
        return {}
    base = dashboard_url.rstrip("/") + "/?"
    out = {"repairs": base + urllib.parse.urlencode({"page": "repairs"})}
    if alert.key.startswith(("waste/", "waste-digest/")):  # waste's: the Workloads page, no incident
        out["workloads"] = base + urllib.parse.urlencode({"page": "workloads"})
    elif alert.key != "breaker":
        incident = alert.key.split("/", 1)[0]  # an incident's capacity alert is "ID/capacity"
        out["incident"] = base + urllib.parse.urlencode({"page": "repairs", "incident": incident})
    if alert.node:
        out["node"] = base + urllib.parse.urlencode({"page": "node", "node": alert.node})
    return out


def read_token(path: str, setting: str) -> str:
    """A bearer token from a file (a sink's credential never sits in a URL or the settings
    file); ValueError naming the setting when it cannot be read or is empty."""
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise ValueError(f"{setting}={path!r}: cannot read the token file: {exc.strerror or exc}") from exc
    if not token:
        raise ValueError(f"{setting}={path!r}: the token file is empty")
    return token


@dataclass(frozen=True)
class Request:
    url: str
    body: Any  # JSON: an object for most sinks, a list for Alertmanager
    headers: dict[str, str] = field(default_factory=dict)


class Sink(abc.ABC):
    name = ""
    help = ""  # one line for people: the settings reference says it
    settings: ClassVar[type | None] = None  # its own settings dataclass (common/registry.py)
    # How often a firing alert is sent again (0: only when it changes). Alertmanager resolves an
    # alert that is not sent again within its resolve_timeout, as it does for Prometheus.
    refresh_s = 0.0

    @classmethod
    @abc.abstractmethod
    def from_settings(cls, settings: Any) -> list[Sink]:
        """The sinks of this kind the aggregator's settings (which include this kind's settings
        dataclass) configure: none when its settings are empty."""

    @classmethod
    def check_settings(cls, settings: Any, chosen: bool) -> None:
        """ValueError naming the setting when its settings cannot work; nothing by default."""
        return None

    @abc.abstractmethod
    def request(self, alert: Alert) -> Request:
        """The HTTP request that delivers this alert."""
