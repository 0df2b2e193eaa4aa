"""Versioned schema migrations of the control-plane store, applied in order at start-up
(`RepairState.migrate`) or by hand (`gpufleet db migrate`). A migration is never edited once
released: a change is a new version. Each is written once, in the SQL both stores take; the
few words that differ are spelled per dialect here ({serial}, {bytes}, {bool})."""

from __future__ import annotations

from dataclasses import dataclass

_TYPES = {
    "sqlite": {"serial": "INTEGER PRIMARY KEY AUTOINCREMENT", "bytes": "BLOB", "bool": "INTEGER"},
    "postgresql": {"serial": "BIGSERIAL PRIMARY KEY", "bytes": "BYTEA", "bool": "BOOLEAN"},
}


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    sql: tuple[str, ...]
    postgresql_only: tuple[str, ...] = ()

    def statements(self, dialect: str) -> list[str]:
        types = _TYPES[dialect]
        out = [s.format(**types) for s in self.sql]
        if dialect == "postgresql":
            out += list(self.postgresql_only)
        return out


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "repair state: workflows, incidents, audit, action ledger, breaker, windows, alert delivery",
        (
            "CREATE TABLE IF NOT EXISTS workflow (node TEXT PRIMARY KEY, body TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS incident (id TEXT PRIMARY KEY, node TEXT NOT NULL, "
            "opened_ns BIGINT NOT NULL, closed_ns BIGINT NOT NULL DEFAULT 0, body TEXT NOT NULL)",
            "CREATE INDEX IF NOT EXISTS incident_node ON incident (node, opened_ns)",
            "CREATE TABLE IF NOT EXISTS audit (seq {serial}, time_ns BIGINT NOT NULL, actor TEXT NOT NULL, "
            "node TEXT NOT NULL, action TEXT NOT NULL, reason TEXT NOT NULL, outcome TEXT NOT NULL, "
            "incident_id TEXT NOT NULL)",
            "CREATE INDEX IF NOT EXISTS audit_node ON audit (node, seq)",
            "CREATE TABLE IF NOT EXISTS action (key TEXT PRIMARY KEY, started_ns BIGINT NOT NULL, "
            "outcome TEXT)",
            "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS first_seen (node TEXT NOT NULL, gpu INTEGER NOT NULL, "
            "code TEXT NOT NULL, seen_ns BIGINT NOT NULL, PRIMARY KEY (node, gpu, code))",
            "CREATE TABLE IF NOT EXISTS alert_identity (key TEXT PRIMARY KEY, status TEXT NOT NULL, "
            "body TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS alert_outbox (seq {serial}, sink TEXT NOT NULL, body TEXT NOT NULL, "
            "outcome TEXT)",
        ),
    ),
    Migration(
        2,
        "replicas: leader lease, replica heartbeats, shared live view, commands routed to streams",
        (
            "CREATE TABLE leader_lease (id INTEGER PRIMARY KEY CHECK (id = 1), holder TEXT NOT NULL, "
            "epoch BIGINT NOT NULL, expires_ns BIGINT NOT NULL)",
            "INSERT INTO leader_lease VALUES (1, '', 0, 0)",
            "CREATE TABLE replica (id TEXT PRIMARY KEY, info TEXT NOT NULL, heard_ns BIGINT NOT NULL)",
            "CREATE TABLE node_live (node TEXT PRIMARY KEY, replica TEXT NOT NULL, heard_ns BIGINT NOT NULL, "
            "connected {bool} NOT NULL, version BIGINT NOT NULL, body {bytes} NOT NULL)",
            "CREATE INDEX node_live_version ON node_live (version)",
            "CREATE TABLE command (seq {serial}, node TEXT NOT NULL, command_id TEXT NOT NULL UNIQUE, "
            "body {bytes} NOT NULL, epoch BIGINT NOT NULL, taken_by TEXT NOT NULL, "
            "queued_ns BIGINT NOT NULL)",
            "CREATE INDEX command_untaken ON command (taken_by, seq)",
            "CREATE TABLE command_result (seq {serial}, node TEXT NOT NULL, command_id TEXT NOT NULL UNIQUE, "
            "body {bytes} NOT NULL)",
        ),
        postgresql_only=("CREATE SEQUENCE node_live_version_seq",),
    ),
    Migration(
        3,
        "collector token revocation list (docs/security.md): one row per revoked token id",
        (
            "CREATE TABLE revoked_token (token_id TEXT PRIMARY KEY, node TEXT NOT NULL, "
            "revoked_ns BIGINT NOT NULL, actor TEXT NOT NULL, reason TEXT NOT NULL)",
        ),
    ),
)
