"""Stores behind one contract (base.Store), chosen by name."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from gpufleet.aggregator.store.base import HistoryQuery, Point, Series, Store, StoreError
from gpufleet.aggregator.store.embedded import EmbeddedStore
from gpufleet.common.registry import Registry, UnknownPlugin
from gpufleet.common.settings import setting


class EmbeddedKind:
    name = "embedded"
    help = "SQLite in data_dir: one box, nothing to install"
    settings = None

    @staticmethod
    def open(settings: Any, data_dir: Path, retention_s: float, rollup_retention: dict[str, float]) -> Store:
        return EmbeddedStore(data_dir / "store.sqlite3", retention_s, retention_by_suffix=rollup_retention)


@dataclass
class InfluxSettings:
    chosen_by: ClassVar[str] = "store = influxdb"
    influx_url: str = setting("http://127.0.0.1:8086", "InfluxDB URL (with store = influxdb)")
    influx_database: str = setting("gpufleet", "InfluxDB 1.x database, or the 2.x/3.x bucket mapped to it")
    influx_retention_policy: str = setting("", "InfluxDB retention policy to write to (empty: the default)")
    influx_token: str = setting("", "InfluxDB 2.x/3.x token (sent as 'Authorization: Token ...')")
    influx_username: str = setting("", "InfluxDB 1.x user")
    influx_password: str = setting("", "InfluxDB 1.x password (prefer the environment variable)")


class InfluxKind:
    name = "influxdb"
    help = "InfluxDB 1.x, 2.x or 3.x (its v1 API): shared by replicas"
    settings = InfluxSettings

    @staticmethod
    def open(
        settings: InfluxSettings, data_dir: Path, retention_s: float, rollup_retention: dict[str, float]
    ) -> Store:
        # data_dir and retention_s are not InfluxDB's to use: the database and its retention
        # policies are the operator's (roll-up tiers get policies of their own).
        from gpufleet.aggregator.store.influx import InfluxStore

        policies = {suffix: (f"gpufleet{suffix}", seconds) for suffix, seconds in rollup_retention.items()}
        return InfluxStore(
            settings.influx_url,
            settings.influx_database,
            settings.influx_retention_policy,
            settings.influx_token,
            settings.influx_username,
            settings.influx_password,
            rollup_policies=policies,
        )


STORES: Registry[Any] = Registry("store", (EmbeddedKind, InfluxKind))


def open_store(
    kind: str,
    data_dir: Path,
    retention_s: float,
    settings: Any = None,
    rollup_retention: dict[str, float] | None = None,
) -> Store:
    """The store named kind, from the settings it declares (the aggregator's settings include
    them; None: its defaults)."""
    try:
        plugin = STORES[kind]
    except UnknownPlugin as exc:
        raise StoreError(str(exc)) from None
    if settings is None and plugin.settings is not None:
        settings = plugin.settings()
    return plugin.open(settings, data_dir, retention_s, rollup_retention or {})


__all__ = [
    "STORES",
    "EmbeddedStore",
    "HistoryQuery",
    "InfluxSettings",
    "Point",
    "Series",
    "Store",
    "StoreError",
    "open_store",
]
