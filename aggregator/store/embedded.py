"""The embedded store: SQLite in WAL mode, nothing to install or run.

Layout: a `series` table (one row per measurement + tag set) and one table per
measurement, `m_<measurement>`, keyed by (series_id, ts) WITHOUT ROWID, with a column per
field (added the first time a field is written). A point replayed overwrites itself and the
fields a point does not carry are left as they were (NULL if never written — never 0).

Writes append to a staging file beside it (aggregator/store/embedded_staging.py), rows in the
order written; `settle` copies the staged rows into the tables in key order, later rows' fields
over earlier ones, and then discards them there. Why (docs/benchmarks.md "Sustained ingest"):
every series takes a point a second, so a row written in place touches the page at the end of
that series' range; at 2,000 nodes x 8 GPUs the commits rewrote a page per GPU every second
(64 MiB of WAL a second). Appended, a commit writes the staging table's last pages; settled
every few seconds, a series' page is written once for all its points since, and as a file of
its own the staging file takes ingest's writes while a settle runs. Reads settle first, so
they see every acknowledged point; the aggregator settles every SETTLE_EVERY_S besides
(aggregator/loops.py). A settle is idempotent: a crash between its commit and the discard
settles the same rows again, to the same result.

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
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from gpufleet.aggregator.store.base import (
    Point,
    SharedTags,
    Store,
    StoreError,
    StoreUnavailable,
)
from gpufleet.aggregator.store.embedded_read import EmbeddedReads, ident, tables_on_disk
from gpufleet.aggregator.store.embedded_staging import (
    ROWS_PER_STATEMENT,
    WAL_CHECKPOINT_PAGES,
    Settler,
    Staging,
    ensure_columns,
    staged_path,
    transaction,
    write_failure,
)

log = logging.getLogger("gpufleet.aggregator.store")

_SHARED_MAX = 500_000
# Tags as stored (the series table's UNIQUE key): json.dumps(tags, ensure_ascii=False), with the
# encoder made once (json.dumps builds one per call when given options).
_TAGS_JSON = json.JSONEncoder(ensure_ascii=False)
WRITE_LOCK_WAIT_S = 30.0  # as long as SQLite's own busy timeout below


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
            # As the settle's connection (WAL_CHECKPOINT_PAGES): whichever commit to the store
            # crosses the size runs the checkpoint.
            self._w.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
            self._w.execute(
                "CREATE TABLE IF NOT EXISTS series (id INTEGER PRIMARY KEY, "
                "measurement TEXT NOT NULL, tags TEXT NOT NULL, UNIQUE (measurement, tags))"
            )
            self._r = sqlite3.connect(self.path, check_same_thread=False)
            self._staging = Staging(staged_path(self.path), synchronous)
            self.settler = Settler(self.path, self._staging.path, synchronous, self._discard)
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
        # Other processes may write the same file (ingest workers: aggregator/ingest/worker_pool.py): the
        # series they add and the columns they create are read in before each read or write.
        self._max_series_id = 0  # the newest series row looked at (cached or not)
        self._measurements_known: set[str] = set()  # whose series are all in the cache
        self._tag_pairs: dict[tuple[str, str], tuple[str, str]] = {}  # _shared_tags
        # The series rows (id, measurement, tags JSON; flat) the current write adds.
        self._new_series_rows: list[object] = []
        self._first_new_series_id = 1
        self._series_sql: dict[int, str] = {}
        # Columns per measurement: the writer's view (changed inside its transactions) and the
        # readers' (read from disk), each with the schema version it was read at.
        self._columns: dict[str, set[str]] = {}
        self._read_columns: dict[str, set[str]] = {}
        self._settle_failure_logged_at = float("-inf")
        self._schema_versions: dict[str, int] = {}
        self._catch_up(self._w, "_columns")

    def _catch_up(self, conn: sqlite3.Connection, columns_of: str) -> None:
        """Learn the series other processes added to the measurements this one has used since
        we last looked (ids only grow) and, when the schema version moved, the columns. Cheap
        when nothing changed: max(id) and one pragma."""
        with self._cache_lock:
            (top,) = conn.execute("SELECT coalesce(max(id), 0) FROM series").fetchone()
            if top > self._max_series_id:
                rows = conn.execute(
                    "SELECT id, measurement, tags FROM series WHERE id > ? AND id <= ? "
                    "AND measurement IN (SELECT value FROM json_each(?)) ORDER BY id",
                    (self._max_series_id, top, json.dumps(sorted(self._measurements_known))),
                ).fetchall()
                self._cache_series(rows)
                self._max_series_id = top
        (version,) = conn.execute("PRAGMA schema_version").fetchone()
        if version != self._schema_versions.get(columns_of):
            setattr(self, columns_of, tables_on_disk(conn, "m"))
            self._schema_versions[columns_of] = version

    def _know(self, conn: sqlite3.Connection, measurement: str) -> None:
        """Read in a measurement's series the first time this process uses it (after a
        _catch_up, on that connection, under its lock): the cache holds only the measurements a
        process writes or reads, so an ingest worker does not keep the roll-ups' series (16,000
        a tier at 2,000 nodes x 8 GPUs, ~30 MiB a worker)."""
        with self._cache_lock:
            if measurement in self._measurements_known:
                return
            rows = conn.execute(
                "SELECT id, measurement, tags FROM series WHERE measurement = ? AND id <= ?",
                (measurement, self._max_series_id),
            ).fetchall()
            self._cache_series(rows)
            self._measurements_known.add(measurement)

    def _shared_tags(self, items: Iterable[Sequence[str]]) -> tuple[tuple[str, str], ...]:
        """Tag (name, value) pairs as the cache keeps them: one tuple and one string each for
        all the series that carry a tag (a node's GPUs, a GPU's raw series and its roll-ups'),
        not one each from every JSON decode or point: at 2,000 nodes x 8 GPUs, 40 MiB for 32,000
        series before, 20 after."""
        intern, kept = sys.intern, self._tag_pairs
        return tuple(kept.setdefault(p, p) for p in ((intern(k), intern(v)) for k, v in items))

    def _cache_series(self, rows: list[tuple[int, str, str]]) -> None:
        for sid, measurement, tags in rows:
            items = self._shared_tags(json.loads(tags))
            self._series.setdefault((measurement, items), sid)
            self._series_tags[sid] = (measurement, dict(items))

    def _reader_catch_up(self, measurement: str) -> None:
        """Before a read of a measurement: the staged rows settled (so it sees every
        acknowledged point), then the series and columns other processes added."""
        try:
            self.settle()
        except StoreError as exc:
            # The disk is full or another writer holds the lock: the read goes on without the
            # last seconds' points (kept staged, settled by the next read or pass that can).
            now = time.monotonic()
            if now - self._settle_failure_logged_at >= 60.0:
                self._settle_failure_logged_at = now
                log.warning(
                    "a read could not settle the embedded store's recent points (%s): it answers "
                    "without them; they stay staged and are settled by the next read that can "
                    "(said once a minute)",
                    exc,
                )
        with self._rlock:
            self._catch_up(self._r, "_read_columns")
            self._know(self._r, measurement)

    # --- writing -------------------------------------------------------------------
    def _ensure_columns(self, measurement: str, fields: Sequence[str]) -> None:
        table = ident("m_" + measurement, "measurement")
        create = (
            f"CREATE TABLE IF NOT EXISTS {table} (series_id INTEGER NOT NULL, "
            "ts INTEGER NOT NULL, PRIMARY KEY (series_id, ts)) WITHOUT ROWID"
        )
        ensure_columns(self._w, table, create, self._columns, measurement, fields)

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
        if p.measurement not in self._measurements_known:
            self._know(self._w, p.measurement)
        as_given = (p.measurement, tuple(p.tags.items()))
        sid = self._series.get(as_given)
        if sid is not None:
            return sid
        as_given = (p.measurement, self._shared_tags(as_given[1]))
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
            rows = min(ROWS_PER_STATEMENT, (len(flat) - start) // 3)
            rows = rows if rows == ROWS_PER_STATEMENT else 1 << (rows.bit_length() - 1)
            sql = self._series_sql.get(rows)
            if sql is None:
                values = ", ".join(["(?, ?, ?)"] * rows)
                sql = self._series_sql[rows] = f"INSERT INTO series (id, measurement, tags) VALUES {values}"
            self._w.execute(sql, flat[start : start + rows * 3])
            start += rows * 3

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
        """New series and columns into the store (a transaction there only when there are
        any), then the rows appended to the staging file: durable when this returns."""
        if not points:
            return
        with self._writing():
            new_series: list[tuple[str, tuple[tuple[str, str], ...]]] = []
            try:
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
                if self._new_series_rows or any(
                    m not in self._columns or not self._columns[m].issuperset(names) for m, names in groups
                ):
                    self._add_series_and_columns(groups)
            except Exception as exc:  # the store's transaction, if any, was rolled back
                for key in new_series:
                    self._series.pop(key, None)
                self._shared.clear()  # may name a series that was rolled back
                self._forget_schema()
                raise write_failure(exc, f"embedded store write of {len(points)} points") from exc
            with self._cache_lock:
                for key in new_series:
                    self._series_tags[self._series[key]] = (key[0], dict(key[1]))
            try:
                self._staging.append(groups)
            except Exception as exc:
                raise write_failure(exc, f"embedded store write of {len(points)} points") from exc

    def _add_series_and_columns(self, groups: dict[tuple[str, tuple[str, ...]], list[object]]) -> None:
        """The series rows _series_id allotted and the tables and columns the groups need,
        committed in the store before their rows are staged (a settle finds them there)."""
        with transaction(self._w, "BEGIN IMMEDIATE"):
            self._insert_new_series()
            for measurement, names in groups:
                self._ensure_columns(measurement, names)
        if self._new_series_rows:
            last_id = self._first_new_series_id + len(self._new_series_rows) // 3 - 1
            with self._cache_lock:
                self._max_series_id = max(self._max_series_id, last_id)

    def _forget_schema(self) -> None:
        """After a rollback: tables and columns added inside it are gone again."""
        self._schema_versions.pop("_columns", None)
        with contextlib.suppress(sqlite3.Error):
            self._columns = tables_on_disk(self._w, "m")

    # --- settling the staged rows (aggregator/store/embedded_staging.py) ---------------
    def settle(self) -> int:
        return self.settler.settle()

    def _discard(self, tops: Mapping[str, int]) -> None:
        """Remove the staged rows a settle copied, taking turns with the writers."""
        with self._writing():
            try:
                self._staging.discard(tops)
            except Exception as exc:  # copied, still staged: the next settle copies them again
                raise write_failure(exc, "discarding the embedded store's settled points") from exc

    # --- reading -------------------------------------------------------------------
    def close(self) -> None:
        self.settler.close()
        with self._wlock, self._rlock:
            self._r.close()
            self._w.close()
            self._staging.close()
            os.close(self._lockfile)
