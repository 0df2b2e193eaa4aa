"""The store contract. Every backend must pass these: the `store` fixture (tests/store/conftest.py)
is each backend in turn."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gpufleet.aggregator.store import EmbeddedStore, HistoryQuery, Point, Store
from gpufleet.aggregator.store.embedded_read import BUCKET_STATS_ROWS

S = 1_000_000_000
T0 = 1_790_000_040 * S  # a fixed instant on a minute boundary (buckets align to the epoch)


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


@pytest.mark.parametrize("aggregate", ["mean", "max", "min", "p95", "last", "count"])
def test_history_grouped_aggregates_over_every_sample_of_the_group(store: Store, aggregate: str) -> None:
    """group_by: one series per group, each step over all of the group's samples (not a mean
    of per-GPU means). Two clusters of 3 nodes x 4 GPUs, one node without a model tag."""
    points, samples = [], {}
    for c, cluster in enumerate(("east", "west")):
        for n in range(3):
            for g in range(4):
                tags = {"node": f"{cluster}-{n}", "gpu": str(g), "cluster": cluster}
                if n < 2:
                    tags["model"] = "H100" if c == 0 else "H200"
                offset = (c * 12 + n * 4 + g) * 1000  # distinct times: one "last" per bucket
                for i in range(120):
                    v = float((i * 31 + g * 7 + n * 13 + c * 5) % 97) + g / 4
                    t = T0 + i * S + offset
                    points.append(Point("gpu", tags, {"util_gpu_pct": v}, t))
                    samples.setdefault(cluster, []).append((t, v))
    store.write(points)
    series = store.query_history(
        HistoryQuery("gpu", "util_gpu_pct", T0, T0 + 120 * S, 60 * S, aggregate, group_by=("cluster",))
    )
    assert [s.tags for s in series] == [{"cluster": "east"}, {"cluster": "west"}]
    for s in series:
        assert s.times_unix_ns == [T0, T0 + 60 * S]
        for b, got in enumerate(s.values):
            bucket = sorted(
                (t, v) for t, v in samples[s.tags["cluster"]] if T0 + b * 60 * S <= t < T0 + (b + 1) * 60 * S
            )
            values = [v for _, v in bucket]
            want = {
                "mean": sum(values) / len(values),
                "max": max(values),
                "min": min(values),
                "p95": sorted(values)[math.ceil(0.95 * len(values)) - 1],
                "last": bucket[-1][1],
                "count": len(values),
            }[aggregate]
            assert got == pytest.approx(want)
    by_model = store.query_history(
        HistoryQuery("gpu", "util_gpu_pct", T0, T0 + 120 * S, 60 * S, "count", group_by=("model",))
    )
    # A series without the tag is a group of its own, named "".
    assert [(s.tags, s.values) for s in by_model] == [
        ({"model": ""}, [2 * 4 * 60.0, 2 * 4 * 60.0]),
        ({"model": "H100"}, [2 * 4 * 60.0, 2 * 4 * 60.0]),
        ({"model": "H200"}, [2 * 4 * 60.0, 2 * 4 * 60.0]),
    ]


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


# --- roll-ups (built on the contract, so they run on both stores) -------------------------

from gpufleet.aggregator.fleet import rollups  # noqa: E402

H0 = (T0 // (3600 * S) + 1) * 3600 * S  # an hour boundary: hourly buckets align to the epoch


def test_rollups_hold_exact_bucket_statistics_and_recompute_idempotently(store: Store) -> None:
    # 3 hours of 10 s samples on two GPUs, values known in advance.
    values = {g: [float((i * 7 + g * 3) % 50) for i in range(3 * 360)] for g in range(2)}
    store.write(
        [
            gpu_point("n1", g, H0 + i * 10 * S, util_gpu_pct=values[g][i], power_w=100.0 + g)
            for g in range(2)
            for i in range(3 * 360)
        ]
    )
    hour = rollups.TIERS[1]
    written = rollups.compute(store, hour, H0, H0 + 3 * 3600 * S)
    again = rollups.compute(store, hour, H0, H0 + 3 * 3600 * S)
    assert written == again == 6, "3 hours x 2 GPUs, overwritten (not doubled) on a second pass"
    got = store.query_points("gpu_1h", H0, H0 + 3 * 3600 * S, {"gpu": ["1"]})
    assert [p.time_unix_ns for p in got] == [H0 + h * 3600 * S for h in range(3)]
    for h, p in enumerate(got):
        bucket = values[1][h * 360 : (h + 1) * 360]
        assert p.fields["util_gpu_pct_mean"] == pytest.approx(sum(bucket) / 360)
        assert (p.fields["util_gpu_pct_max"], p.fields["util_gpu_pct_min"]) == (max(bucket), min(bucket))
        assert p.fields["util_gpu_pct_count"] == 360 and p.fields["power_w_mean"] == pytest.approx(101.0)
        assert p.tags == {"node": "n1", "gpu": "1", "cluster": "c1"}


def test_a_stores_own_bucket_statistics_equal_the_ones_its_history_queries_give(store: Store) -> None:
    """A store that answers a roll-up's statistics in one pass (the embedded store's single
    SQL) gives what asking query_history per field and statistic gives (Store.bucket_stats):
    with fields missing from some samples, integers, several series and partial buckets."""
    store.write(
        [
            gpu_point(
                f"n{n}", g, H0 + i * 7 * S, util_gpu_pct=float((i * 11 + g) % 101), power_w=300.0 + i % 9
            )
            for n in range(3)
            for g in range(2)
            for i in range(700)
        ]
        + [gpu_point("n9", 0, H0 + i * 61 * S, temp_gpu_c=float(40 + i % 30)) for i in range(60)]
    )
    fields = rollups.rolled_fields("gpu")
    for start, end, step in ((H0, H0 + 3600 * S, 60 * S), (H0 + 5 * S, H0 + 7200 * S, 3600 * S)):
        own = {
            k: v for chunk in store.bucket_stats("gpu", fields, start, end, step) for k, v in chunk.items()
        }
        (asked,) = Store.bucket_stats(store, "gpu", fields, start, end, step)
        assert own.keys() == asked.keys() and own
        for key, stats in asked.items():
            assert own[key].keys() == stats.keys(), key
            assert own[key] == pytest.approx(stats), key


def test_a_rollup_over_more_series_than_a_chunk_of_statistics_writes_every_series(store: Store) -> None:
    """The embedded store gives statistics BUCKET_STATS_ROWS series x buckets at a time (a
    roll-up writes each chunk before it reads the next): every series of the bucket is rolled
    up, the ones of the last, partial chunk too, each with its own statistics."""
    n = BUCKET_STATS_ROWS + 7
    store.write(
        [
            gpu_point(f"n{i // 8}", i % 8, T0 + k * 20 * S, util_gpu_pct=float(i % 90 + k))
            for i in range(n)
            for k in range(3)
        ]
    )
    assert rollups.compute(store, rollups.TIERS[0], T0, T0 + 60 * S) == n
    rolled = {
        (p.tags["node"], p.tags["gpu"]): p.fields for p in store.query_points("gpu_1m", T0, T0 + 60 * S)
    }
    assert len(rolled) == n
    for i in range(n):
        fields = rolled[(f"n{i // 8}", str(i % 8))]
        assert fields["util_gpu_pct_mean"] == pytest.approx(i % 90 + 1.0)
        assert (fields["util_gpu_pct_min"], fields["util_gpu_pct_max"], fields["util_gpu_pct_count"]) == (
            i % 90,
            i % 90 + 2,
            3,
        )


@pytest.mark.parametrize("aggregate", ["mean", "max", "min"])
def test_a_rollup_read_as_stored_answers_as_regrouping_it_would(store: Store, aggregate: str) -> None:
    values = [float((i * 13) % 97) for i in range(4 * 360)]
    store.write([gpu_point("n1", 0, H0 + i * 10 * S, util_gpu_pct=v) for i, v in enumerate(values)])
    rollups.compute(store, rollups.TIERS[1], H0, H0 + 4 * 3600 * S)
    # An unaligned start: the first bucket's stored point lies before it and is not returned.
    start, end = H0 + 600 * S, H0 + 4 * 3600 * S
    field = f"util_gpu_pct_{aggregate}"
    grouped = store.query_history(
        HistoryQuery("gpu_1h", field, start, end, 3600 * S, aggregate, {"node": ["n1"]})
    )
    lean = store.query_history(
        HistoryQuery("gpu_1h", field, start, end, 3600 * S, aggregate, {"node": ["n1"]}, True)
    )
    assert [(s.tags, s.times_unix_ns, s.values) for s in lean] == [
        (s.tags, s.times_unix_ns, s.values) for s in grouped
    ]
    assert lean[0].times_unix_ns == [H0 + h * 3600 * S for h in (1, 2, 3)]
    assert rollups.read_as_stored("gpu_1h", 3600 * S) and not rollups.read_as_stored("gpu_1h", 7200 * S)
    assert not rollups.read_as_stored("gpu", 3600 * S)


def test_late_data_lands_in_a_recomputed_rollup(store: Store) -> None:
    minute = rollups.TIERS[0]
    store.write([gpu_point("n1", 0, T0 + i * S, util_gpu_pct=10.0) for i in range(30)])
    rollups.compute(store, minute, T0, T0 + 60 * S)
    store.write(
        [gpu_point("n1", 0, T0 + (30 + i) * S, util_gpu_pct=70.0) for i in range(30)]
    )  # replayed late
    rollups.compute(store, minute, T0, T0 + 60 * S)
    (p,) = store.query_points("gpu_1m", T0, T0 + 60 * S)
    assert p.fields["util_gpu_pct_mean"] == pytest.approx(40.0) and p.fields["util_gpu_pct_count"] == 60


def test_long_ranges_route_to_the_coarsest_fitting_rollup() -> None:
    day, hour = 86400 * S, 3600 * S
    assert rollups.route("gpu", "util_gpu_pct", "mean", 0, 30 * day, hour) == ("gpu_1h", "util_gpu_pct_mean")
    assert rollups.route("gpu", "temp_gpu_c", "max", 0, 2 * day, 60 * S) == ("gpu_1m", "temp_gpu_c_max")
    assert rollups.route("gpu", "util_gpu_pct", "mean", 0, hour, 60 * S) == ("gpu", "util_gpu_pct"), (
        "short: raw"
    )
    assert rollups.route("gpu", "util_gpu_pct", "p95", 0, 30 * day, hour) == ("gpu", "util_gpu_pct"), (
        "p95: raw"
    )
    assert rollups.route("collector", "seq", "max", 0, 30 * day, hour) == ("collector", "seq")


def test_rollup_tiers_keep_their_own_retention(tmp_path: Path) -> None:
    s = EmbeddedStore(
        tmp_path / "r.sqlite3",
        retention_s=14 * 86400,
        retention_by_suffix={"_1m": 90 * 86400, "_1h": 730 * 86400},
    )
    now = T0 + 400 * 86400 * S
    for measurement, age_days in (("gpu", 20), ("gpu_1m", 100), ("gpu_1h", 100), ("gpu_1h", 800)):
        s.write([Point(measurement, {"node": "n1", "gpu": "0"}, {"x": 1.0}, now - age_days * 86400 * S)])
    assert s.apply_retention(now) == 3, "raw past 14 d, 1m past 90 d, 1h past 730 d"
    (kept,) = s.query_points("gpu_1h", 0, now)
    assert kept.time_unix_ns == now - 100 * 86400 * S
    s.close()


def test_an_unknown_store_is_refused_with_the_choices(tmp_path: Path) -> None:
    from gpufleet.aggregator.store import StoreError, open_store

    with pytest.raises(StoreError, match=r"store='mongodb': use one of embedded \(SQLite.*influxdb \("):
        open_store("mongodb", tmp_path, 86400)


def test_a_workload_summary_round_trips_and_adds_no_series_per_job(store: Store) -> None:
    """A workload's summary (aggregator/workloads/summary.py) is one point whose tags are only the
    bounded owner dimensions: 200 jobs of one account are one series; read back, each summary is
    what was written (the job id, user and per-GPU figures are fields), ten jobs ending in one
    second included."""
    from gpufleet.aggregator.workloads.summary import MEASUREMENT, Summary, from_point, to_point

    base = 1_700_000_000.0
    written = [
        Summary(
            scheduler="slurm",
            id=str(1000 + k),
            user=f"user-{k % 7}",
            account="vision",
            partition="gpu",
            namespace="",
            team="cv",
            name=f'run "{k}", with, commas',
            nodes=("gpu-node-01", "gpu-node-02"),
            gpus=4,
            start_unix_s=base + k,
            end_unix_s=base + k // 10 + 600.25,  # ten jobs end in each second
            gpu_hours_allocated=4 * 600 / 3600,
            gpu_hours_effective=4 * 600 / 3600 * 0.375,
            gpu_hours_idle=0.0,
            util_mean_pct=37.5,
            util_max_pct=40.0,
            sm_mean_pct=None,
            hbm_peak_bytes=3 << 30,
            energy_j=1.5e6,
            model="NVIDIA H100 80GB HBM3",
            per_gpu=(("gpu-node-01", 0, 600.0, 37.5, 40.0, 0.0, None, 3 << 30, 3.75e5),),
        )
        for k in range(200)
    ]
    store.write([to_point(s) for s in written])
    read = [
        from_point(p) for p in store.query_points(MEASUREMENT, int(base * 1e9), int((base + 10_000) * 1e9))
    ]
    assert sorted(read, key=lambda s: s.id) == written
    assert len(store.latest(MEASUREMENT)) == 1, "one series for the account, not one per job"


def test_prorated_sums_count_each_points_share_of_the_range(store: Store) -> None:
    """Store.sum_prorated (the embedded store's in SQL, InfluxDB's over its points) weighs each
    point by the share of its own interval inside the range, as the workloads' usage does in
    Python for the running ones (aggregator/workloads/summary.py summary_parts)."""
    from gpufleet.aggregator.store.base import ProratedSum

    base = 1_700_000_000.0
    points = [
        # (account, start, end, allocated GPU-hours): inside, crossing each edge, outside.
        ("vision", base + 100, base + 200, 1.0),
        ("vision", base - 100, base + 100, 2.0),
        ("llm", base + 900, base + 1100, 4.0),
        ("llm", base - 500, base - 100, 8.0),
    ]
    store.write(
        [
            Point(
                "workload",
                {"account": account},
                {"start_unix_s": start, "end_unix_s": end, "gpu_hours_allocated": hours, "model": "H100"},
                int(end * 1e9) + k,
            )
            for k, (account, start, end, hours) in enumerate(points)
        ]
    )
    rows = store.sum_prorated(
        ProratedSum(
            "workload",
            int((base - 1000) * 1e9),
            int((base + 2000) * 1e9),
            base,
            base + 1000,
            "start_unix_s",
            "end_unix_s",
            ("gpu_hours_allocated", "gpu_hours_idle"),
            ("model",),
        )
    )
    got = {(r.tags["account"], r.group): (r.count, [round(v, 9) for v in r.sums]) for r in rows}
    assert got == {("vision", ("H100",)): (2, [2.0, 0.0]), ("llm", ("H100",)): (1, [2.0, 0.0])}
