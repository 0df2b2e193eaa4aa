"""The embedded store's staging file (aggregator/store/embedded.py): where writes land.

One table per measurement, `r_<measurement>`, in a SQLite file of its own beside the store
(`store.staged.sqlite3`), rows in the order written (rowid), the same field columns as the
store's table. A write appends: its commit writes the staging table's last pages, whatever
series the rows belong to. The store's `settle` copies the staged rows into its tables in key
order and then discards them here (`discard`). A file of its own so that ingest never waits
for a settle: SQLite has one writer per file, and a settle rewrites a page per series.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpufleet.aggregator.store.embedded_read import ident, tables_on_disk

# Host parameters per statement: SQLite's default limit (SQLITE_MAX_VARIABLE_NUMBER) since 3.32;
# builds may raise it, none lowers it. Rows per statement: enough to make the GIL round trips
# per batch few, few enough that the statement cache holds every size in use.
_MAX_VARIABLES = 32_766
_ROWS_PER_STATEMENT = 2_000

Groups = Mapping[tuple[str, tuple[str, ...]], list[object]]


def staged_path(store_path: Path) -> Path:
    """store.sqlite3 -> store.staged.sqlite3 (beside it, in the same data directory)."""
    return store_path.with_name(f"{store_path.stem}.staged{store_path.suffix}")


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
        conn = self._conn
        try:
            if conn.in_transaction:  # left open by a failure we could not roll back
                conn.execute("ROLLBACK")
            conn.execute("BEGIN IMMEDIATE")
            self._catch_up()
            for (measurement, names), flat in groups.items():
                self._ensure_columns(measurement, names)
                self._insert(measurement, names, flat)
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            self._version = None  # tables or columns made inside it are gone again
            raise

    def _ensure_columns(self, measurement: str, names: Sequence[str]) -> None:
        table = ident("r_" + measurement, "measurement")
        cols = self._columns.get(measurement)
        if cols is None:
            self._conn.execute(
                f"CREATE TABLE IF NOT EXISTS {table} (series_id INTEGER NOT NULL, ts INTEGER NOT NULL)"
            )
            cols = self._columns[measurement] = set()
        for name in names:
            if name not in cols:
                # No declared type: SQLite keeps each value as given (int stays int).
                self._conn.execute(f"ALTER TABLE {table} ADD COLUMN {ident(name, 'field')}")
                cols.add(name)

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
        per = max(1, min(_ROWS_PER_STATEMENT, _MAX_VARIABLES // width))
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
        conn = self._conn
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            conn.execute("BEGIN IMMEDIATE")
            for measurement, top in tops.items():
                conn.execute(f'DELETE FROM "r_{measurement}" WHERE rowid <= ?', (top,))
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            raise
