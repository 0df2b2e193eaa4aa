"""The control-plane store on one box: SQLite in the aggregator's data directory (the default).
Durable (WAL, synchronous=FULL: an action's record survives a power cut). The lease works here
too (BEGIN IMMEDIATE serialises it), so two aggregator processes on one box sharing the file
would still elect one leader; replicas on several hosts need PostgreSQL."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpufleet.repair.state import RepairState, StateError


def sqlite_state(path: str | Path) -> RepairState:
    """The control-plane state in the SQLite file at path (":memory:": in memory)."""
    return RepairState(SqliteDatabase(path))


class SqliteDatabase:
    dialect = "sqlite"

    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False, timeout=30.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._lock = threading.RLock()  # one transaction at a time on the shared connection
        self._depth = [0]  # transaction nesting on this connection (fenced views share it)

    def describe(self) -> str:
        return f"sqlite {self._path}"

    def close(self) -> None:
        self._db.close()

    def execute(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            with self._lock:
                return self._db.execute(sql, tuple(args)).fetchall()
        except sqlite3.Error as exc:
            raise StateError(f"control-plane store {self._path}: {exc}") from exc

    def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self.transaction():
            try:
                self._db.executemany(sql, [tuple(r) for r in rows])
            except sqlite3.Error as exc:
                raise StateError(f"control-plane store {self._path}: {exc}") from exc

    @contextmanager
    def transaction(self, lock_lease: bool = False) -> Iterator[None]:
        with self._lock:
            outer = self._depth[0] == 0
            if outer:
                try:
                    # IMMEDIATE: the write lock from the start, so a lease read in it is not
                    # changed by another process before this transaction ends.
                    self._db.execute("BEGIN IMMEDIATE")
                except sqlite3.Error as exc:
                    raise StateError(f"control-plane store {self._path}: {exc}") from exc
            self._depth[0] += 1
            try:
                yield
            except BaseException:
                self._depth[0] -= 1
                if outer:
                    self._db.execute("ROLLBACK")
                raise
            self._depth[0] -= 1
            if outer:
                self._db.execute("COMMIT")

    def lock_migrations(self) -> None:
        """BEGIN IMMEDIATE, which opened the transaction, already holds SQLite's write lock."""

    def store_now_ns(self) -> int:
        return time.time_ns()  # one box: its clock is the store's

    def read_lease_for_share(self) -> tuple[str, int, int, int]:
        holder, epoch, expires_ns = self.execute(
            "SELECT holder, epoch, expires_ns FROM leader_lease WHERE id = 1"
        )[0]
        return str(holder), int(epoch), int(expires_ns), time.time_ns()

    def next_version_sql(self) -> str:
        return "(SELECT COALESCE(MAX(version), 0) + 1 FROM node_live)"
