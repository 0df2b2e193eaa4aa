"""The control-plane store for replicas: PostgreSQL, through psycopg 3 (docs/architecture.md
"Control plane and replicas"). Any number of aggregators share one database; the lease is
timed by the database's clock, so the replicas' clocks do not matter to who leads.

Every session runs with idle_in_transaction_session_timeout set to the connect timeout (the
aggregator gives half the lease, at most 5 s): a replica SIGSTOPped in the middle of a
transaction holding the lease row's lock is cut off by the server, so the others can take the
lease over. Its lock_timeout is under the call timeout, so a wait for a lock ends with the
server's error, not with a caller that gave up on it.

**A server that stops answering never holds the caller** (docs/architecture.md "When the
control plane hangs"). A database that hangs (paused, a storage stall, a partition that drops
packets) accepts bytes and answers none; TCP keepalive notices only after minutes. So every
wait on the server is bounded by call_timeout_s (psycopg's own per-wait timeout): a statement
that has no answer by then fails with StateError and its connection is closed (its state is
unknown). A new connection is opened on a thread of its own: the call that starts it waits at most
CONNECT_WAIT_S, and while that connect is still pending every call fails at once — the
repair term's thread (aggregator/repair_term.py), which makes the leader's calls, waits about
one call_timeout_s per stall, never the length of the stall, and the aggregator's event loop
waits on none of them."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from gpufleet.common.redact import redact
from gpufleet.repair.state import RepairState, StateError

_NOW_NS = "(extract(epoch from clock_timestamp()) * 1000000000)::bigint"
_WAIT_INTERVAL_S = 0.1  # psycopg's own interval between checks for Ctrl-C
CONNECT_WAIT_S = 0.25  # how long a call waits for a new connection before failing
LOCK_WAIT_SHARE = 0.8  # of the call timeout, the most a statement waits for a lock


class _BoundedConnection(psycopg.Connection[Any]):
    """A psycopg connection whose every wait on the server ends after call_timeout_s with
    psycopg's _WaitTimeout (psycopg waits without a limit unless told)."""

    call_timeout_s: float = 2.0

    def wait(self, gen: Any, interval: float = _WAIT_INTERVAL_S, timeout: float | None = None) -> Any:
        return super().wait(gen, interval, self.call_timeout_s if timeout is None else timeout)


class _Link:
    """One connection to the server, shared by a state and its fenced views, opened again
    (on a thread of its own) when it broke or a call on it had no answer in time."""

    def __init__(
        self, url: str, connect_timeout_s: float, call_timeout_s: float, application_name: str
    ) -> None:
        self.url, self.connect_timeout_s, self.call_timeout_s = url, connect_timeout_s, call_timeout_s
        self.application_name = application_name
        self.lock = threading.RLock()
        self.conn: psycopg.Connection[Any] | None = None
        self._connecting: Future[psycopg.Connection[Any]] | None = None
        self._connecting_since = 0.0
        self.timeouts_total = 0  # calls that had no answer within call_timeout_s

    def _open(self) -> psycopg.Connection[Any]:
        conn = _BoundedConnection.connect(
            self.url,
            autocommit=True,
            connect_timeout=max(1, int(self.connect_timeout_s)),
            # Which process and which of its connections a session is, in pg_stat_activity (a
            # DBA looking at a held lock sees whose it is); an application_name in the URL wins.
            fallback_application_name=self.application_name,
            # A process paused or cut off inside a transaction must not hold the lease row's
            # lock for ever (a takeover would wait on it): the server ends such a session
            # after the timeout. A statement waits for a lock for less than its caller waits
            # for an answer: the server ends the wait with an error and the connection stays,
            # rather than the caller giving up on a session still queued for the lock.
            options=f"-c idle_in_transaction_session_timeout={int(self.connect_timeout_s * 1000)} "
            f"-c lock_timeout={max(1, int(self.call_timeout_s * LOCK_WAIT_SHARE * 1000))}",
        )
        conn.call_timeout_s = self.call_timeout_s
        return conn

    def _connect_failed(self, exc: BaseException) -> StateError:
        return StateError(
            redact(f"cannot connect to the control-plane PostgreSQL at {self.url}: {exc}".strip())
        )

    def connect_now(self) -> None:
        """The first connection, in the caller (a clear error at start if it cannot be made)."""
        try:
            self.conn = self._open()
        except psycopg.Error as exc:
            raise self._connect_failed(exc) from exc

    def connection(self) -> psycopg.Connection[Any]:
        """The open connection; or a new one if it can be made at once (a restarted server
        answers in milliseconds). While a connect is pending, calls fail at once: a hung
        server holds only the connecting thread."""
        conn = self.conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        pending = self._connecting
        if pending is None:
            pending = self._connecting = Future()
            self._connecting_since = time.monotonic()
            threading.Thread(
                target=self._connect_into, args=(pending,), name="control-plane-connect", daemon=True
            ).start()
            wait_s = min(self.call_timeout_s, CONNECT_WAIT_S)
        else:
            wait_s = 0.0
        try:
            conn = pending.result(timeout=wait_s)
        except FutureTimeout as exc:
            raise StateError(
                redact(
                    f"control-plane PostgreSQL {self.url}: no connection yet "
                    f"({time.monotonic() - self._connecting_since:.1f} s trying, in the background)"
                )
            ) from exc
        except psycopg.Error as exc:
            self._connecting = None  # the next call tries again
            raise self._connect_failed(exc) from exc
        self._connecting = None
        self.conn = conn
        return conn

    def _connect_into(self, pending: Future[psycopg.Connection[Any]]) -> None:
        try:
            pending.set_result(self._open())
        except BaseException as exc:  # handed to the caller that waits on it
            pending.set_exception(exc)

    def failed(self, exc: psycopg.Error) -> StateError:
        """The error a failed call raises; a call without an answer in time closes the
        connection (it is mid-statement, its state unknown)."""
        if isinstance(exc, pg_errors._WaitTimeout):  # psycopg's own timeout error
            self.timeouts_total += 1
            self.close()
            return StateError(
                redact(
                    f"control-plane PostgreSQL {self.url}: no answer within {self.call_timeout_s:g} s "
                    "(the server hangs or the network drops packets); connection closed"
                )
            )
        if exc.sqlstate is None:
            # Not the server's answer to a statement but the client's own failure (a pipeline
            # left busy, a lost connection): the connection may never take another statement,
            # so it is closed and a new one made, as after a timeout.
            self.close()
        return StateError(redact(f"control-plane PostgreSQL {self.url}: {exc}".strip()))

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()


def postgres_state(
    url: str,
    connect_timeout_s: float = 10.0,
    call_timeout_s: float = 10.0,
    application_name: str = "gpufleet",
) -> RepairState:
    """The control-plane state in the PostgreSQL database at url (connected now)."""
    return RepairState(PostgresDatabase(url, connect_timeout_s, call_timeout_s, application_name))


class PostgresDatabase:
    dialect = "postgresql"

    def __init__(
        self,
        url: str,
        connect_timeout_s: float = 10.0,
        call_timeout_s: float = 10.0,
        application_name: str = "gpufleet",
    ) -> None:
        self._link = _Link(url, connect_timeout_s, call_timeout_s, application_name)
        self._sql: dict[str, str] = {}  # "?" statements → psycopg's "%s"
        self._link.connect_now()  # fail now, with a clear message, if the server cannot be reached

    @property
    def call_timeouts_total(self) -> int:
        """Calls that had no answer within the call timeout (each closed its connection)."""
        return self._link.timeouts_total

    def describe(self) -> str:
        return redact(self._link.url)

    def close(self) -> None:
        self._link.close()

    def execute(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        text = self._sql.get(sql)
        if text is None:
            text = self._sql[sql] = sql.replace("?", "%s")
        link = self._link
        with link.lock:
            conn = link.connection()
            try:
                cur = conn.execute(text, tuple(args))  # type: ignore[call-overload]
                return cur.fetchall() if cur.description else []
            except psycopg.Error as exc:
                raise link.failed(exc) from exc

    def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self.transaction():
            try:
                # psycopg pipelines executemany: one round trip for the lot, not one per row.
                self._link.connection().cursor().executemany(sql.replace("?", "%s"), [tuple(r) for r in rows])
            except psycopg.Error as exc:
                raise self._link.failed(exc) from exc

    @contextmanager
    def transaction(self, lock_lease: bool = False) -> Iterator[None]:
        link = self._link
        with link.lock:
            conn = link.connection()
            try:
                with conn.transaction():
                    if lock_lease:
                        self.execute("SELECT 1 FROM leader_lease WHERE id = 1 FOR UPDATE")
                    yield
            except psycopg.Error as exc:  # the commit itself failed
                raise link.failed(exc) from exc

    def store_now_ns(self) -> int:
        return int(self.execute(f"SELECT {_NOW_NS}")[0][0])

    def read_lease_for_share(self) -> tuple[str, int, int, int]:
        holder, epoch, expires_ns, now_ns = self.execute(
            f"SELECT holder, epoch, expires_ns, {_NOW_NS} FROM leader_lease WHERE id = 1 FOR SHARE"
        )[0]
        return str(holder), int(epoch), int(expires_ns), int(now_ns)

    def lock_migrations(self) -> None:
        self.execute("SELECT pg_advisory_xact_lock(7710014)")  # released at the transaction's end

    def next_version_sql(self) -> str:
        return "nextval('node_live_version_seq')"
