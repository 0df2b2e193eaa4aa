"""The smaller things the control-plane state keeps besides workflows, incidents, the audit log
and the action ledger: each finding's first-seen time (persistence windows), alert delivery (one
identity per alert, each sink's outbox), small values (the breaker) and the collector token
revocation list. Same SQL on SQLite and PostgreSQL; written through the state's fenced writes."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from gpufleet.repair.outcome import Outcome

if TYPE_CHECKING:
    from gpufleet.repair.state import Database

_NO_GPU = -1  # first_seen.gpu for a finding about the whole node


class KeptValues:
    def __init__(self, db: Database, write: Callable[[str], AbstractContextManager[None]]) -> None:
        self._db = db
        self._write = write  # the state's write: fenced on a leader's view

    def revoke_collector_token(self, token_id: str, node: str, actor: str, reason: str) -> bool:
        """Add a collector token id to the revocation list (not fenced: any replica may record
        a person's revocation), with an audit row; False when it was already revoked."""
        with self._db.transaction():
            added = self._db.execute(
                "INSERT INTO revoked_token VALUES (?, ?, ?, ?, ?) ON CONFLICT (token_id) DO NOTHING "
                "RETURNING token_id",
                (token_id, node, time.time_ns(), actor, reason),
            )
            if added:
                self._db.execute(
                    "INSERT INTO audit (time_ns, actor, node, action, reason, outcome, incident_id) "
                    "VALUES (?, ?, ?, 'revoke_token', ?, 'ok', '')",
                    (time.time_ns(), actor, node, f"token {token_id}: {reason}"[:300]),
                )
        return bool(added)

    def revoked_collector_tokens(self) -> set[str]:
        return {str(t) for (t,) in self._db.execute("SELECT token_id FROM revoked_token")}

    def first_seen(self) -> dict[tuple[str, int | None, str], int]:
        rows = self._db.execute("SELECT node, gpu, code, seen_ns FROM first_seen")
        return {(n, None if g == _NO_GPU else g, c): t for n, g, c, t in rows}

    def put_first_seen(
        self, node: str, gone: list[tuple[str, int | None, str]], new: dict[tuple[str, int | None, str], int]
    ) -> None:
        with self._write(f"persistence windows of {node}"):
            for n, g, c in gone:
                self._db.execute(
                    "DELETE FROM first_seen WHERE node = ? AND gpu = ? AND code = ?",
                    (n, _NO_GPU if g is None else g, c),
                )
            for (n, g, c), t in new.items():
                self._db.execute(
                    "INSERT INTO first_seen VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (node, gpu, code) DO UPDATE SET seen_ns = excluded.seen_ns",
                    (n, _NO_GPU if g is None else g, c, t),
                )

    def alert_identities(self) -> list[tuple[str, str, str]]:
        """(key, status, alert body) of every alert identity: waiting, held or sent."""
        return [(k, s, b) for k, s, b in self._db.execute("SELECT key, status, body FROM alert_identity")]

    def put_alert_identity(self, key: str, status: str, body: str) -> None:
        with self._write(f"alert {key} {status}"):
            self._db.execute(
                "INSERT INTO alert_identity VALUES (?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET status = excluded.status, body = excluded.body",
                (key, status, body),
            )

    def drop_alert_identity(self, key: str) -> None:
        with self._write(f"drop alert {key}"):
            self._db.execute("DELETE FROM alert_identity WHERE key = ?", (key,))

    def queue_alert(self, sink: str, body: str) -> int:
        """An alert to deliver to one sink; kept until delivered or dropped."""
        with self._write(f"queue an alert for {sink}"):
            rows = self._db.execute(
                "INSERT INTO alert_outbox (sink, body) VALUES (?, ?) RETURNING seq", (sink, body)
            )
        return int(rows[0][0])

    def finish_alert(self, seq: int, outcome: Outcome) -> None:
        with self._write(f"alert delivery {seq}: {outcome}"):
            self._db.execute(
                "UPDATE alert_outbox SET outcome = ? WHERE seq = ?", (str(outcome.trimmed()), seq)
            )

    def queued_alerts(self) -> list[tuple[int, str, str]]:
        """(seq, sink, body) of alerts not yet delivered, oldest first."""
        rows = self._db.execute("SELECT seq, sink, body FROM alert_outbox WHERE outcome IS NULL ORDER BY seq")
        return [(int(s), k, b) for s, k, b in rows]

    def get(self, key: str) -> str | None:
        rows = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,))
        return rows[0][0] if rows else None

    def put(self, key: str, value: str) -> None:
        with self._write(f"set {key}"):
            self._db.execute(
                "INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )
