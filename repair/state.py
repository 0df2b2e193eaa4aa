"""The repair controller's memory, on disk (SQLite in the aggregator's data directory): each
node's workflow, incidents, the audit log, the ledger of actions taken, the breaker.

Every change is committed before the action it describes is carried out, so an aggregator
killed at any point resumes from here and never repeats an action (see `begin_action`)."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpufleet.repair.model import Finding

_SCHEMA = """
CREATE TABLE IF NOT EXISTS workflow (node TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS incident (
    id TEXT PRIMARY KEY, node TEXT NOT NULL, opened_ns INTEGER NOT NULL, closed_ns INTEGER NOT NULL DEFAULT 0,
    body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS incident_node ON incident (node, opened_ns);
CREATE TABLE IF NOT EXISTS audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, time_ns INTEGER NOT NULL, actor TEXT NOT NULL, node TEXT NOT NULL,
    action TEXT NOT NULL, reason TEXT NOT NULL, outcome TEXT NOT NULL, incident_id TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS audit_node ON audit (node, seq);
CREATE TABLE IF NOT EXISTS action (key TEXT PRIMARY KEY, started_ns INTEGER NOT NULL, outcome TEXT);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS first_seen (
    node TEXT NOT NULL, gpu INTEGER NOT NULL, code TEXT NOT NULL, seen_ns INTEGER NOT NULL,
    PRIMARY KEY (node, gpu, code));
CREATE TABLE IF NOT EXISTS alert_identity (key TEXT PRIMARY KEY, status TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS alert_outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, sink TEXT NOT NULL, body TEXT NOT NULL, outcome TEXT);
"""
_NO_GPU = -1  # first_seen.gpu for a finding about the whole node


@dataclass
class Workflow:
    node: str
    state: str = "healthy"  # a NodeHealth name, lower case
    incident_id: str = ""
    ladder: list[str] = field(default_factory=list)
    step: int = 0  # index into ladder of the step in progress (or next)
    step_key: str = ""  # ledger key of the step in progress; "" when none is
    step_started_ns: int = 0
    boot_id_at_step: str = ""
    gpus: list[int] = field(default_factory=list)  # GPUs the incident is about
    validate_since_ns: int = 0
    cordoned_by_us: bool = False
    detail: str = ""
    suppressed: list[str] = field(default_factory=list)  # finding ids a person overrode
    cleared_before_ns: int = 0  # XIDs before this were dealt with (incident closed)
    held: str = ""  # "step:hold kind" of the step the rails hold back (audited once), "" when none

    @classmethod
    def from_json(cls, text: str) -> Workflow:
        return cls(**json.loads(text))


@dataclass
class Incident:
    id: str
    node: str
    opened_ns: int
    closed_ns: int = 0
    state: str = "suspect"
    outcome: str = ""
    attempts: int = 0
    findings: list[Finding] = field(default_factory=list)
    alerted: bool = False

    @property
    def open(self) -> bool:
        return not self.closed_ns

    def body(self) -> str:
        return json.dumps(asdict(self))  # findings, dataclasses too, become dicts

    @classmethod
    def from_body(cls, text: str) -> Incident:
        d = json.loads(text)
        d["findings"] = [Finding.from_json(f) for f in d["findings"]]
        return cls(**d)


@dataclass
class AuditRecord:
    time_ns: int
    actor: str
    node: str
    action: str
    reason: str
    outcome: str
    incident_id: str = ""


class RepairState:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # an action's record survives a power cut
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    # --- workflows -------------------------------------------------------------------
    def workflows(self) -> dict[str, Workflow]:
        return {n: Workflow.from_json(b) for n, b in self._db.execute("SELECT node, body FROM workflow")}

    def save(self, wf: Workflow) -> None:
        self._db.execute(
            "INSERT INTO workflow VALUES (?, ?) ON CONFLICT(node) DO UPDATE SET body = excluded.body",
            (wf.node, json.dumps(asdict(wf))),
        )

    # --- incidents -------------------------------------------------------------------
    def open_incident(self, node: str, findings: list[Finding], state: str) -> Incident:
        now = time.time_ns()
        incident = Incident(
            f"inc-{time.strftime('%Y%m%d')}-{uuid.uuid4().hex[:8]}", node, now, state=state, findings=findings
        )
        self._db.execute(
            "INSERT INTO incident VALUES (?, ?, ?, 0, ?)", (incident.id, node, now, incident.body())
        )
        return incident

    def put_incident(self, incident: Incident) -> None:
        self._db.execute(
            "UPDATE incident SET closed_ns = ?, body = ? WHERE id = ?",
            (incident.closed_ns, incident.body(), incident.id),
        )

    def incident(self, incident_id: str) -> Incident | None:
        row = self._db.execute("SELECT body FROM incident WHERE id = ?", (incident_id,)).fetchone()
        return Incident.from_body(row[0]) if row else None

    def incidents(self, open_only: bool = False, node: str = "", limit: int = 100) -> list[Incident]:
        sql = "SELECT body FROM incident WHERE 1=1"
        args: list[object] = []
        if open_only:
            sql += " AND closed_ns = 0"
        if node:
            sql += " AND node = ?"
            args.append(node)
        sql += " ORDER BY opened_ns DESC LIMIT ?"
        args.append(limit)
        return [Incident.from_body(b) for (b,) in self._db.execute(sql, args)]

    def incidents_since(self, node: str, since_ns: int) -> int:
        row = self._db.execute(
            "SELECT COUNT(*) FROM incident WHERE node = ? AND opened_ns >= ?", (node, since_ns)
        ).fetchone()
        return int(row[0])

    # --- audit ----------------------------------------------------------------------
    def audit(self, record: AuditRecord) -> None:
        self._db.execute(
            "INSERT INTO audit (time_ns, actor, node, action, reason, outcome, incident_id) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                record.time_ns,
                record.actor,
                record.node,
                record.action,
                record.reason,
                record.outcome,
                record.incident_id,
            ),
        )

    def audit_log(self, node: str = "", limit: int = 200, incident_id: str = "") -> list[AuditRecord]:
        sql = "SELECT time_ns, actor, node, action, reason, outcome, incident_id FROM audit WHERE 1=1"
        args: list[object] = []
        if node:
            sql += " AND node = ?"
            args.append(node)
        if incident_id:
            sql += " AND incident_id = ?"
            args.append(incident_id)
        sql += " ORDER BY seq DESC LIMIT ?"
        args.append(limit)
        return [AuditRecord(*row) for row in reversed(self._db.execute(sql, args).fetchall())]

    # --- the action ledger ------------------------------------------------------------
    def begin_action(self, key: str) -> bool:
        """Record that an action is about to be carried out. False if it was begun before (by
        this or an earlier aggregator process): the caller must not do it again."""
        cur = self._db.execute("INSERT OR IGNORE INTO action VALUES (?, ?, NULL)", (key, time.time_ns()))
        return cur.rowcount == 1

    def finish_action(self, key: str, outcome: str) -> None:
        self._db.execute("UPDATE action SET outcome = ? WHERE key = ?", (outcome, key))

    def action_outcome(self, key: str) -> str | None:
        """None: not begun; "": begun, outcome unknown (e.g. the aggregator died meanwhile)."""
        row = self._db.execute("SELECT outcome FROM action WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        return row[0] or ""

    # --- persistence windows -----------------------------------------------------------
    def first_seen(self) -> dict[tuple[str, int | None, str], int]:
        rows = self._db.execute("SELECT node, gpu, code, seen_ns FROM first_seen")
        return {(n, None if g == _NO_GPU else g, c): t for n, g, c, t in rows}

    def put_first_seen(
        self, node: str, gone: list[tuple[str, int | None, str]], new: dict[tuple[str, int | None, str], int]
    ) -> None:
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany(
                "DELETE FROM first_seen WHERE node = ? AND gpu = ? AND code = ?",
                [(n, _NO_GPU if g is None else g, c) for n, g, c in gone],
            )
            self._db.executemany(
                "INSERT OR REPLACE INTO first_seen VALUES (?, ?, ?, ?)",
                [(n, _NO_GPU if g is None else g, c, t) for (n, g, c), t in new.items()],
            )

    # --- alert delivery (repair/alerts/dispatcher.py) ------------------------------------
    def alert_identities(self) -> list[tuple[str, str, str]]:
        """(key, status, alert body) of every alert identity: waiting, held or sent."""
        return list(self._db.execute("SELECT key, status, body FROM alert_identity"))

    def put_alert_identity(self, key: str, status: str, body: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO alert_identity VALUES (?, ?, ?)", (key, status, body))

    def drop_alert_identity(self, key: str) -> None:
        self._db.execute("DELETE FROM alert_identity WHERE key = ?", (key,))

    def queue_alert(self, sink: str, body: str) -> int:
        """An alert to deliver to one sink; kept until delivered or dropped."""
        cur = self._db.execute("INSERT INTO alert_outbox (sink, body) VALUES (?, ?)", (sink, body))
        return int(cur.lastrowid or 0)

    def finish_alert(self, seq: int, outcome: str) -> None:
        self._db.execute("UPDATE alert_outbox SET outcome = ? WHERE seq = ?", (outcome, seq))

    def queued_alerts(self) -> list[tuple[int, str, str]]:
        """(seq, sink, body) of alerts not yet delivered, oldest first."""
        return list(
            self._db.execute("SELECT seq, sink, body FROM alert_outbox WHERE outcome IS NULL ORDER BY seq")
        )

    # --- small values (the breaker) -----------------------------------------------------
    def get(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def put(self, key: str, value: str) -> None:
        self._db.execute(
            "INSERT INTO meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )
