"""The store contract every backend (embedded, InfluxDB) implements.

A point's identity is measurement + tags + timestamp: writing the same identity again
overwrites the fields it carries (InfluxDB's rule), so replays never double.
Methods are blocking; the aggregator calls them from worker threads.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

FieldValue = float | int | str | bool


class SharedTags(dict[str, str]):
    """A point's tags, one object for every point of its series, never changed once made (the
    point converter keeps one per GPU): a store may remember the series by the object itself
    instead of hashing the tags for every point."""

    __slots__ = ()


class Point(NamedTuple):
    # A NamedTuple rather than a frozen dataclass: built 16,000 times a second at fleet
    # scale, and tuple construction is several times cheaper than a frozen __init__.
    measurement: str
    tags: Mapping[str, str]
    fields: Mapping[str, FieldValue]
    time_unix_ns: int


@dataclass(frozen=True)
class HistoryQuery:
    measurement: str
    field: str
    start_unix_ns: int
    end_unix_ns: int
    step_ns: int
    aggregate: str = "mean"
    # tag name -> allowed values; a tag not named here is not filtered.
    filters: Mapping[str, Sequence[str]] = field(default_factory=dict)
    # The measurement already holds one point per step bucket, at the bucket's start (a roll-up
    # read at its own step with its own aggregate): a store may return the points as stored
    # instead of grouping them again. Grouping gives the same answer, only slower.
    as_stored: bool = False
    # Aggregate across the series sharing these tags' values: one series per group, tagged with
    # them alone (a tag a series lacks groups as ""). Empty: one series per stored series.
    group_by: tuple[str, ...] = ()


@dataclass
class Series:
    tags: dict[str, str]
    times_unix_ns: list[int]
    values: list[float]


class StoreError(RuntimeError):
    """The store could not do what was asked; the message says what and why."""


class StoreUnavailable(StoreError):
    """The store cannot take writes now (down, overloaded, disk full, I/O error, credentials):
    nothing about the points themselves; the same write may succeed later."""


class PointsRefused(StoreError):
    """The store will not take these points (a value it cannot hold, a type conflict): writing
    them again fails the same way; the writer finds the report(s) that cause it."""


def is_unavailable(exc: BaseException) -> bool:
    """True for a failure of the store or the disk, False for one caused by the data (or by a
    bug, which retrying the same batch would repeat)."""
    return isinstance(exc, StoreUnavailable | OSError)


@dataclass(frozen=True)
class ProratedSum:
    """What Store.sum_prorated sums: fields of points whose own interval may reach past the
    range asked (a workload's summary, stored at its end, covering its start to its end)."""

    measurement: str
    start_unix_ns: int  # the points' times read (a workload ending after since...)
    end_unix_ns: int
    since_s: float  # the range the sums are for
    until_s: float
    start_field: str
    end_field: str
    sum_fields: tuple[str, ...]
    group_fields: tuple[str, ...] = ()


@dataclass
class ProratedRow:
    tags: dict[str, str]
    group: tuple[str, ...]  # the values of the group fields ("" where a point has none)
    count: int
    sums: list[float]


BUCKET_STATS = ("mean", "max", "min", "count")  # what bucket_stats gives for each field
# {(sorted tags, bucket start): {"<field>_<stat>": value}}: a chunk of Store.bucket_stats
BucketStats = dict[tuple[tuple[tuple[str, str], ...], int], dict[str, float]]


class Store(abc.ABC):
    @abc.abstractmethod
    def write(self, points: Sequence[Point]) -> None:
        """Make points durable; return only once they are. Raises StoreUnavailable when the
        store cannot take writes now, PointsRefused when it will not take these points."""

    def settle(self) -> int:
        """Move the points a store staged on write into place for reading (the embedded store:
        aggregator/store/embedded.py); how many. A store that writes in place has none."""
        return 0

    @abc.abstractmethod
    def query_history(self, query: HistoryQuery) -> list[Series]:
        """Bucket query.field into step-wide buckets aligned to the epoch, one series per
        distinct tag set (or per group_by group, aggregating over all its series' samples in
        a bucket); empty buckets are omitted."""

    def bucket_stats(
        self, measurement: str, fields: Sequence[str], start_unix_ns: int, end_unix_ns: int, step_ns: int
    ) -> Iterator[BucketStats]:
        """Every series' statistics of each field in step-wide buckets of [start, end), in
        chunks of some series each (a roll-up writes a chunk before it reads the next, so its
        memory is a chunk's, not the fleet's: aggregator/fleet/rollups.py). This one asks
        query_history per field and statistic (bucket_stats_by_query), one chunk; a store that
        answers them all in one pass overrides it."""
        yield bucket_stats_by_query(self, measurement, fields, start_unix_ns, end_unix_ns, step_ns)

    @abc.abstractmethod
    def query_points(
        self,
        measurement: str,
        start_unix_ns: int,
        end_unix_ns: int,
        filters: Mapping[str, Sequence[str]] | None = None,
    ) -> list[Point]:
        """Raw points in [start, end), oldest first."""

    def sum_prorated(self, q: ProratedSum) -> list[ProratedRow]:
        """prorated_sums over the points read; a store that sums in place overrides it."""
        return prorated_sums(self.query_points(q.measurement, q.start_unix_ns, q.end_unix_ns), q)

    @abc.abstractmethod
    def latest(self, measurement: str) -> list[Point]:
        """The newest point of every series of a measurement."""

    @abc.abstractmethod
    def apply_retention(self, now_unix_ns: int) -> int | None:
        """Delete what is older than the retention; return how many points went, or None
        for a store that enforces retention itself (InfluxDB retention policies)."""

    @property
    def points_dropped_total(self) -> int:
        """Points the store dropped after accepting a write (0 for a store that never does)."""
        return 0

    @abc.abstractmethod
    def close(self) -> None: ...


def matches(tags: Mapping[str, str], filters: Mapping[str, Sequence[str]] | None) -> bool:
    return not filters or all(tags.get(k) in set(v) for k, v in filters.items() if v)


def prorated_sums(points: Sequence[Point], q: ProratedSum) -> list[ProratedRow]:
    """Sums of q.sum_fields over points, each weighted by the share of its own interval (its
    q.start_field to its q.end_field, Unix seconds) inside [q.since_s, q.until_s) (points with
    none inside left out), grouped by series and the values of q.group_fields: what
    Store.sum_prorated answers (the embedded store in SQL, where the points are)."""
    rows: dict[tuple[tuple[tuple[str, str], ...], tuple[str, ...]], ProratedRow] = {}
    for p in points:
        begin, end = p.fields.get(q.start_field), p.fields.get(q.end_field)
        if not isinstance(begin, int | float) or not isinstance(end, int | float) or end <= begin:
            continue
        inside = min(float(end), q.until_s) - max(float(begin), q.since_s)
        if inside <= 0:
            continue
        share = inside / (float(end) - float(begin))
        key = (tuple(sorted(p.tags.items())), tuple(str(p.fields.get(f, "")) for f in q.group_fields))
        row = rows.get(key)
        if row is None:
            row = rows[key] = ProratedRow(dict(key[0]), key[1], 0, [0.0] * len(q.sum_fields))
        row.count += 1
        for i, name in enumerate(q.sum_fields):
            value = p.fields.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                row.sums[i] += float(value) * share
    return list(rows.values())


def bucket_stats_by_query(
    store: Store, measurement: str, fields: Sequence[str], start_unix_ns: int, end_unix_ns: int, step_ns: int
) -> BucketStats:
    """Every series' mean, max, min and count of each field in step-wide buckets of
    [start, end): {(sorted tags, bucket start): {"<field>_<stat>": value}} (what a roll-up
    writes: aggregator/fleet/rollups.py), asking query_history once per field and statistic."""
    merged: BucketStats = {}
    for name in fields:
        for stat in BUCKET_STATS:
            for series in store.query_history(
                HistoryQuery(measurement, name, start_unix_ns, end_unix_ns, step_ns, stat)
            ):
                key = tuple(sorted(series.tags.items()))
                for t, v in zip(series.times_unix_ns, series.values, strict=True):
                    merged.setdefault((key, t), {})[f"{name}_{stat}"] = int(v) if stat == "count" else v
    return merged
