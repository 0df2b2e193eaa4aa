"""Stores behind one contract (base.Store), chosen by name."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

from gpufleet.aggregator.store.base import HistoryQuery, Point, Series, Store, StoreError
from gpufleet.aggregator.store.embedded import EmbeddedStore


def _embedded(data_dir: Path, retention_s: float, rollup_retention: dict[str, float] | None = None) -> Store:
    return EmbeddedStore(data_dir / "store.sqlite3", retention_s, retention_by_suffix=rollup_retention)


def _influxdb(
    influx_url: str,
    influx_database: str,
    influx_retention_policy: str = "",
    influx_token: str = "",
    influx_username: str = "",
    influx_password: str = "",
    rollup_retention: dict[str, float] | None = None,
    data_dir: Path | None = None,
    retention_s: float | None = None,
) -> Store:
    # data_dir and retention_s are not InfluxDB's to use: the database and its retention
    # policies are the operator's (roll-up tiers get policies of their own).
    from gpufleet.aggregator.store.influx import InfluxStore

    policies = {
        suffix: (f"gpufleet{suffix}", seconds) for suffix, seconds in (rollup_retention or {}).items()
    }
    return InfluxStore(
        influx_url,
        influx_database,
        influx_retention_policy,
        influx_token,
        influx_username,
        influx_password,
        rollup_policies=policies,
    )


BACKENDS: dict[str, Callable[..., Store]] = {
    "embedded": _embedded,
    "influxdb": _influxdb,
}


def open_store(kind: str, data_dir: Path, retention_s: float, **options: object) -> Store:
    """The store named kind, with the options it takes; an option it does not take is an
    error (a setting meant for another store is a misconfiguration, not something to ignore)."""
    try:
        factory = BACKENDS[kind]
    except KeyError:
        raise StoreError(f"unknown store {kind!r}; choose one of {', '.join(BACKENDS)}") from None
    takes = inspect.signature(factory).parameters
    unknown = sorted(set(options) - set(takes))
    if unknown:
        raise StoreError(
            f"store {kind!r} does not take {', '.join(unknown)}; it takes "
            f"{', '.join(sorted(set(takes) - {'data_dir', 'retention_s'}))}"
        )
    return factory(data_dir=data_dir, retention_s=retention_s, **options)


__all__ = [
    "BACKENDS",
    "EmbeddedStore",
    "HistoryQuery",
    "Point",
    "Series",
    "Store",
    "StoreError",
    "open_store",
]
