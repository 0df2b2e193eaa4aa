"""The store contract. Every backend must pass these; the fixture lists the backends
(the InfluxDB one joins in the storage issue)."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.aggregator.store import EmbeddedStore, HistoryQuery, Point, Store

S = 1_000_000_000
T0 = 1_790_000_040 * S  # a fixed instant on a minute boundary (buckets align to the epoch)


def _embedded(tmp: Path) -> Store:
    return EmbeddedStore(tmp / "store.sqlite3", retention_s=86400)


def _influx(tmp: Path, url: str) -> Store:
    from gpufleet.aggregator.store.influx import InfluxStore

    return InfluxStore(url, f"contract_{uuid.uuid4().hex[:12]}")  # a database of its own per test


@pytest.fixture(params=["embedded", "influxdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "embedded":
        s = _embedded(tmp_path)
    else:
        s = _influx(tmp_path, request.getfixturevalue("influxd"))
    yield s
    s.close()


def gpu_point(node: str, gpu: int, t: int, **fields: float | int) -> Point:
    return Point("gpu", {"node": node, "gpu": str(gpu), "cluster": "c1"}, fields, t)


def test_replayed_points_overwrite_instead_of_doubling(store: Store) -> None:
    points = [gpu_point("n1", g, T0 + i * S, util_gpu_pct=float(i)) for i in range(10) for g in range(2)]
    store.write(points)
    store.write(points[:7])  # a replay after reconnect
    got = store.query_points("gpu", T0, T0 + 60 * S)
    assert len(got) == 20
    # Same identity with other fields: merged, newest value wins (InfluxDB's rule).
    store.write([gpu_point("n1", 0, T0, util_gpu_pct=99.0, power_w=300.5)])
    first = [p for p in store.query_points("gpu", T0, T0 + 1) if p.tags["gpu"] == "0"]
    assert first[0].fields == {"util_gpu_pct": 99.0, "power_w": 300.5}


def test_absent_fields_stay_absent(store: Store) -> None:
    store.write(
        [
            gpu_point("n1", 0, T0, util_gpu_pct=50.0, power_w=250.0),
            gpu_point("n1", 0, T0 + S, util_gpu_pct=60.0),
        ]
    )
    later = store.query_points("gpu", T0 + S, T0 + 2 * S)[0]
    assert "power_w" not in later.fields
    mean_power = store.query_history(HistoryQuery("gpu", "power_w", T0, T0 + 60 * S, 60 * S))
    assert mean_power[0].values == [250.0], "an absent value is not averaged in as 0"


@pytest.mark.parametrize("aggregate", ["mean", "max", "min", "p95", "last", "count"])
def test_history_buckets_and_aggregates(store: Store, aggregate: str) -> None:
    # 3 minutes of 1 s samples on two GPUs; values are distinct per second.
    values = {g: [((i * 37 + g * 11) % 100) + 0.5 for i in range(180)] for g in range(2)}
    store.write(
        [gpu_point("n1", g, T0 + i * S, util_gpu_pct=values[g][i]) for g in range(2) for i in range(180)]
    )
    series = store.query_history(HistoryQuery("gpu", "util_gpu_pct", T0, T0 + 180 * S, 60 * S, aggregate))
    assert [s.tags["gpu"] for s in series] == ["0", "1"]
    for s in series:
        assert s.times_unix_ns == [T0, T0 + 60 * S, T0 + 120 * S]
        for b, got in enumerate(s.values):
            bucket = values[int(s.tags["gpu"])][b * 60 : (b + 1) * 60]
            want = {
                "mean": sum(bucket) / 60,
                "max": max(bucket),
                "min": min(bucket),
                "p95": sorted(bucket)[math.ceil(0.95 * 60) - 1],
                "last": bucket[-1],
                "count": 60,
            }[aggregate]
            assert got == pytest.approx(want)


def test_history_filters_and_empty_buckets(store: Store) -> None:
    store.write(
        [
            gpu_point(node, g, T0 + i * 30 * S, util_gpu_pct=10.0 * g)
            for node in ("n1", "n2")
            for g in range(4)
            for i in (0, 1, 4)
        ]
    )
    series = store.query_history(
        HistoryQuery(
            "gpu", "util_gpu_pct", T0, T0 + 300 * S, 60 * S, "mean", {"node": ["n2"], "gpu": ["1", "3"]}
        )
    )
    assert [(s.tags["node"], s.tags["gpu"]) for s in series] == [("n2", "1"), ("n2", "3")]
    # Samples at 0 s, 30 s and 120 s: buckets 0 and 2 have data, bucket 1 is omitted.
    assert series[0].times_unix_ns == [T0, T0 + 120 * S]
    assert series[1].values == [30.0, 30.0]
    assert (
        store.query_history(
            HistoryQuery("gpu", "util_gpu_pct", T0, T0 + 300 * S, 60 * S, "mean", {"node": ["nope"]})
        )
        == []
    )


def test_latest_point_of_every_series(store: Store) -> None:
    store.write([gpu_point("n1", g, T0 + i * S, util_gpu_pct=float(i)) for g in range(3) for i in range(5)])
    latest = store.latest("gpu")
    assert sorted((p.tags["gpu"], p.time_unix_ns, p.fields["util_gpu_pct"]) for p in latest) == [
        (str(g), T0 + 4 * S, 4.0) for g in range(3)
    ]
    assert store.latest("engine") == []


def test_retention_removes_only_old_points(store: Store) -> None:
    store.write([gpu_point("n1", 0, T0 + h * 3600 * S, util_gpu_pct=1.0) for h in range(30)])
    removed = store.apply_retention(now_unix_ns=T0 + 29 * 3600 * S)  # keeps 24 h
    if removed is None:
        pytest.skip("this store enforces retention itself (InfluxDB retention policies)")
    assert removed == 5
    left = store.query_points("gpu", 0, T0 + 31 * 3600 * S)
    assert [p.time_unix_ns for p in left] == [T0 + h * 3600 * S for h in range(5, 30)]


def test_odd_tag_values_round_trip(store: Store) -> None:
    tags = {"node": 'rack 3,node=7 "α"', "gpu": "0", "model": "NVIDIA H100 80GB HBM3"}  # noqa: RUF001 (unicode on purpose)
    store.write([Point("gpu", tags, {"util_gpu_pct": 1.0}, T0)])
    (got,) = store.query_points("gpu", T0, T0 + 1, {"node": [tags["node"]]})
    assert got.tags == tags


def test_strings_and_booleans_keep_their_type(store: Store) -> None:
    store.write([Point("collector", {"node": "n1"}, {"seq": 7, "boot_id": "abc", "ok": True}, T0)])
    (got,) = store.query_points("collector", T0, T0 + 1)
    assert got.fields["seq"] == 7 and isinstance(got.fields["seq"], int)
    assert got.fields["boot_id"] == "abc"
    assert bool(got.fields["ok"]) is True


def test_embedded_store_is_durable_across_reopen(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "s.sqlite3", retention_s=86400)
    store.write([gpu_point("n1", 0, T0, util_gpu_pct=42.0)])
    store.close()
    reopened = EmbeddedStore(tmp_path / "s.sqlite3", retention_s=86400)
    assert reopened.query_points("gpu", T0, T0 + 1)[0].fields["util_gpu_pct"] == 42.0
    (by_node,) = reopened.query_points("gpu", T0, T0 + 1, {"node": ["n1"], "gpu": ["0"]})
    assert by_node.tags == {"node": "n1", "gpu": "0", "cluster": "c1"}
    reopened.write([gpu_point("n1", 0, T0 + S, util_gpu_pct=43.0)])  # series ids survive too
    assert len(reopened.query_points("gpu", T0, T0 + 2 * S)) == 2
    reopened.close()
