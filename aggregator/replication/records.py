"""The replication contract on the control-plane store (docs/architecture.md "Control plane and
replicas"): the repair leader's lease, replica heartbeats, every node's live summary as the
replica holding its stream last wrote it, and commands on their way to a node's stream with
their results. Only this aggregator's replication uses it (control_plane.py); the repair
library's memory is repair/state.py, whose connection, transactions, fencing and clock this
runs on, in the same SQL on SQLite and PostgreSQL (one contract test suite runs both)."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from gpufleet.repair.state import LiveRow, QueuedCommand, RepairState, ReplicaInfo

LIVE_READ_OVERLAP = 3  # reads of the live view each read looks back over (LiveViewCursor)


class LiveViewCursor:
    """Where a replica's next read of the shared live view starts.

    A row's version is drawn when its write runs (a PostgreSQL sequence) and seen when the
    write commits, so two replicas writing at once can commit out of version order: a reader
    that saw version 101 and then read only past it would miss the 100 that committed a moment
    later, until its next full read (FULL_SYNC_EVERY reads: seconds). Under load (two cores,
    three replicas) a node new to the fleet was missing from one replica's ListNodes for that
    long. So each read starts at the newest version seen `overlap` reads ago: a write that
    commits up to that many reads late is still read. A row read again after it was taken is
    not taken again (`taken`, `took`); one the view refused (this replica held the node) is
    offered again."""

    def __init__(self, overlap: int = LIVE_READ_OVERLAP) -> None:
        self._newest: deque[int] = deque([0], maxlen=max(1, overlap) + 1)
        self._applied: dict[str, int] = {}  # node -> the version of its row last taken

    def after(self) -> int:
        """The version this read starts after."""
        return self._newest[0]

    def read(self, rows: Iterable[LiveRow]) -> None:
        """A read returned these rows (every one, applied or not)."""
        self._newest.append(max([self._newest[-1], *(r.version for r in rows)]))

    def taken(self, row: LiveRow) -> bool:
        """Whether this row, at this version or a later one, was applied already."""
        return self._applied.get(row.node, 0) >= row.version

    def took(self, row: LiveRow) -> None:
        self._applied[row.node] = max(self._applied.get(row.node, 0), row.version)


class ReplicaRecords:
    def __init__(self, state: RepairState) -> None:
        self.state = state  # a leader's fenced view: queue_command is refused once it is deposed

    def acquire_lease(self, holder: str, lease_s: float) -> int | None:
        """Take the lease if it is free, expired or this holder's own (a restarted process
        with the same replica id): the new epoch this holder leads with, or None if another
        holds it. Every acquisition is a new epoch, so whatever an earlier process of the same
        name still tries to write carries an old one and is refused. Keep it with renew_lease."""
        with self.state.db.transaction(lock_lease=True):
            cur_holder, epoch, expires_ns, now_ns = self.state.db.read_lease_for_share()
            if cur_holder and cur_holder != holder and expires_ns > now_ns:
                return None
            self.state.db.execute(
                "UPDATE leader_lease SET holder = ?, epoch = ?, expires_ns = ? WHERE id = 1",
                (holder, epoch + 1, now_ns + int(lease_s * 1e9)),
            )
            return int(epoch + 1)

    def renew_lease(self, holder: str, epoch: int, lease_s: float) -> bool:
        """Extend this holder's lease; False if it has lost it (expired and taken, or newer)."""
        with self.state.db.transaction(lock_lease=True):
            cur_holder, cur_epoch, expires_ns, now_ns = self.state.db.read_lease_for_share()
            if cur_holder != holder or cur_epoch != epoch or expires_ns <= now_ns:
                return False
            self.state.db.execute(
                "UPDATE leader_lease SET expires_ns = ? WHERE id = 1", (now_ns + int(lease_s * 1e9),)
            )
            return True

    def release_lease(self, holder: str, epoch: int) -> None:
        """Give the lease up at once (a clean stop): another replica need not wait it out."""
        with self.state.db.transaction(lock_lease=True):
            cur_holder, cur_epoch, _, now_ns = self.state.db.read_lease_for_share()
            if cur_holder == holder and cur_epoch == epoch:
                self.state.db.execute("UPDATE leader_lease SET expires_ns = ? WHERE id = 1", (now_ns,))

    # --- replicas -------------------------------------------------------------------------
    def heartbeat(self, replica: str, info: dict[str, Any]) -> None:
        self.state.db.execute(
            "INSERT INTO replica VALUES (?, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET info = excluded.info, heard_ns = excluded.heard_ns",
            (replica, json.dumps(info), self.state.db.store_now_ns()),
        )

    def replicas(self, max_age_s: float = 3600.0) -> list[ReplicaInfo]:
        now = self.state.db.store_now_ns()
        rows = self.state.db.execute(
            "SELECT id, info, heard_ns FROM replica WHERE heard_ns >= ? ORDER BY id",
            (now - int(max_age_s * 1e9),),
        )
        return [ReplicaInfo(r, json.loads(i), int(h), (now - int(h)) / 1e9) for r, i, h in rows]

    def forget_replica(self, replica: str) -> None:
        self.state.db.execute("DELETE FROM replica WHERE id = ?", (replica,))

    # --- the shared live view ----------------------------------------------------------------
    def put_live(self, replica: str, rows: Sequence[tuple[str, int, bool, bytes]]) -> None:
        """(node, heard_ns, connected, NodeDetail bytes) of the nodes this replica heard from.
        A row is taken unless another replica has heard the node more recently: a replica that
        lost a node's stream never overwrites the one that holds it now."""
        if not rows:
            return
        self.state.db.execute_many(
            "INSERT INTO node_live (node, replica, heard_ns, connected, version, body) "
            f"VALUES (?, ?, ?, ?, {self.state.db.next_version_sql()}, ?) "
            "ON CONFLICT (node) DO UPDATE SET replica = excluded.replica, "
            "heard_ns = excluded.heard_ns, connected = excluded.connected, "
            "version = excluded.version, body = excluded.body "
            "WHERE excluded.heard_ns >= node_live.heard_ns OR node_live.replica = excluded.replica",
            [(node, replica, heard_ns, bool(connected), body) for node, heard_ns, connected, body in rows],
        )

    def live_rows(self, after_version: int = 0) -> list[LiveRow]:
        rows = self.state.db.execute(
            "SELECT node, replica, heard_ns, connected, version, body FROM node_live "
            "WHERE version > ? ORDER BY version",
            (after_version,),
        )
        return [LiveRow(n, r, int(h), bool(c), int(v), bytes(b)) for n, r, h, c, v, b in rows]

    # --- commands for a node's stream ---------------------------------------------------------
    def queue_command(self, node: str, command_id: str, body: bytes) -> None:
        """A command (GPU reset) for the replica that holds the node's stream to send. Fenced:
        only the leader queues one. Queuing the same id twice is a no-op."""
        with self.state.fenced_write(f"queue command {command_id} for {node}"):
            self.state.db.execute(
                "INSERT INTO command (node, command_id, body, epoch, taken_by, queued_ns) "
                "VALUES (?, ?, ?, ?, '', ?) ON CONFLICT (command_id) DO NOTHING",
                (node, command_id, body, self.state.epoch or 0, self.state.db.store_now_ns()),
            )

    def take_commands(
        self, replica: str, nodes: Sequence[str], max_age_s: float = 600.0
    ) -> list[QueuedCommand]:
        """Commands not yet taken for these nodes (the streams this replica holds), marked taken
        by it in the same transaction: one replica sends each command once. Only commands queued
        under the lease's current epoch are taken. A command older than max_age_s is never sent
        (its step has timed out: a GPU reset long after the controller stopped waiting for it
        would surprise everyone)."""
        if not nodes:
            return []
        taken = []
        with self.state.db.transaction():
            # Only commands of the leader that holds the lease now: a command a deposed leader
            # queued (or a row written into the table by anything else) is never relayed.
            rows = self.state.db.execute(
                "SELECT seq, node, command_id, body, epoch FROM command "
                "WHERE taken_by = '' AND queued_ns >= ? "
                "AND epoch = (SELECT epoch FROM leader_lease WHERE id = 1) "
                "ORDER BY seq",
                (self.state.db.store_now_ns() - int(max_age_s * 1e9),),
            )
            wanted = set(nodes)
            for seq, node, command_id, body, epoch in rows:
                if node in wanted:
                    done = self.state.db.execute(
                        "UPDATE command SET taken_by = ? WHERE seq = ? AND taken_by = '' RETURNING seq",
                        (replica, seq),
                    )
                    if done:
                        taken.append(QueuedCommand(int(seq), node, command_id, bytes(body), int(epoch)))
        return taken

    def put_command_result(self, node: str, command_id: str, body: bytes) -> None:
        self.state.db.execute(
            "INSERT INTO command_result (node, command_id, body) VALUES (?, ?, ?) "
            "ON CONFLICT (command_id) DO NOTHING",
            (node, command_id, body),
        )

    def command_results(self, after_seq: int = 0) -> list[tuple[int, str, bytes]]:
        """(seq, node, CommandResult bytes) written since after_seq, oldest first."""
        rows = self.state.db.execute(
            "SELECT seq, node, body FROM command_result WHERE seq > ? ORDER BY seq", (after_seq,)
        )
        return [(int(s), n, bytes(b)) for s, n, b in rows]

    def last_command_result_seq(self) -> int:
        return int(self.state.db.execute("SELECT COALESCE(MAX(seq), 0) FROM command_result")[0][0])
