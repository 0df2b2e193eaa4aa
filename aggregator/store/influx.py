"""The InfluxDB store: line protocol to /write, InfluxQL on /query — the v1 endpoints that
InfluxDB 1.x serves natively and 2.x and 3.x serve as their v1-compatibility API (with a
token). Buckets/databases and retention policies are the operator's; gpufleet creates the
database only on 1.x when it may.

We use http.client with one kept-alive connection per thread rather than influxdb-client:
that client targets the 2.x API (it cannot write to 1.6), and batching whole group commits
into one request is all the speed the aggregator needs.

Errors are told apart (the writer and the spool act on the difference):
- a partial write (e.g. a field type conflict) and other 4xx answers to a write: the points
  are refused (PointsRefused): the writer finds the report(s) holding them and refuses those,
  rewriting the rest (InfluxDB kept them; a rewrite overwrites). The dropped points are counted;
- 401/403: the credentials are wrong — StoreUnavailable saying so, not retryable blindly;
- 429/503, other 5xx and connection failures: StoreUnavailable marked retryable, with
  Retry-After if given.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import re
import threading
import urllib.parse
from collections.abc import Mapping, Sequence

from gpufleet.aggregator.store.base import (
    HistoryQuery,
    Point,
    PointsRefused,
    Series,
    Store,
    StoreError,
    StoreUnavailable,
)
from gpufleet.aggregator.store.lineproto import LineEncoder, influxql_identifier, influxql_string
from gpufleet.common.redact import redact

log = logging.getLogger("gpufleet.aggregator.influx")

_AGG = {
    "mean": "MEAN({f})",
    "max": "MAX({f})",
    "min": "MIN({f})",
    "p95": "PERCENTILE({f}, 95)",
    "last": "LAST({f})",
    "count": "COUNT({f})",
}
_DROPPED = re.compile(r"dropped=(\d+)")


class InfluxError(StoreError):
    def __init__(self, message: str, retryable: bool = False, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after_s = retry_after_s


class InfluxUnavailable(InfluxError, StoreUnavailable):
    """InfluxDB cannot be written now: unreachable, overloaded, failing, or refusing our credentials."""


class InfluxRefused(InfluxError, PointsRefused):
    """InfluxDB answered a write with a 4xx other than 401/403/429: the body was refused."""


class InfluxStore(Store):
    def __init__(
        self,
        url: str,
        database: str,
        retention_policy: str = "",
        token: str = "",
        username: str = "",
        password: str = "",
        timeout_s: float = 30.0,
        create_database: bool = True,
        rollup_policies: dict[str, tuple[str, float]] | None = None,
    ) -> None:
        """rollup_policies: measurement suffix ("_1h") -> (retention policy, duration in s).
        Roll-up tiers then live in retention policies of their own: their own retention, and
        long shards, so a 30-day query of a tier touches one or two shards, not five."""
        parts = urllib.parse.urlparse(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise StoreError(f"influx_url {redact(url)!r} is not an http(s) URL")
        # What logs, errors and GetStatus show: never the password or a query string.
        self.url = redact(url)
        if parts.username and not (token or username):  # http://user:password@host:8086
            username = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
        self.database = database
        self.retention_policy = retention_policy
        self._parts = parts
        self._timeout_s = timeout_s
        self._headers = {}
        if token:
            self._headers["Authorization"] = f"Token {token}"
        elif username:
            raw = base64.b64encode(f"{username}:{password}".encode()).decode()
            self._headers["Authorization"] = f"Basic {raw}"
        self._local = threading.local()
        self._encoder = LineEncoder()
        self._points_dropped_total = 0
        self._rollup_rp = {suffix: rp for suffix, (rp, _) in (rollup_policies or {}).items()}
        if create_database:
            try:
                self._query(f"CREATE DATABASE {influxql_identifier(database)}", method="POST")
            except InfluxError as exc:
                # 2.x/3.x have buckets instead, and a non-admin user may not create: carry on.
                log.info("not creating database %s: %s", database, exc)
            for rp, seconds in (rollup_policies or {}).values():
                shard_s = max(86400, min(int(seconds) // 20, 90 * 86400))
                try:
                    self._query(
                        f"CREATE RETENTION POLICY {influxql_identifier(rp)} ON "
                        f"{influxql_identifier(database)} DURATION {int(seconds)}s REPLICATION 1 "
                        f"SHARD DURATION {shard_s}s",
                        method="POST",
                    )
                except InfluxError as exc:  # exists with other settings, or not allowed: the operator's
                    log.info("not creating retention policy %s: %s", rp, exc)

    # --- HTTP ------------------------------------------------------------------------
    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self._parts.scheme == "https" else http.client.HTTPConnection
            conn = cls(self._parts.hostname, self._parts.port, timeout=self._timeout_s)
            self._local.conn = conn
        return conn

    def _request(self, method: str, path: str, params: dict[str, str], body: bytes | None = None) -> bytes:
        target = f"{self._parts.path.rstrip('/')}{path}?{urllib.parse.urlencode(params)}"
        headers = dict(self._headers)
        if body is not None:
            headers["Content-Type"] = "text/plain; charset=utf-8"
        for attempt in (1, 2):  # a kept-alive connection the server closed: reconnect once
            conn = self._connection()
            try:
                conn.request(method, target, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
                break
            except (ConnectionError, http.client.HTTPException, OSError) as exc:
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise InfluxUnavailable(
                        f"cannot reach InfluxDB at {self.url}: {exc}", retryable=True
                    ) from exc
        status = response.status
        if status in (200, 204):
            return data
        text = data.decode(errors="replace")[:500]
        if status in (401, 403):
            raise InfluxUnavailable(
                f"InfluxDB at {self.url} refused the credentials (HTTP {status}): {text}. "
                "Check influx_token or influx_username/influx_password."
            )
        if status in (429, 503):
            retry_after = response.getheader("Retry-After")
            raise InfluxUnavailable(
                f"InfluxDB at {self.url} is overloaded or unavailable (HTTP {status}): {text}",
                retryable=True,
                retry_after_s=float(retry_after) if retry_after else None,
            )
        if status == 400 and "partial write" in text:
            raise _PartialWrite(text)
        message = f"InfluxDB at {self.url} answered HTTP {status}: {text}"
        if status >= 500:
            raise InfluxUnavailable(message, retryable=True)
        if path == "/write":
            raise InfluxRefused(message)
        raise InfluxError(message)

    def _query(self, statement: str, method: str = "GET") -> list[dict]:
        params = {"q": statement, "db": self.database, "epoch": "ns"}
        if self.retention_policy:
            params["rp"] = self.retention_policy
        body = json.loads(self._request(method, "/query", params) or b"{}")
        results = body.get("results", [])
        for result in results:
            if "error" in result:
                raise InfluxError(f"InfluxDB could not run {statement[:200]!r}: {result['error']}")
        return results

    # --- writing ---------------------------------------------------------------------
    def _rp(self, measurement: str) -> str:
        for suffix, rp in self._rollup_rp.items():
            if measurement.endswith(suffix):
                return rp
        return self.retention_policy

    def write(self, points: Sequence[Point]) -> None:
        if not points:
            return
        by_rp: dict[str, list[Point]] = {}
        for p in points:
            by_rp.setdefault(self._rp(p.measurement), []).append(p)
        for rp, group in by_rp.items():
            self._write(group, rp)

    def _write(self, points: list[Point], rp: str) -> None:
        encode = self._encoder.line
        try:
            body = "\n".join(encode(p) for p in points).encode()
        except (ValueError, TypeError, UnicodeError) as exc:  # a value line protocol cannot carry
            raise InfluxRefused(f"cannot encode {len(points)} points as line protocol: {exc}") from exc
        params = {"db": self.database, "precision": "ns"}
        if rp:
            params["rp"] = rp
        try:
            self._request("POST", "/write", params, body)
        except _PartialWrite as partial:
            # InfluxDB wrote the rest of the batch and dropped the conflicting points: refused,
            # so the writer finds the report(s) holding them and acknowledges only the rest.
            match = _DROPPED.search(str(partial))
            dropped = int(match.group(1)) if match else 1
            self._points_dropped_total += dropped
            raise

    @property
    def points_dropped_total(self) -> int:
        """Points InfluxDB dropped from partial writes (their reports were refused, not acked)."""
        return self._points_dropped_total

    # --- reading ---------------------------------------------------------------------
    def _from(self, measurement: str) -> str:
        m = influxql_identifier(measurement)
        rp = self._rp(measurement)
        return f"{influxql_identifier(rp)}.{m}" if rp else m

    @staticmethod
    def _where(start: int, end: int, filters: Mapping[str, Sequence[str]] | None) -> str:
        clauses = [f"time >= {int(start)}", f"time < {int(end)}"]
        for tag, values in (filters or {}).items():
            if values:
                ors = " OR ".join(f"{influxql_identifier(tag)} = {influxql_string(v)}" for v in values)
                clauses.append(f"({ors})")
        return " AND ".join(clauses)

    def query_history(self, query: HistoryQuery) -> list[Series]:
        if query.step_ns <= 0:
            raise StoreError(f"step must be positive, got {query.step_ns} ns")
        if query.aggregate not in _AGG:
            raise StoreError(f"unknown aggregate {query.aggregate!r}")
        where = self._where(query.start_unix_ns, query.end_unix_ns, query.filters)
        by = "".join(f", {influxql_identifier(t)}" for t in query.group_by) if query.group_by else ", *"
        if query.as_stored and not query.group_by and query.aggregate in ("mean", "max", "min"):
            # One point per bucket already (a roll-up at its own step): read the column as it is;
            # InfluxDB's GROUP BY time over it costs about as much as the read again.
            statement = (
                f"SELECT {influxql_identifier(query.field)} FROM {self._from(query.measurement)} "
                f"WHERE {where} GROUP BY *"
            )
        else:
            select = _AGG[query.aggregate].format(f=influxql_identifier(query.field))
            statement = (
                f"SELECT {select} FROM {self._from(query.measurement)} "
                f"WHERE {where} GROUP BY time({int(query.step_ns)}ns){by} fill(none)"
            )
        out = []
        for result in self._query(statement):
            for s in result.get("series", []):
                rows = [(t, v) for t, v in s["values"] if v is not None]
                if rows:
                    tags = dict(s.get("tags", {}))
                    if query.group_by:  # as the embedded store: a tag a series lacks groups as ""
                        tags = {t: tags.get(t, "") for t in query.group_by}
                    out.append(Series(tags, [int(t) for t, _ in rows], [float(v) for _, v in rows]))
        return sorted(out, key=lambda s: sorted(s.tags.items()))

    def _points(self, measurement: str, statement: str) -> list[Point]:
        points = []
        for result in self._query(statement):
            for s in result.get("series", []):
                tags = dict(s.get("tags", {}))
                columns = s["columns"]
                for row in s["values"]:
                    fields = {c: v for c, v in zip(columns[1:], row[1:], strict=True) if v is not None}
                    points.append(Point(measurement, tags, fields, int(row[0])))
        return points

    def query_points(
        self,
        measurement: str,
        start_unix_ns: int,
        end_unix_ns: int,
        filters: Mapping[str, Sequence[str]] | None = None,
    ) -> list[Point]:
        statement = (
            f"SELECT * FROM {self._from(measurement)} "
            f"WHERE {self._where(start_unix_ns, end_unix_ns, filters)} GROUP BY *"
        )
        return sorted(self._points(measurement, statement), key=lambda p: p.time_unix_ns)

    def latest(self, measurement: str) -> list[Point]:
        statement = f"SELECT * FROM {self._from(measurement)} GROUP BY * ORDER BY time DESC LIMIT 1"
        return self._points(measurement, statement)

    def apply_retention(self, now_unix_ns: int) -> int | None:
        """InfluxDB keeps its own retention (retention policies, bucket retention): nothing to
        delete here; the storage issue's downsampling sets those policies."""
        return None

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()


class _PartialWrite(InfluxRefused):
    pass
