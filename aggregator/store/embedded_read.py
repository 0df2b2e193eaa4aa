"""The embedded store's reads: history (aggregated in SQL, grouped over a series-to-group map),
points of a range, the latest point of each series, and retention."""

from __future__ import annotations

import json
import logging
import re
import sqlite3
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence

from gpufleet.aggregator.store.base import (
    BucketStats,
    HistoryQuery,
    Point,
    ProratedRow,
    ProratedSum,
    Series,
    StoreError,
    matches,
)

log = logging.getLogger("gpufleet.aggregator.store")

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_SQL_AGG = {"mean": "AVG", "max": "MAX", "min": "MIN", "count": "COUNT"}
# Series x buckets per chunk of bucket_stats: about 2 MiB of statistics, whatever the range.
BUCKET_STATS_ROWS = 1000


def ident(name: str, what: str) -> str:
    if not _NAME.match(name):
        raise StoreError(f"{what} name {name!r} is not usable: use [a-z_][a-z0-9_]*")
    return f'"{name}"'


def tables_on_disk(conn: sqlite3.Connection, prefix: str, schema: str = "main") -> dict[str, set[str]]:
    """The tables named `<prefix>_<measurement>` in a schema, and each one's field columns."""
    columns: dict[str, set[str]] = {}
    for (table,) in conn.execute(
        f"SELECT name FROM {schema}.sqlite_master WHERE type='table' AND name LIKE '{prefix}\\_%' ESCAPE '\\'"
    ).fetchall():
        cols = {row[1] for row in conn.execute(f'PRAGMA {schema}.table_info("{table}")')}
        columns[table[len(prefix) + 1 :]] = cols - {"series_id", "ts"}
    return columns


class EmbeddedReads:
    def _series_ids(
        self, measurement: str, filters: Mapping[str, Sequence[str]] | None
    ) -> dict[int, dict[str, str]]:
        with self._cache_lock:
            return {
                sid: tags
                for sid, (m, tags) in self._series_tags.items()
                if m == measurement and matches(tags, filters)
            }

    def query_history(self, query: HistoryQuery) -> list[Series]:
        if query.step_ns <= 0:
            raise StoreError(f"step must be positive, got {query.step_ns} ns")
        table = ident("m_" + query.measurement, "measurement")
        col = ident(query.field, "field")
        self._reader_catch_up(query.measurement)
        series = self._series_ids(query.measurement, query.filters)
        if not series or query.field not in self._read_columns.get(query.measurement, ()):
            return []
        # Each series' group: itself, or the index of its group_by tag values. The SQL groups
        # by it, so a group's mean, max, min and count are over all of its samples in a bucket
        # (as InfluxDB's GROUP BY a tag), not a mean of means.
        groups: dict[tuple[str, ...], int] = {}
        group_of: dict[int, int] = {}
        group_tags: dict[int, dict[str, str]] = {}
        for sid, tags in series.items():
            if query.group_by:
                key = tuple(tags.get(t, "") for t in query.group_by)
                gid = groups.setdefault(key, len(groups))
                group_tags[gid] = dict(zip(query.group_by, key, strict=True))
            else:
                gid = sid
                group_tags[gid] = dict(tags)
            group_of[sid] = gid
        where = (
            f"FROM json_each(?) g JOIN {table} t ON t.series_id = CAST(g.key AS INTEGER) "
            f"WHERE t.ts >= ? AND t.ts < ? AND t.{col} IS NOT NULL"
        )
        args = (json.dumps(group_of), query.start_unix_ns, query.end_unix_ns)
        step = int(query.step_ns)
        bucket = f"g.value, t.ts / {step}"
        if query.aggregate in _SQL_AGG:
            sql = f"SELECT {bucket}, {_SQL_AGG[query.aggregate]}(t.{col}) {where} GROUP BY 1, 2 ORDER BY 1, 2"
        elif query.aggregate == "last":
            # SQLite returns the bare column from the row holding MAX(ts).
            sql = f"SELECT {bucket}, t.{col}, MAX(t.ts) {where} GROUP BY 1, 2 ORDER BY 1, 2"
        elif query.aggregate == "p95":
            sql = f"SELECT {bucket}, t.{col} {where} ORDER BY 1, 2, 3"
        else:
            raise StoreError(f"unknown aggregate {query.aggregate!r}")
        with self._rlock:
            rows = self._r.execute(sql, args).fetchall()
        out: dict[int, Series] = {}
        if query.aggregate == "p95":
            buckets: dict[tuple[int, int], list[float]] = defaultdict(list)
            for gid, b, value in rows:
                buckets[(gid, b)].append(value)
            rows = [(gid, b, _nearest_rank(vals, 0.95)) for (gid, b), vals in buckets.items()]
        for row in rows:
            gid, b, value = row[0], row[1], row[2]
            s = out.get(gid)
            if s is None:
                s = out[gid] = Series(group_tags[gid], [], [])
            s.times_unix_ns.append(b * step)
            s.values.append(float(value))
        return sorted(out.values(), key=lambda s: sorted(s.tags.items()))

    def bucket_stats(
        self, measurement: str, fields: Sequence[str], start_unix_ns: int, end_unix_ns: int, step_ns: int
    ) -> Iterator[BucketStats]:
        """One SQL pass for every field and statistic (Store.bucket_stats asks query_history
        once per field and statistic: 120 queries a roll-up tier, each joining every series,
        which at 20,000 nodes x 8 GPUs kept a core busy), BUCKET_STATS_ROWS series x buckets a
        chunk: a bucket of 16,000 GPUs' statistics at once (16,000 dicts of 112 values) stepped
        the aggregator's memory up by 50-80 MiB at every roll-up pass, kept by the allocator
        (docs/benchmarks.md "Sustained ingest")."""
        if step_ns <= 0:
            raise StoreError(f"step must be positive, got {step_ns} ns")
        self._reader_catch_up(measurement)
        table = ident("m_" + measurement, "measurement")
        present = [f for f in fields if f in self._read_columns.get(measurement, ())]
        series = self._series_ids(measurement, None)
        if not series or not present:
            return
        columns = []
        for f in present:
            col = ident(f, "field")
            columns += [f"AVG(t.{col})", f"MAX(t.{col})", f"MIN(t.{col})", f"COUNT(t.{col})"]
        step = int(step_ns)
        sql = (
            f"SELECT t.series_id, t.ts / {step}, {', '.join(columns)} "
            f"FROM json_each(?) g JOIN {table} t ON t.series_id = g.value "
            "WHERE t.ts >= ? AND t.ts < ? GROUP BY 1, 2"
        )
        ids = sorted(series)
        per_chunk = max(1, BUCKET_STATS_ROWS // max(1, -(-(end_unix_ns - start_unix_ns) // step)))
        for first in range(0, len(ids), per_chunk):
            chunk = ids[first : first + per_chunk]
            with self._rlock:
                rows = self._r.execute(sql, (json.dumps(chunk), start_unix_ns, end_unix_ns)).fetchall()
            keys = {sid: tuple(sorted(series[sid].items())) for sid in chunk}
            merged: BucketStats = {}
            for row in rows:
                out: dict[str, float] = {}
                for i, f in enumerate(present):
                    mean, high, low, count = row[2 + 4 * i : 6 + 4 * i]
                    if count:  # a field with no value in the bucket has no statistics (as query_history)
                        out |= {
                            f"{f}_mean": float(mean),
                            f"{f}_max": float(high),
                            f"{f}_min": float(low),
                            f"{f}_count": count,
                        }
                if out:
                    merged[(keys[row[0]], row[1] * step)] = out
            if merged:
                yield merged

    def _rows_to_points(self, measurement: str, cursor: sqlite3.Cursor) -> list[Point]:
        names = [d[0] for d in cursor.description]
        with self._cache_lock:
            tags_of = {sid: tags for sid, (_, tags) in self._series_tags.items()}
        points = []
        for row in cursor.fetchall():
            fields = {n: v for n, v in zip(names[2:], row[2:], strict=True) if v is not None}
            points.append(Point(measurement, dict(tags_of[row[0]]), fields, row[1]))
        return points

    def query_points(
        self,
        measurement: str,
        start_unix_ns: int,
        end_unix_ns: int,
        filters: Mapping[str, Sequence[str]] | None = None,
    ) -> list[Point]:
        self._reader_catch_up(measurement)
        if measurement not in self._read_columns:
            return []
        series = self._series_ids(measurement, filters)
        table = ident("m_" + measurement, "measurement")
        with self._rlock:
            cursor = self._r.execute(
                f"SELECT * FROM {table} WHERE series_id IN (SELECT value FROM json_each(?)) "
                "AND ts >= ? AND ts < ? ORDER BY ts, series_id",
                (json.dumps(list(series)), start_unix_ns, end_unix_ns),
            )
            return self._rows_to_points(measurement, cursor)

    def sum_prorated(self, q: ProratedSum) -> list[ProratedRow]:
        """Store.sum_prorated, summed in SQL (one pass over the points in range, in C): a month
        of workload summaries (600,000 points) is summed in well under a second, where reading
        them all out as points took ten (docs/benchmarks.md "Workloads")."""
        self._reader_catch_up(q.measurement)
        present = self._read_columns.get(q.measurement)
        if present is None or q.start_field not in present or q.end_field not in present:
            return []
        table = ident("m_" + q.measurement, "measurement")
        begin, end = ident(q.start_field, "field"), ident(q.end_field, "field")
        inside = f"(MIN({end}, :until) - MAX({begin}, :since))"
        share = f"({inside} * 1.0 / ({end} - {begin}))"
        sums = ", ".join(
            f"SUM(COALESCE({ident(f, 'field')}, 0) * {share})" if f in present else "0.0"
            for f in q.sum_fields
        )
        groups = [ident(f, "field") if f in present else "''" for f in q.group_fields]
        select = ", ".join(["series_id", *groups, "COUNT(*)", sums])
        group_by = ", ".join(["series_id", *groups])
        with self._rlock:
            rows = self._r.execute(
                f"SELECT {select} FROM {table} WHERE ts >= :start AND ts < :stop AND {end} > {begin} "
                f"AND {inside} > 0 GROUP BY {group_by}",
                {"start": q.start_unix_ns, "stop": q.end_unix_ns, "since": q.since_s, "until": q.until_s},
            ).fetchall()
        with self._cache_lock:
            tags_of = {sid: tags for sid, (_, tags) in self._series_tags.items()}
        n = len(q.group_fields)
        return [
            ProratedRow(
                dict(tags_of.get(row[0], {})),
                tuple("" if v is None else str(v) for v in row[1 : 1 + n]),
                int(row[1 + n]),
                [float(v or 0.0) for v in row[2 + n :]],
            )
            for row in rows
        ]

    def latest(self, measurement: str) -> list[Point]:
        self._reader_catch_up(measurement)
        if measurement not in self._read_columns:
            return []
        table = ident("m_" + measurement, "measurement")
        with self._rlock:
            cursor = self._r.execute(
                f"SELECT t.* FROM {table} t JOIN (SELECT series_id, MAX(ts) AS ts FROM {table} "
                "GROUP BY series_id) l ON t.series_id = l.series_id AND t.ts = l.ts"
            )
            return self._rows_to_points(measurement, cursor)

    def _retention_s(self, measurement: str) -> float:
        for suffix, seconds in self.retention_by_suffix.items():
            if measurement.endswith(suffix):
                return seconds
        return self.retention_s

    def apply_retention(self, now_unix_ns: int) -> int:
        self.settle()  # an old point still staged is removed too
        deleted = self.settler.delete_older(
            lambda measurement: now_unix_ns - int(self._retention_s(measurement) * 1e9)
        )
        if deleted:
            log.info(
                "retention removed %d points (raw older than %.0f s, roll-ups by tier)",
                deleted,
                self.retention_s,
            )
        return deleted


def _nearest_rank(sorted_values: list[float], q: float) -> float:
    """The q-quantile by the nearest-rank method (values already sorted)."""
    rank = max(1, -(-len(sorted_values) * q // 1))  # ceil(n*q), at least 1
    return sorted_values[int(rank) - 1]
