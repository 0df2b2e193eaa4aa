"""The embedded store: SQLite in WAL mode, nothing to install or run.

Layout: a `series` table (one row per measurement + tag set) and one table per
measurement, `m_<measurement>`, keyed by (series_id, ts) WITHOUT ROWID, with a column per
field (added the first time a field is written). Writes upsert only the fields a point
carries, so a replayed point overwrites itself and absent fields stay NULL — never 0.

We use the standard library's sqlite3 rather than a time-series engine so a single-box
install and the demo need no server and no extra native dependency.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path

from gpufleet.aggregator.store.base import (
    Point,
    PointsRefused,
    SharedTags,
    Store,
    StoreError,
    StoreUnavailable,
)
from gpufleet.aggregator.store.embedded_read import EmbeddedReads, ident

log = logging.getLogger("gpufleet.aggregator.store")

_SHARED_MAX = 500_000
# Tags as stored (the series table's UNIQUE key): json.dumps(tags, ensure_ascii=False), with the
# encoder made once (json.dumps builds one per call when given options).
_TAGS_JSON = json.JSONEncoder(ensure_ascii=False)
_WAL_CHECKPOINT_PAGES = 16_384  # x 4 KiB pages
# Host parameters per statement: SQLite's default limit (SQLITE_MAX_VARIABLE_NUMBER) since 3.32;
# builds may raise it, none lowers it. Rows per statement: enough to make the GIL round trips
# per batch few, few enough that the statement cache holds every size in use.
_MAX_VARIABLES = 32_766
_ROWS_PER_STATEMENT = 2_000
WRITE_LOCK_WAIT_S = 30.0  # as long as SQLite's own busy timeout below
# SQLite result codes (primary, the low byte) that say the database or its disk cannot take a
# write now; anything else a write raises is about the points themselves.
_UNAVAILABLE_CODES = {
    sqlite3.SQLITE_FULL,
    sqlite3.SQLITE_IOERR,
    sqlite3.SQLITE_BUSY,
    sqlite3.SQLITE_LOCKED,
    sqlite3.SQLITE_CANTOPEN,
    sqlite3.SQLITE_READONLY,
    sqlite3.SQLITE_NOMEM,
    sqlite3.SQLITE_PROTOCOL,
    sqlite3.SQLITE_NOTADB,
    sqlite3.SQLITE_CORRUPT,
}


def _write_failure(exc: BaseException, what: str) -> StoreError:
    """StoreUnavailable for a disk or database failure, PointsRefused for anything else (an
    integer SQLite cannot hold raises OverflowError, not an sqlite3.Error)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(exc, OSError) or (code is not None and code & 0xFF in _UNAVAILABLE_CODES):
        return StoreUnavailable(f"{what} failed: the database or its disk cannot take writes ({exc})")
    return PointsRefused(f"{what} failed: {type(exc).__name__}: {exc}")


class EmbeddedStore(EmbeddedReads, Store):
    def __init__(
        self,
        path: str | Path,
        retention_s: float,
        synchronous: str = "FULL",
        retention_by_suffix: dict[str, float] | None = None,
    ) -> None:
        self.path = Path(path)
        self.retention_s = retention_s
        # Measurements ending in a suffix (roll-up tiers: "_1m", "_1h") keep their own retention.
        self.retention_by_suffix = retention_by_suffix or {}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # timeout: how long a write waits for another writer process's transaction (ingest
            # workers, the main process's roll-ups and retention) before it counts as
            # unavailable (then the batch is spooled).
            self._w = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30.0)
            self._w.execute("PRAGMA journal_mode=WAL")
            # FULL: a commit is on disk (fsync) before write() returns, so an acknowledged
            # report survives a power cut, not just a process crash.
            self._w.execute(f"PRAGMA synchronous={synchronous}")
            # Checkpoint the WAL every 64 MiB instead of SQLite's 4 MiB: every second's reports
            # touch a page per series, and a page written to the WAL several times between two
            # checkpoints is copied into the database once. Measured: half the commit time at
            # 2,000 nodes x 8 GPUs (the WAL file grows to about this size between checkpoints).
            self._w.execute(f"PRAGMA wal_autocheckpoint={_WAL_CHECKPOINT_PAGES}")
            self._w.execute(
                "CREATE TABLE IF NOT EXISTS series (id INTEGER PRIMARY KEY, "
                "measurement TEXT NOT NULL, tags TEXT NOT NULL, UNIQUE (measurement, tags))"
            )
            self._r = sqlite3.connect(self.path, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the embedded store at {self.path}: {exc}") from exc
        self._wlock = threading.Lock()
        # Writers in other processes (ingest workers, the main process's roll-ups) take turns
        # through a lock file, so one waiting for another's commit starts the moment it ends.
        # SQLite's own busy handler sleeps 1, 2, 5, 10 ... 100 ms between tries: measured, the
        # two workers' commits then waited tens of milliseconds for each other at 2,000 nodes.
        self._lockfile = os.open(str(self.path) + ".writelock", os.O_RDWR | os.O_CREAT, 0o600)
        self._rlock = threading.Lock()
        self._cache_lock = threading.Lock()
        # (measurement, sorted tag items) -> series id. A tuple key, not the stored JSON, so
        # the write path never serialises tags for a series it already knows.
        self._series: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
        self._series_tags: dict[int, tuple[str, dict[str, str]]] = {}
        # id(SharedTags) -> (the tags, measurement, series id): a known series' points cost one
        # lookup, not a tuple of their tags (the write path runs for every GPU sample).
        self._shared: dict[int, tuple[SharedTags, str, int]] = {}
        self._sql: dict[tuple[str, tuple[str, ...], int], str] = {}
        # Other processes may write the same file (ingest workers: aggregator/ingest/worker_pool.py): the
        # series they add and the columns they create are read in before each read or write.
        self._max_series_id = 0
        # The series rows (id, measurement, tags JSON; flat) the current write adds.
        self._new_series_rows: list[object] = []
        self._first_new_series_id = 1
        self._series_sql: dict[int, str] = {}
        # Columns per measurement: the writer's view (changed inside its transactions) and the
        # readers' (read from disk), each with the schema version it was read at.
        self._columns: dict[str, set[str]] = {}
        self._read_columns: dict[str, set[str]] = {}
        self._schema_versions: dict[str, int] = {}
        self._catch_up(self._w, "_columns")

    def _catch_up(self, conn: sqlite3.Connection, columns_of: str) -> None:
        """Learn the series and columns other processes added since we last looked: new series
        rows (ids only grow) and, when the schema version moved, the columns. Cheap when
        nothing changed: one indexed query and one pragma."""
        rows = conn.execute(
            "SELECT id, measurement, tags FROM series WHERE id > ? ORDER BY id", (self._max_series_id,)
        ).fetchall()
        if rows:
            with self._cache_lock:
                for sid, measurement, tags in rows:
                    items = tuple(tuple(pair) for pair in json.loads(tags))
                    self._series.setdefault((measurement, items), sid)
                    self._series_tags[sid] = (measurement, dict(items))
                self._max_series_id = max(self._max_series_id, rows[-1][0])
        (version,) = conn.execute("PRAGMA schema_version").fetchone()
        if version != self._schema_versions.get(columns_of):
            setattr(self, columns_of, self._columns_on_disk(conn))
            self._schema_versions[columns_of] = version

    def _reader_catch_up(self) -> None:
        with self._rlock:
            self._catch_up(self._r, "_read_columns")

    @staticmethod
    def _columns_on_disk(conn: sqlite3.Connection) -> dict[str, set[str]]:
        """Which measurement tables and field columns exist on disk."""
        columns: dict[str, set[str]] = {}
        for (table,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name LIKE 'm\\_%' ESCAPE '\\'"
        ).fetchall():
            cols = {row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')}
            columns[table[2:]] = cols - {"series_id", "ts"}
        return columns

    # --- writing -------------------------------------------------------------------
    def _ensure_columns(self, measurement: str, fields: Sequence[str]) -> None:
        table = ident("m_" + measurement, "measurement")
        cols = self._columns.get(measurement)
        if cols is None:
            self._w.execute(
                f"CREATE TABLE IF NOT EXISTS {table} (series_id INTEGER NOT NULL, "
                "ts INTEGER NOT NULL, PRIMARY KEY (series_id, ts)) WITHOUT ROWID"
            )
            cols = self._columns[measurement] = set()
        for name in fields:
            if name not in cols:
                # No declared type: SQLite keeps each value as given (int stays int).
                self._w.execute(f"ALTER TABLE {table} ADD COLUMN {ident(name, 'field')}")
                cols.add(name)

    def _series_id(self, p: Point, new_series: list[tuple[str, tuple[tuple[str, str], ...]]]) -> int:
        """The series id of a point's measurement + tags, allotting a new id if the series is new.
        Called inside the write transaction, after _catch_up under the file lock: the cache
        then holds every series on disk (series are never deleted, ids only grow), so a key
        not in it is new and no other writer can add it before our commit. New series rows
        are kept in _new_series_rows and inserted by _insert_new_series, many per statement
        (one INSERT per series was a sixth of an aggregator's CPU while 20,000 nodes joined);
        keys it adds are listed in new_series."""
        # Look up by the tags in the order given first: a writer that always builds its tags
        # the same way (ours does) never pays for a sort after a series' first point.
        shared = self._shared.get(id(p.tags)) if type(p.tags) is SharedTags else None
        if shared is not None and shared[0] is p.tags and shared[1] == p.measurement:
            return shared[2]
        as_given = (p.measurement, tuple(p.tags.items()))
        sid = self._series.get(as_given)
        if sid is not None:
            return sid
        key = (p.measurement, tuple(sorted(as_given[1])))
        sid = self._series.get(key)
        if sid is None:
            sid = self._first_new_series_id + len(self._new_series_rows) // 3
            self._new_series_rows.extend((sid, p.measurement, _TAGS_JSON.encode(key[1])))
            self._series[key] = sid
            new_series.append(key)
        self._series[as_given] = sid
        new_series.append(as_given)
        if type(p.tags) is SharedTags:
            # Kept with the object itself, so its id cannot be reused while the entry lives.
            if len(self._shared) >= _SHARED_MAX:
                self._shared.clear()
            self._shared[id(p.tags)] = (p.tags, p.measurement, sid)
        return sid

    def _insert_new_series(self) -> None:
        """Insert the series rows _series_id allotted, up to ROWS_PER_STATEMENT per statement
        (not executemany: see _insert). A conflict means the cache was wrong: the write fails
        and is rolled back whole, never storing a point under another series' id."""
        flat, start = self._new_series_rows, 0
        while start < len(flat):
            rows = min(_ROWS_PER_STATEMENT, (len(flat) - start) // 3)
            rows = rows if rows == _ROWS_PER_STATEMENT else 1 << (rows.bit_length() - 1)
            sql = self._series_sql.get(rows)
            if sql is None:
                values = ", ".join(["(?, ?, ?)"] * rows)
                sql = self._series_sql[rows] = f"INSERT INTO series (id, measurement, tags) VALUES {values}"
            self._w.execute(sql, flat[start : start + rows * 3])
            start += rows * 3

    def _upsert_sql(self, measurement: str, names: tuple[str, ...], rows: int) -> str:
        key = (measurement, names, rows)
        sql = self._sql.get(key)
        if sql is None:
            cols = ", ".join(ident(n, "field") for n in names)
            marks = "(" + ", ".join("?" * (len(names) + 2)) + ")"
            update = ", ".join(f"{ident(n, 'field')}=excluded.{ident(n, 'field')}" for n in names)
            sql = (
                f'INSERT INTO "m_{measurement}" (series_id, ts{", " if names else ""}{cols}) '
                f"VALUES {', '.join([marks] * rows)} ON CONFLICT (series_id, ts) DO "
                + (f"UPDATE SET {update}" if names else "NOTHING")
            )
            if len(self._sql) >= 1024:
                self._sql.clear()
            self._sql[key] = sql
        return sql

    def _insert(self, measurement: str, names: tuple[str, ...], flat: list[object]) -> None:
        """Upsert the rows in flat (series id, ts, then the named fields; row after row), up
        to ROWS_PER_STATEMENT rows per statement. Not executemany: the sqlite3 module releases
        the GIL around every row's step and takes it back for the next row, so a batch of
        50,000 rows written while the event loop is busy waits for the GIL 50,000 times (we
        measured a 0.4 s batch taking 6.7 s); one statement per few thousand rows waits a few
        times. Rows of one statement are upserted in order, as executemany would."""
        width = len(names) + 2
        per = max(1, min(_ROWS_PER_STATEMENT, _MAX_VARIABLES // width))
        left, start = len(flat) // width, 0
        while left:
            # Full statements, then the rest in power-of-two sizes: few distinct statements
            # to prepare, each prepared once and kept.
            rows = per if left >= per else 1 << (left.bit_length() - 1)
            end = start + rows * width
            self._w.execute(self._upsert_sql(measurement, names, rows), flat[start:end])
            start, left = end, left - rows

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """This process's write lock, then the lock file's (every writer process's): waited
        for at most WRITE_LOCK_WAIT_S, then the write counts as unavailable (and is spooled)."""
        with self._wlock:
            deadline = time.monotonic() + WRITE_LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(self._lockfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise StoreUnavailable(
                            f"another process has held the embedded store's write lock "
                            f"({self.path}.writelock) for over {WRITE_LOCK_WAIT_S:g} s"
                        ) from None
                    time.sleep(0.001)  # another process commits: its commit takes milliseconds
            try:
                yield
            finally:
                fcntl.flock(self._lockfile, fcntl.LOCK_UN)

    def write(self, points: Sequence[Point]) -> None:
        if not points:
            return
        with self._writing():
            new_series: list[tuple[str, tuple[tuple[str, str], ...]]] = []
            try:
                if self._w.in_transaction:  # left open by a failure we could not roll back
                    self._w.execute("ROLLBACK")
                self._w.execute("BEGIN IMMEDIATE")
                self._catch_up(self._w, "_columns")
                self._new_series_rows.clear()
                self._first_new_series_id = self._max_series_id + 1
                # Each group's parameters flat, in point order: many rows go into one statement.
                groups: dict[tuple[str, tuple[str, ...]], list[object]] = defaultdict(list)
                for p in points:
                    sid = self._series_id(p, new_series)
                    flat = groups[(p.measurement, tuple(p.fields))]
                    flat.append(sid)
                    flat.append(p.time_unix_ns)
                    flat.extend(p.fields.values())
                self._insert_new_series()
                for (measurement, names), flat in groups.items():
                    self._ensure_columns(measurement, names)
                    self._insert(measurement, names, flat)
                self._w.execute("COMMIT")
                if self._new_series_rows:
                    last_id = self._first_new_series_id + len(self._new_series_rows) // 3 - 1
                    with self._cache_lock:
                        self._max_series_id = max(self._max_series_id, last_id)
            except Exception as exc:  # every failure leaves the connection out of its transaction
                with contextlib.suppress(sqlite3.Error):
                    if self._w.in_transaction:
                        self._w.execute("ROLLBACK")
                for key in new_series:
                    self._series.pop(key, None)
                self._shared.clear()  # may name a series that was rolled back
                # Columns added inside a rolled-back transaction are gone again.
                self._schema_versions.pop("_columns", None)
                with contextlib.suppress(sqlite3.Error):
                    self._columns = self._columns_on_disk(self._w)
                raise _write_failure(exc, f"embedded store write of {len(points)} points") from exc
            with self._cache_lock:
                for key in new_series:
                    self._series_tags[self._series[key]] = (key[0], dict(key[1]))

    # --- reading -------------------------------------------------------------------
    def close(self) -> None:
        with self._wlock, self._rlock:
            self._r.close()
            self._w.close()
            os.close(self._lockfile)
