"""The aggregator's settings. Layering (file, environment, flags) is done by the CLI from
the metadata on each field; here they are typed and checked."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _setting(default: Any, help_text: str) -> Any:
    return field(default=default, metadata={"help": help_text})


@dataclass
class AggregatorConfig:
    ingest_listen: str = _setting("0.0.0.0:7710", "collector ingest gRPC address (port 0: pick a free one)")
    fleet_listen: str = _setting("0.0.0.0:7711", "Fleet API gRPC address for the dashboard and CLI")
    metrics_listen: str = _setting(
        "0.0.0.0:7712",
        "the aggregator's own Prometheus /metrics address; empty disables",
    )
    data_dir: str = _setting("/var/lib/gpufleet", "where the embedded store and state live")
    secrets_file: str = _setting(
        "",
        "TOML with the collector secret and fleet tokens (default: DATA_DIR/secrets.toml)",
    )
    store: str = _setting("embedded", "history store backend: embedded or influxdb")
    influx_url: str = _setting("http://127.0.0.1:8086", "InfluxDB URL (with store = influxdb)")
    influx_database: str = _setting("gpufleet", "InfluxDB 1.x database, or the 2.x/3.x bucket mapped to it")
    influx_retention_policy: str = _setting("", "InfluxDB retention policy to write to (empty: the default)")
    influx_token: str = _setting("", "InfluxDB 2.x/3.x token (sent as 'Authorization: Token ...')")
    influx_username: str = _setting("", "InfluxDB 1.x user")
    influx_password: str = _setting("", "InfluxDB 1.x password (prefer the environment variable)")
    spool_max_bytes: int = _setting(
        1 << 30, "on-disk spool for batches the store cannot take; at this size acknowledgements stop"
    )
    spool_warn_ratio: float = _setting(0.8, "the spool reports itself near its limit past this fraction")
    rollup_1m_retention_s: float = _setting(
        90 * 86400.0, "how long 1-minute roll-ups are kept (InfluxDB: retention policy gpufleet_1m)"
    )
    rollup_1h_retention_s: float = _setting(
        730 * 86400.0, "how long 1-hour roll-ups are kept (InfluxDB: retention policy gpufleet_1h)"
    )
    retention_s: float = _setting(14 * 86400.0, "how long raw history is kept, in seconds")
    tls_cert: str = _setting("", "PEM certificate: serve both gRPC ports with TLS")
    tls_key: str = _setting("", "PEM private key for tls_cert")
    max_report_bytes: int = _setting(
        1024 * 1024,
        "largest report accepted; larger ones are rejected with RESOURCE_EXHAUSTED",
    )
    max_clock_skew_s: float = _setting(300.0, "how far ahead of the aggregator's clock a report may be")
    stale_after_intervals: float = _setting(
        3.0,
        "a node is stale after this many of its sampling intervals without a report",
    )
    silent_after_intervals: float = _setting(
        10.0,
        "a node is silent after this many intervals without a report",
    )
    ready_file: str = _setting(
        "",
        "write the bound addresses as JSON here once serving (for supervisors and tests)",
    )

    def __post_init__(self) -> None:
        for name in ("ingest_listen", "fleet_listen"):
            if ":" not in getattr(self, name):
                raise ValueError(f"{name}={getattr(self, name)!r} must be host:port")
        if self.metrics_listen and ":" not in self.metrics_listen:
            raise ValueError(f"metrics_listen={self.metrics_listen!r} must be host:port or empty")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert and tls_key must be given together")
        if self.retention_s < 3600:
            raise ValueError(f"retention_s={self.retention_s:g} must be at least 3600 (one hour)")
        if self.spool_max_bytes < 1 << 20:
            raise ValueError(f"spool_max_bytes={self.spool_max_bytes} must be at least 1 MiB")
        if not 0 < self.spool_warn_ratio < 1:
            raise ValueError(f"spool_warn_ratio={self.spool_warn_ratio} must be between 0 and 1")
        if self.max_report_bytes < 1024:
            raise ValueError(f"max_report_bytes={self.max_report_bytes} must be at least 1024")
        if not 1 <= self.stale_after_intervals < self.silent_after_intervals:
            raise ValueError(
                f"need 1 <= stale_after_intervals ({self.stale_after_intervals:g}) < "
                f"silent_after_intervals ({self.silent_after_intervals:g})"
            )

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir)

    @property
    def secrets_path(self) -> Path:
        return Path(self.secrets_file) if self.secrets_file else self.data_path / "secrets.toml"
