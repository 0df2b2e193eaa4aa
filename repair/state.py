"""The control plane's state contract (docs/architecture.md "Control plane and replicas").

What the repair controller remembers — each node's workflow, incidents, the audit log, the
ledger of actions taken, the breaker, alert delivery — and what replicas of the aggregator
share — the leader lease, the replicas, every node's live summary, commands on their way to a
node's stream and their results. Two databases under it: SQLite (one box, the default:
repair/state_sqlite.py) and PostgreSQL (replicas: repair/state_postgres.py). Both run the
same SQL here; they differ in connection, placeholders, types, locking and clock (`Database`). One
contract test suite runs on both (tests/replication/test_control_plane_contract.py).

Every change is committed before the action it describes is carried out, so an aggregator
killed at any point resumes from here and never repeats an action (see `begin_action`).

**Fencing.** `fenced(holder, epoch)` returns a view of the state whose writes carry the
leader's epoch: each runs in a transaction that first reads the lease row (shared lock) and
is refused — rolled back, `Fenced` raised, and the refusal written to the audit log — unless
this holder still has that epoch and the lease has not expired by the store's clock. The
controller writes its audit row ("started") or its ledger entry before every backend action,
so a paused leader that wakes after another took over cannot act: its first write is refused.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from gpufleet.common.redact import redact
from gpufleet.repair.health import Health, HoldKind, Step
from gpufleet.repair.kept_values import KeptValues
from gpufleet.repair.migrations import MIGRATIONS
from gpufleet.repair.model import Finding
from gpufleet.repair.outcome import STARTED, IncidentOutcome, Outcome


class StateError(Exception):
    """The control-plane store could not be read or written (down, refused, wrong schema)."""


class Fenced(StateError):
    """A write by a leader that is no longer the leader: refused, and audited."""

    def __init__(self, holder: str, epoch: int, current: LeaseInfo, what: str) -> None:
        super().__init__(
            f"write refused: {holder} acted as repair leader with epoch {epoch}, but the lease is "
            f"{current.describe()}; {what} not done"
        )
        self.holder, self.epoch, self.current, self.what = holder, epoch, current, what


@dataclass(frozen=True)
class HeldStep:
    """The step the rails hold back, and which rail: audited once per (step, kind)."""

    step: Step
    kind: HoldKind


@dataclass
class Workflow:
    node: str
    state: Health = Health.HEALTHY
    incident_id: str = ""
    ladder: list[Step] = field(default_factory=list)
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
    held: HeldStep | None = None  # the step the rails hold back (audited once), None when none
    # Serving-aware repair (repair/capacity.py): the drain may wait for serving capacity (every
    # finding behind the incident may wait); since when it has waited; whether its capacity
    # alert is firing; who told it to go on regardless ("" nobody).
    may_wait: bool = False
    capacity_wait_since_ns: int = 0
    capacity_alert: bool = False
    capacity_override: str = ""
    # Graceful drain (repair/engine_drain.py): when its engines were taken out of rotation (0:
    # not yet), and whether they are done (idle, timed out, or nothing to wait for).
    engines_leaving_ns: int = 0
    engines_drained: bool = False

    @classmethod
    def from_json(cls, text: str) -> Workflow:
        d = json.loads(text)
        d["state"] = Health(d.get("state", Health.HEALTHY))
        d["ladder"] = [Step(s) for s in d.get("ladder", [])]
        held = d.get("held")
        # A hold written before holds were typed was a string: it is audited once more, harmlessly.
        d["held"] = HeldStep(Step(held["step"]), HoldKind(held["kind"])) if isinstance(held, dict) else None
        return cls(**d)


@dataclass
class Incident:
    id: str
    node: str
    opened_ns: int
    closed_ns: int = 0
    state: str = "suspect"
    outcome: IncidentOutcome | None = None  # None while open
    attempts: int = 0
    findings: list[Finding] = field(default_factory=list)
    alerted: bool = False
    # The workloads on the node when it opened, their owners, and whether the fault hit each
    # (repair/incidents.py workloads_hit).
    workloads: list[dict[str, Any]] = field(default_factory=list)

    @property
    def open(self) -> bool:
        return not self.closed_ns

    def body(self) -> str:
        d = asdict(self)  # findings, dataclasses too, become dicts
        d["outcome"] = self.outcome.to_json() if self.outcome else None
        return json.dumps(d)

    @classmethod
    def from_body(cls, text: str) -> Incident:
        d = json.loads(text)
        d["findings"] = [Finding.from_json(f) for f in d["findings"]]
        d["outcome"] = IncidentOutcome.from_json(d["outcome"]) if d.get("outcome") else None
        return cls(**d)


@dataclass
class AuditRecord:
    time_ns: int
    actor: str
    node: str
    action: str
    reason: str
    outcome: Outcome
    incident_id: str = ""

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> AuditRecord:
        """(time_ns, actor, node, action, reason, outcome text, incident_id) as stored."""
        time_ns, actor, node, action, reason, outcome, incident_id = row
        return cls(int(time_ns), actor, node, action, reason, Outcome.parse(str(outcome)), incident_id)


@dataclass(frozen=True)
class LeaseInfo:
    holder: str  # "" when no one has ever held it
    epoch: int
    expires_ns: int  # by the store's clock
    now_ns: int  # the store's clock when this was read

    @property
    def live(self) -> bool:
        return bool(self.holder) and self.expires_ns > self.now_ns

    def describe(self) -> str:
        if not self.holder:
            return "not held"
        left_s = (self.expires_ns - self.now_ns) / 1e9
        if left_s <= 0:
            return f"expired {-left_s:.1f} s ago (last held by {self.holder}, epoch {self.epoch})"
        return f"held by {self.holder} with epoch {self.epoch} for {left_s:.1f} s more"


@dataclass(frozen=True)
class ReplicaInfo:
    replica: str
    info: dict[str, Any]  # addresses, streams, version: what `gpufleet status` shows
    heard_ns: int  # the store's clock at its last heartbeat
    age_s: float  # seconds since then, by the store's clock


@dataclass(frozen=True)
class LiveRow:
    """One node's live summary as the replica holding its stream last wrote it."""

    node: str
    replica: str
    heard_ns: int  # when that replica last heard the node (its clock)
    connected: bool
    version: int  # orders rows by write: read what changed with live_rows(after=...)
    body: bytes  # a serialized fleet_pb2.NodeDetail (opaque to the store)


@dataclass(frozen=True)
class QueuedCommand:
    seq: int
    node: str
    command_id: str
    body: bytes  # a serialized ingest_pb2.Command
    epoch: int  # the leader's epoch that queued it


class Database(Protocol):
    """What a store's engine gives the state (repair/state_sqlite.py, repair/state_postgres.py):
    a connection, a transaction, "?" placeholders, its locking and its clock."""

    dialect: str

    def execute(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement ("?" placeholders) in the current transaction, or in its own."""
        ...

    def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """One statement for many rows, in one transaction."""
        ...

    def transaction(self, lock_lease: bool = False) -> AbstractContextManager[None]:
        """One transaction; with lock_lease, the lease row is locked for update from its start
        (SQLite: BEGIN IMMEDIATE; PostgreSQL: SELECT ... FOR UPDATE)."""
        ...

    def store_now_ns(self) -> int:
        """The store's clock (the lease is timed by it, so replicas' clocks do not matter)."""
        ...

    def read_lease_for_share(self) -> tuple[str, int, int, int]:
        """(holder, epoch, expires_ns, now_ns) inside the current transaction, locked so that a
        takeover waits for it to end."""
        ...

    def lock_migrations(self) -> None:
        """Serialise migrations between processes (inside the migration's transaction)."""
        ...

    def next_version_sql(self) -> str:
        """SQL for the next version number of a live-view row."""
        ...

    def describe(self) -> str:
        """Where this store is, for people (a PostgreSQL URL without its password)."""
        ...

    def close(self) -> None: ...


class RepairState:
    """The contract, on a Database: the same SQL on both engines. A fenced view is the same
    Database with a leader's holder and epoch (`fenced`); the small values it keeps (first-seen
    times, alert delivery, the breaker, revoked tokens) are its `kept` (repair/kept_values.py)."""

    def __init__(self, db: Database, holder: str = "", epoch: int | None = None) -> None:
        self.db = db
        self._holder = holder
        self._epoch = epoch  # set on a fenced view: every write checks the lease first
        self.kept = KeptValues(db, self._write)

    def fenced(self, holder: str, epoch: int) -> RepairState:
        """A view on the same connection whose writes carry this leader's epoch."""
        return RepairState(self.db, holder, epoch)

    def describe(self) -> str:
        return self.db.describe()

    def close(self) -> None:
        self.db.close()

    # --- schema ---------------------------------------------------------------------------
    def migrate(self) -> list[int]:
        """Apply every migration not yet applied, in order, in one transaction (replicas that
        start together wait for each other: `_lock_migrations`); the versions applied now."""
        applied = []
        with self.db.transaction():
            self.db.lock_migrations()
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations "
                "(version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_ns BIGINT NOT NULL)"
            )
            done = {int(v) for (v,) in self.db.execute("SELECT version FROM schema_migrations")}
            for m in MIGRATIONS:
                if m.version in done:
                    continue
                for statement in m.statements(self.db.dialect):
                    self.db.execute(statement)
                self.db.execute(
                    "INSERT INTO schema_migrations VALUES (?, ?, ?)",
                    (m.version, m.description, time.time_ns()),
                )
                applied.append(m.version)
        return applied

    def schema_version(self) -> int:
        rows = self.db.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")
        return int(rows[0][0])

    def pending_migrations(self) -> list[int]:
        try:
            have = self.schema_version()
        except StateError:
            have = 0
        return [m.version for m in MIGRATIONS if m.version > have]

    # --- fencing --------------------------------------------------------------------------
    @contextmanager
    def _write(self, what: str) -> Iterator[None]:
        """One write of the controller's, fenced when this is a leader's view."""
        if self._epoch is None:
            with self.db.transaction():
                yield
            return
        refused: LeaseInfo | None = None
        with self.db.transaction():
            holder, epoch, expires_ns, now_ns = self.db.read_lease_for_share()
            current = LeaseInfo(holder, epoch, expires_ns, now_ns)
            if holder != self._holder or epoch != self._epoch or expires_ns <= now_ns:
                refused = current
            else:
                yield
        if refused is not None:
            # The refusal itself is recorded (not fenced: it claims no authority).
            self.db.execute(
                "INSERT INTO audit (time_ns, actor, node, action, reason, outcome, incident_id) "
                "VALUES (?, ?, '', 'fenced', ?, ?, '')",
                (
                    time.time_ns(),
                    f"{self._holder} (epoch {self._epoch})",
                    what[:300],
                    f"refused: the lease is {refused.describe()}",
                ),
            )
            raise Fenced(self._holder, self._epoch, refused, what)

    @property
    def epoch(self) -> int | None:
        """The leader's epoch this view writes with; None: unfenced (one box)."""
        return self._epoch

    def check_fence(self, what: str) -> None:
        """Raise Fenced unless this leader's view still holds the lease (a no-op write): the
        controller asks before each pass, so a drain check is not started by a deposed leader."""
        with self._write(what):
            pass

    def fenced_write(self, what: str) -> AbstractContextManager[None]:
        """One write, refused (Fenced) unless this view's leader still holds the lease (what
        extensions of the contract write through: aggregator/replication/records.py)."""
        return self._write(what)

    def lease(self) -> LeaseInfo:
        holder, epoch, expires_ns = self.db.execute(
            "SELECT holder, epoch, expires_ns FROM leader_lease WHERE id = 1"
        )[0]
        return LeaseInfo(str(holder), int(epoch), int(expires_ns), self.db.store_now_ns())

    # --- collector credentials -----------------------------------------------------------------
    # --- workflows -------------------------------------------------------------------------
    def workflows(self) -> dict[str, Workflow]:
        return {n: Workflow.from_json(b) for n, b in self.db.execute("SELECT node, body FROM workflow")}

    def save(self, wf: Workflow) -> None:
        with self._write(f"save the workflow of {wf.node} ({wf.state})"):
            self.db.execute(
                "INSERT INTO workflow VALUES (?, ?) ON CONFLICT (node) DO UPDATE SET body = excluded.body",
                (wf.node, json.dumps(asdict(wf))),
            )

    # --- incidents ---------------------------------------------------------------------------
    def open_incident(
        self, node: str, findings: list[Finding], state: str, now_ns: int | None = None
    ) -> Incident:
        now = time.time_ns() if now_ns is None else now_ns
        day = time.strftime("%Y%m%d", time.gmtime(now / 1e9))
        incident = Incident(f"inc-{day}-{uuid.uuid4().hex[:8]}", node, now, state=state, findings=findings)
        with self._write(f"open an incident on {node}"):
            self.db.execute(
                "INSERT INTO incident VALUES (?, ?, ?, 0, ?)", (incident.id, node, now, incident.body())
            )
        return incident

    def put_incident(self, incident: Incident) -> None:
        with self._write(f"update incident {incident.id}"):
            self.db.execute(
                "UPDATE incident SET closed_ns = ?, body = ? WHERE id = ?",
                (incident.closed_ns, incident.body(), incident.id),
            )

    def incident(self, incident_id: str) -> Incident | None:
        rows = self.db.execute("SELECT body FROM incident WHERE id = ?", (incident_id,))
        return Incident.from_body(rows[0][0]) if rows else None

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
        return [Incident.from_body(b) for (b,) in self.db.execute(sql, args)]

    def incidents_open_or_opened_since(self, since_ns: int, limit: int = 1000) -> list[Incident]:
        """Every open incident and those opened since since_ns, newest first (the history
        export's read: aggregator/fleet/export.py)."""
        rows = self.db.execute(
            "SELECT body FROM incident WHERE closed_ns = 0 OR opened_ns >= ? ORDER BY opened_ns DESC LIMIT ?",
            (since_ns, limit),
        )
        return [Incident.from_body(b) for (b,) in rows]

    def incidents_since(self, node: str, since_ns: int) -> int:
        rows = self.db.execute(
            "SELECT COUNT(*) FROM incident WHERE node = ? AND opened_ns >= ?", (node, since_ns)
        )
        return int(rows[0][0])

    def incident_counts_since(self, since_ns: int) -> dict[str, int]:
        """Incidents opened since then, per node (the lemon-node flag of every node at once)."""
        rows = self.db.execute(
            "SELECT node, COUNT(*) FROM incident WHERE opened_ns >= ? GROUP BY node", (since_ns,)
        )
        return {str(node): int(n) for node, n in rows}

    # --- audit ------------------------------------------------------------------------------
    def audit(self, record: AuditRecord) -> None:
        with self._write(f"{record.action} {record.node or 'the fleet'}: {record.outcome}"):
            self.db.execute(
                "INSERT INTO audit (time_ns, actor, node, action, reason, outcome, incident_id) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    record.time_ns,
                    record.actor,
                    record.node,
                    record.action,
                    record.reason,
                    str(record.outcome),
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
        return [AuditRecord.from_row(row) for row in reversed(self.db.execute(sql, args))]

    def audit_after(self, seq: int, limit: int = 1000) -> list[tuple[int, AuditRecord]]:
        """(seq, record) of the audit rows after seq, oldest first: a reader that keeps the last
        seq it handled reads each row once (the history export, aggregator/fleet/export.py)."""
        rows = self.db.execute(
            "SELECT seq, time_ns, actor, node, action, reason, outcome, incident_id FROM audit "
            "WHERE seq > ? ORDER BY seq LIMIT ?",
            (seq, limit),
        )
        return [(int(row[0]), AuditRecord.from_row(row[1:])) for row in rows]

    # --- the action ledger ---------------------------------------------------------------------
    def begin_action(self, key: str) -> bool:
        """Record that an action is about to be carried out. False if it was begun before (by
        this or an earlier aggregator process, or another replica): the caller must not do it again."""
        with self._write(f"begin action {key}"):
            rows = self.db.execute(
                "INSERT INTO action VALUES (?, ?, NULL) ON CONFLICT (key) DO NOTHING RETURNING key",
                (key, time.time_ns()),
            )
        return bool(rows)

    def finish_action(self, key: str, outcome: Outcome) -> None:
        with self._write(f"finish action {key}"):
            self.db.execute("UPDATE action SET outcome = ? WHERE key = ?", (str(outcome), key))

    def action_outcome(self, key: str) -> Outcome | None:
        """None: not begun; STARTED: begun, its outcome not known yet (or never learned: the
        aggregator died meanwhile); else what became of it."""
        rows = self.db.execute("SELECT outcome FROM action WHERE key = ?", (key,))
        if not rows:
            return None
        return Outcome.parse(rows[0][0]) if rows[0][0] else STARTED

    # --- persistence windows ---------------------------------------------------------------------
    # --- alert delivery (repair/alerts/dispatcher.py) ------------------------------------------
    # --- small values (the breaker) ---------------------------------------------------------------


def open_state(
    url: str,
    sqlite_path: str = "",
    connect_timeout_s: float = 10.0,
    migrate: bool = True,
    call_timeout_s: float = 10.0,
    application_name: str = "gpufleet",
) -> RepairState:
    """The control-plane store a URL names: postgresql://... (replicas), or "sqlite" (one box,
    at sqlite_path). Migrations are applied unless migrate is False. With PostgreSQL, no call
    waits longer than call_timeout_s for an answer (repair/state_postgres.py), and the session
    shows in pg_stat_activity as application_name unless the URL names one."""
    if url.startswith(("postgresql://", "postgres://")):
        try:
            from gpufleet.repair.state_postgres import postgres_state
        except ImportError as exc:
            raise StateError(
                f"control plane {redact(url)} needs psycopg: pip install 'gpufleet[postgresql]' ({exc})"
            ) from exc

        state = postgres_state(url, connect_timeout_s, call_timeout_s, application_name)
    elif url in ("", "sqlite"):
        from gpufleet.repair.state_sqlite import sqlite_state

        state = sqlite_state(sqlite_path)
    else:
        raise ValueError(f"control plane {url!r}: use sqlite or a postgresql://user@host/db URL")
    if migrate:
        state.migrate()
    return state
