"""The embedded store's staging file (aggregator/store/embedded.py): where writes land, and
the settle that copies them into the store's tables (docs/architecture.md "Staged writes in
the embedded store").

One table per measurement, `r_<measurement>`, in a SQLite file of its own beside the store
(`store.staged.sqlite3`), rows in the order written (rowid), the same field columns as the
store's table. A write appends: its commit writes the staging table's last pages, whatever
series the rows belong to. The store's `settle` copies the staged rows into its tables in key
order and then discards them here (`discard`). A file of its own so that ingest never waits
for a settle: SQLite has one writer per file, and a settle rewrites a page per series.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from gpufleet.aggregator.store.base import PointsRefused, StoreError, StoreUnavailable
from gpufleet.aggregator.store.embedded_read import ident, tables_on_disk

# Host parameters per statement: SQLite's default limit (SQLITE_MAX_VARIABLE_NUMBER) since 3.32;
# builds may raise it, none lowers it. Rows per statement: enough to make the GIL round trips
# per batch few, few enough that the statement cache holds every size in use.
_MAX_VARIABLES = 32_766
ROWS_PER_STATEMENT = 2_000

Groups = Mapping[tuple[str, tuple[str, ...]], list[object]]
# Checkpoint the store's WAL every 64 MiB instead of SQLite's 4 MiB: a settle writes a page per
# series, and a page written to the WAL several times between two checkpoints is copied into
# the database once.
WAL_CHECKPOINT_PAGES = 16_384  # x 4 KiB pages

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


def write_failure(exc: BaseException, what: str) -> StoreError:
    """StoreUnavailable for a disk or database failure, PointsRefused for anything else (an
    integer SQLite cannot hold raises OverflowError, not an sqlite3.Error)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(exc, OSError) or (code is not None and code & 0xFF in _UNAVAILABLE_CODES):
        return StoreUnavailable(f"{what} failed: the database or its disk cannot take writes ({exc})")
    return PointsRefused(f"{what} failed: {type(exc).__name__}: {exc}")


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection, begin: str = "BEGIN") -> Iterator[None]:
    """One transaction on conn: committed when the block ends, rolled back when it raises (the
    connection is always left out of a transaction; one a failure left open is rolled back
    first)."""
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        conn.execute(begin)
        yield
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        raise


def staged_path(store_path: Path) -> Path:
    """store.sqlite3 -> store.staged.sqlite3 (beside it, in the same data directory)."""
    return store_path.with_name(f"{store_path.stem}.staged{store_path.suffix}")


def ensure_columns(
    conn: sqlite3.Connection,
    table: str,
    create: str,
    known: dict[str, set[str]],
    measurement: str,
    names: Sequence[str],
) -> None:
    """The measurement's table (made by `create` when `known` has no columns for it) with a
    column per name; `known` is kept as the columns on disk."""
    cols = known.get(measurement)
    if cols is None:
        conn.execute(create)
        cols = known[measurement] = set()
    for name in names:
        if name not in cols:
            # No declared type: SQLite keeps each value as given (int stays int).
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {ident(name, 'field')}")
            cols.add(name)


class Staging:
    def __init__(self, path: Path, synchronous: str) -> None:
        self.path = path
        self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30.0)
        self._conn.execute("PRAGMA journal_mode=WAL")
        # As the store's: an appended row is acknowledged once it is on disk.
        self._conn.execute(f"PRAGMA synchronous={synchronous}")
        self._columns: dict[str, set[str]] = {}
        self._version: int | None = None
        self._sql: dict[tuple[str, tuple[str, ...], int], str] = {}

    def close(self) -> None:
        self._conn.close()

    def _catch_up(self) -> None:
        """The tables and columns as on disk, read again when the schema moved (another
        process created or widened one)."""
        (version,) = self._conn.execute("PRAGMA schema_version").fetchone()
        if version != self._version:
            self._columns = tables_on_disk(self._conn, "r")
            self._version = version

    def append(self, groups: Groups) -> None:
        """Append every group's rows (series id, ts, then the named fields; row after row), in
        one transaction. Raises what SQLite raised (the caller classifies it), nothing kept."""
        try:
            with transaction(self._conn, "BEGIN IMMEDIATE"):
                self._catch_up()
                for (measurement, names), flat in groups.items():
                    self._ensure_columns(measurement, names)
                    self._insert(measurement, names, flat)
        except BaseException:
            self._version = None  # tables or columns made inside it are gone again
            raise

    def _ensure_columns(self, measurement: str, names: Sequence[str]) -> None:
        table = ident("r_" + measurement, "measurement")
        create = f"CREATE TABLE IF NOT EXISTS {table} (series_id INTEGER NOT NULL, ts INTEGER NOT NULL)"
        ensure_columns(self._conn, table, create, self._columns, measurement, names)

    def _append_sql(self, measurement: str, names: tuple[str, ...], rows: int) -> str:
        key = (measurement, names, rows)
        sql = self._sql.get(key)
        if sql is None:
            cols = ", ".join(ident(n, "field") for n in names)
            marks = "(" + ", ".join("?" * (len(names) + 2)) + ")"
            sql = (
                f'INSERT INTO "r_{measurement}" (series_id, ts{", " if names else ""}{cols}) '
                f"VALUES {', '.join([marks] * rows)}"
            )
            if len(self._sql) >= 1024:
                self._sql.clear()
            self._sql[key] = sql
        return sql

    def _insert(self, measurement: str, names: tuple[str, ...], flat: list[object]) -> None:
        """The rows in flat, up to ROWS_PER_STATEMENT rows per statement. Not executemany: the
        sqlite3 module releases the GIL around every row's step and takes it back for the next
        row, so a batch of 50,000 rows written while the event loop is busy waits for the GIL
        50,000 times (we measured a 0.4 s batch taking 6.7 s); one statement per few thousand
        rows waits a few times. Rows keep their order (a settle relies on it)."""
        width = len(names) + 2
        per = max(1, min(ROWS_PER_STATEMENT, _MAX_VARIABLES // width))
        left, start = len(flat) // width, 0
        while left:
            # Full statements, then the rest in power-of-two sizes: few distinct statements
            # to prepare, each prepared once and kept.
            rows = per if left >= per else 1 << (left.bit_length() - 1)
            end = start + rows * width
            self._conn.execute(self._append_sql(measurement, names, rows), flat[start:end])
            start, left = end, left - rows

    def discard(self, tops: Mapping[str, int]) -> None:
        """Remove the rows a settle copied (up to each table's top then), in one transaction."""
        with transaction(self._conn, "BEGIN IMMEDIATE"):
            for measurement, top in tops.items():
                self._conn.execute(f'DELETE FROM "r_{measurement}" WHERE rowid <= ?', (top,))


class Settler:
    """The writer of the store's tables' rows: the settle (staged rows copied in key order) and
    retention's deletes, one at a time in every process (two settles at once could copy an older
    staged value over a newer one). discard: removes the staged rows a settle copied, up to each
    measurement's last rowid then (the store does it, taking turns with its writers)."""

    def __init__(
        self, path: Path, staging_path: Path, synchronous: str, discard: Callable[[Mapping[str, int]], None]
    ) -> None:
        self._discard = discard
        # The store, with the staging file attached to read from.
        self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30.0)
        self._conn.execute(f"PRAGMA synchronous={synchronous}")
        self._conn.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
        self._conn.execute("ATTACH DATABASE ? AS staged", (str(staging_path),))
        self._lock = threading.Lock()
        self._lockfile = os.open(str(path) + ".settlelock", os.O_RDWR | os.O_CREAT, 0o600)
        self._sql: dict[tuple[str, tuple[str, ...]], str] = {}
        self.settles_total = 0
        self.settled_points_total = 0
        self.failures_total = 0
        self.last_settle_s = 0.0

    def close(self) -> None:
        with self._lock:
            self._conn.close()
            os.close(self._lockfile)

    @contextlib.contextmanager
    def _turn(self) -> Iterator[sqlite3.Connection]:
        """This process's lock, then the lock file's (every process's)."""
        with self._lock:
            fcntl.flock(self._lockfile, fcntl.LOCK_EX)
            try:
                yield self._conn
            finally:
                fcntl.flock(self._lockfile, fcntl.LOCK_UN)

    def _statement(self, measurement: str, names: tuple[str, ...]) -> str:
        """The staged rows up to a rowid into the table in key order (one page at a time), a row
        of the same series and time as one there (a replay) setting the fields it carries (the
        newest value of a field wins, a field it does not carry is kept); rows of one key in the
        order written."""
        key = (measurement, names)
        sql = self._sql.get(key)
        if sql is None:
            cols = "".join(f", {ident(n, 'field')}" for n in names)
            update = ", ".join(
                f"{ident(n, 'field')} = coalesce(excluded.{ident(n, 'field')}, {ident(n, 'field')})"
                for n in names
            )
            sql = self._sql[key] = (
                f'INSERT INTO main."m_{measurement}" (series_id, ts{cols}) SELECT series_id, ts{cols} '
                f'FROM staged."r_{measurement}" WHERE rowid <= ? ORDER BY series_id, ts, rowid '
                f"ON CONFLICT (series_id, ts) DO " + (f"UPDATE SET {update}" if names else "NOTHING")
            )
        return sql

    def settle(self) -> int:
        """Copy every staged row into its measurement's table in one transaction, then discard
        them from the staging file; how many were copied. Raises StoreUnavailable when the
        store or its disk cannot take it (the rows stay staged)."""
        started = time.perf_counter()
        try:
            with self._turn() as conn:
                tops, moved = self._copy(conn)
            if tops:
                self._discard(tops)
        except StoreError:
            self.failures_total += 1
            raise
        if moved:
            self.settles_total += 1
            self.settled_points_total += moved
            self.last_settle_s = time.perf_counter() - started
        return moved

    def _copy(self, conn: sqlite3.Connection) -> tuple[dict[str, int], int]:
        """(each measurement's last staged rowid copied, rows copied)."""
        tops: dict[str, int] = {}
        moved = 0
        try:
            tables = tables_on_disk(conn, "m")
            staged = tables_on_disk(conn, "r", "staged")
            # Deferred: the staging file is only read, and the last rowids are read inside the
            # transaction, so every row up to them is in its snapshot (a writer's rows not
            # committed yet come after them, and are not discarded).
            with transaction(conn):
                for measurement, columns in staged.items():
                    (top,) = conn.execute(f'SELECT max(rowid) FROM staged."r_{measurement}"').fetchone()
                    if top is None:
                        continue
                    missing = columns - tables.get(measurement, set())
                    if measurement not in tables or missing:
                        # Never so: a write adds the table's columns before it stages rows.
                        raise StoreError(
                            f"staged {measurement} rows have fields the store's table lacks "
                            f"({sorted(missing) or 'the table'}); they stay staged"
                        )
                    moved += conn.execute(
                        self._statement(measurement, tuple(sorted(columns))), (top,)
                    ).rowcount
                    tops[measurement] = top
            return tops, moved
        except Exception as exc:  # rolled back
            if isinstance(exc, StoreError):
                raise
            raise write_failure(exc, "settling the embedded store's staged points") from exc

    def delete_older(self, cutoff_ns: Callable[[str], int]) -> int:
        """Retention: each measurement's points older than its cutoff; how many went."""
        deleted = 0
        with self._turn() as conn:
            for measurement in tables_on_disk(conn, "m"):
                table = ident("m_" + measurement, "measurement")
                # Per series, so the (series_id, ts) key is used instead of a table scan.
                deleted += conn.execute(
                    f"DELETE FROM {table} WHERE series_id IN "
                    "(SELECT id FROM series WHERE measurement = ?) AND ts < ?",
                    (measurement, cutoff_ns(measurement)),
                ).rowcount
        return deleted
