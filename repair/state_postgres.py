"""The control-plane store for replicas: PostgreSQL, through psycopg 3 (docs/architecture.md
"Control plane and replicas"). Any number of aggregators share one database; the lease is
timed by the database's clock, so the replicas' clocks do not matter to who leads.

Every session runs with idle_in_transaction_session_timeout and lock_timeout set to the connect
timeout (the aggregator gives half the lease, at most 5 s): a replica SIGSTOPped in the middle
of a transaction holding the lease row's lock is cut off by the server, so the others can take
the lease over.

The controller's calls are synchronous and short (one or two round trips on a local network);
each replica's background loops open their own connection so that a slow query there never
holds the event loop's. A connection that broke (the server restarted, a network blip) is
opened again on the next call; a call that fails raises StateError, which the caller counts."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from gpufleet.common.redact import redact
from gpufleet.repair.state import RepairState, StateError

_NOW_NS = "(extract(epoch from clock_timestamp()) * 1000000000)::bigint"


class PostgresState(RepairState):
    dialect = "postgresql"

    def __init__(
        self, url: str, connect_timeout_s: float = 10.0, _shared: PostgresState | None = None
    ) -> None:
        if _shared is not None:  # a fenced view on the same connection
            self._url, self._timeout_s = _shared._url, _shared._timeout_s
            self._box, self._lock, self._sql = _shared._box, _shared._lock, _shared._sql
            return
        self._url, self._timeout_s = url, connect_timeout_s
        self._lock = threading.RLock()
        self._box: list[psycopg.Connection[Any] | None] = [None]  # shared with fenced views
        self._sql: dict[str, str] = {}  # "?" statements → psycopg's "%s"
        self._connection()  # fail now, with a clear message, if the server cannot be reached

    def fenced(self, holder: str, epoch: int) -> RepairState:
        view = PostgresState(self._url, self._timeout_s, _shared=self)
        view._holder, view._epoch = holder, epoch
        return view

    def describe(self) -> str:
        return redact(self._url)

    def close(self) -> None:
        conn = self._box[0]
        if conn is not None:
            conn.close()
        self._box[0] = None

    def _connection(self) -> psycopg.Connection[Any]:
        conn = self._box[0]
        if conn is None or conn.closed or conn.broken:
            try:
                conn = psycopg.connect(
                    self._url,
                    autocommit=True,
                    connect_timeout=max(1, int(self._timeout_s)),
                    # A process paused or cut off inside a transaction must not hold the lease
                    # row's lock for ever (a takeover would wait on it): the server ends such a
                    # session after the timeout, and no statement waits longer for a lock.
                    options=f"-c idle_in_transaction_session_timeout={int(self._timeout_s * 1000)} "
                    f"-c lock_timeout={int(self._timeout_s * 1000)}",
                )
            except psycopg.Error as exc:
                raise StateError(
                    redact(f"cannot connect to the control-plane PostgreSQL at {self._url}: {exc}".strip())
                ) from exc
            self._box[0] = conn
        return conn

    def _execute(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        text = self._sql.get(sql)
        if text is None:
            text = self._sql[sql] = sql.replace("?", "%s")
        with self._lock:
            conn = self._connection()
            try:
                cur = conn.execute(text, tuple(args))  # type: ignore[call-overload]
                return cur.fetchall() if cur.description else []
            except psycopg.Error as exc:
                raise StateError(redact(f"control-plane PostgreSQL {self._url}: {exc}".strip())) from exc

    def _execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self._transaction():
            try:
                # psycopg pipelines executemany: one round trip for the lot, not one per row.
                self._connection().cursor().executemany(sql.replace("?", "%s"), [tuple(r) for r in rows])
            except psycopg.Error as exc:
                raise StateError(redact(f"control-plane PostgreSQL {self._url}: {exc}".strip())) from exc

    @contextmanager
    def _transaction(self, lock_lease: bool = False) -> Iterator[None]:
        with self._lock:
            conn = self._connection()
            try:
                with conn.transaction():
                    if lock_lease:
                        self._execute("SELECT 1 FROM leader_lease WHERE id = 1 FOR UPDATE")
                    yield
            except psycopg.Error as exc:  # the commit itself failed
                raise StateError(redact(f"control-plane PostgreSQL {self._url}: {exc}".strip())) from exc

    def _store_now_ns(self) -> int:
        return int(self._execute(f"SELECT {_NOW_NS}")[0][0])

    def _read_lease_for_share(self) -> tuple[str, int, int, int]:
        holder, epoch, expires_ns, now_ns = self._execute(
            f"SELECT holder, epoch, expires_ns, {_NOW_NS} FROM leader_lease WHERE id = 1 FOR SHARE"
        )[0]
        return str(holder), int(epoch), int(expires_ns), int(now_ns)

    def _lock_migrations(self) -> None:
        self._execute("SELECT pg_advisory_xact_lock(7710014)")  # released at the transaction's end

    def _next_version_sql(self) -> str:
        return "nextval('node_live_version_seq')"
