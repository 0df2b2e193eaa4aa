"""The store area's fixtures: every store backend behind one fixture (the embedded SQLite store
and a real influxd), so a contract test runs against each."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.aggregator.store import EmbeddedStore, Store


def _embedded(tmp: Path) -> Store:
    return EmbeddedStore(tmp / "store.sqlite3", retention_s=86400)


def _influx(tmp: Path, url: str) -> Store:
    from gpufleet.aggregator.store.influx import InfluxStore

    # A database of its own per test; roll-up tiers in retention policies of their own.
    return InfluxStore(
        url,
        f"contract_{uuid.uuid4().hex[:12]}",
        rollup_policies={"_1m": ("gpufleet_1m", 90 * 86400), "_1h": ("gpufleet_1h", 730 * 86400)},
    )


@pytest.fixture(params=["embedded", "influxdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "embedded":
        s = _embedded(tmp_path)
    else:
        s = _influx(tmp_path, request.getfixturevalue("influxd"))
    yield s
    s.close()
