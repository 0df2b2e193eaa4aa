"""The control-plane state contract (repair/state.py), run on both implementations: SQLite
(one box) and a real PostgreSQL started by the tests (tests/harness/pg.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.aggregator.replication.records import LiveViewCursor
from gpufleet.aggregator.replication.records import ReplicaRecords as R
from gpufleet.repair.migrations import MIGRATIONS
from gpufleet.repair.model import Finding
from gpufleet.repair.outcome import OK, STARTED, Outcome, Status, failed, repaired
from gpufleet.repair.state import AuditRecord, Fenced, RepairState, StateError, Workflow, open_state
from harness.waiting import wait_until


@pytest.fixture(params=["sqlite", "postgresql"])
def make_state(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A factory: every call opens another connection to the same control-plane store (as
    another replica would)."""
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else "sqlite"
    opened: list[RepairState] = []

    def make() -> RepairState:
        state = open_state(url, str(tmp_path / "repair.sqlite3"))
        opened.append(state)
        return state

    yield make
    for s in opened:
        s.close()


def test_migrations_are_versioned_and_applied_once(make_state: Any) -> None:
    state = make_state()
    assert state.schema_version() == MIGRATIONS[-1].version
    assert state.pending_migrations() == []
    assert state.migrate() == []  # a second start applies nothing
    assert make_state().migrate() == []


def test_workflows_incidents_audit_and_ledger_round_trip(make_state: Any) -> None:
    state = make_state()
    wf = Workflow("n1", state="cordoned", ladder=["reset_gpu", "reboot"], gpus=[3], cordoned_by_us=True)
    state.save(wf)
    wf.step = 1
    state.save(wf)
    other = make_state()  # what another replica reads
    assert other.workflows() == {"n1": wf}

    finding = Finding("n1", 3, "xid_79", "critical", "reset_gpu", True, "fell off the bus", "XID 79")
    incident = state.open_incident("n1", [finding], "suspect")
    incident.closed_ns, incident.outcome = 5, repaired("reset_gpu")
    state.put_incident(incident)
    got = other.incident(incident.id)
    assert got is not None and got.outcome == repaired("reset_gpu") and got.findings[0].gpu == 3
    assert [i.id for i in other.incidents(node="n1")] == [incident.id]
    assert other.incidents(open_only=True) == []
    assert other.incidents_since("n1", 0) == 1

    for i in range(3):
        state.audit(AuditRecord(i, "automation", "n1", "cordon", f"r{i}", OK, incident.id))
    state.audit(AuditRecord(9, "ops", "n2", "cordon", "by hand", failed("the scheduler said no")))
    assert other.audit_log(node="n2")[0].outcome == Outcome(Status.FAILED, "the scheduler said no")
    assert [a.reason for a in other.audit_log(node="n1")] == ["r0", "r1", "r2"]  # oldest first
    assert [a.reason for a in other.audit_log(limit=2)] == ["r2", "by hand"]

    assert state.begin_action("inc:0:reset_gpu") is True
    assert other.begin_action("inc:0:reset_gpu") is False  # begun by another: never twice
    assert other.action_outcome("inc:0:reset_gpu") == STARTED  # begun, its outcome not known yet
    state.finish_action("inc:0:reset_gpu", OK)
    assert other.action_outcome("inc:0:reset_gpu") == OK
    assert other.action_outcome("never") is None


def test_windows_alerts_and_breaker_values(make_state: Any) -> None:
    state = make_state()
    state.kept.put_first_seen("n1", [], {("n1", 2, "ecc"): 10, ("n1", None, "silent"): 20})
    state.kept.put_first_seen("n1", [("n1", None, "silent")], {("n1", 2, "ecc"): 11})
    assert make_state().kept.first_seen() == {("n1", 2, "ecc"): 11}

    state.kept.put_alert_identity("inc-1", "firing", "{}")
    state.kept.put_alert_identity("inc-1", "sent", "{}")
    state.kept.put_alert_identity("inc-2", "held", "{}")
    state.kept.drop_alert_identity("inc-2")
    assert make_state().kept.alert_identities() == [("inc-1", "sent", "{}")]
    a, b = state.kept.queue_alert("slack", "a"), state.kept.queue_alert("hook", "b")
    state.kept.finish_alert(a, OK)
    assert make_state().kept.queued_alerts() == [(b, "hook", "b")]

    state.kept.put("breaker", '{"tripped": true}')
    state.kept.put("breaker", '{"tripped": false}')
    assert make_state().kept.get("breaker") == '{"tripped": false}'
    assert state.kept.get("missing") is None


def test_one_leader_at_a_time_and_a_new_epoch_on_takeover(make_state: Any) -> None:
    a, b = make_state(), make_state()
    assert a.lease().holder == ""
    epoch = R(a).acquire_lease("replica-a", 0.5)
    assert epoch == 1
    assert R(b).acquire_lease("replica-b", 0.5) is None  # held
    assert R(a).renew_lease("replica-a", 1, 0.5)  # renewing keeps the epoch
    assert R(a).acquire_lease("replica-a", 0.5) == 2  # a restart under the same name: a new one
    assert not R(a).renew_lease("replica-a", 1, 0.5)  # and the old epoch cannot renew
    assert b.lease().holder == "replica-a" and b.lease().live

    deadline = time.monotonic() + 10
    while (taken := R(b).acquire_lease("replica-b", 30)) is None:  # once a's lease runs out
        assert time.monotonic() < deadline, "the lease never expired"
        time.sleep(0.05)
    assert taken == 3
    assert not R(a).renew_lease("replica-a", 2, 30)  # the old leader learns it has lost it
    R(b).release_lease("replica-b", 3)
    assert not b.lease().live
    assert R(a).acquire_lease("replica-a", 30) == 4


def test_a_deposed_leaders_writes_are_refused_and_audited(make_state: Any) -> None:
    a, b = make_state(), make_state()
    old = R(a).acquire_lease("replica-a", 0.2)
    assert old is not None
    leader_a = a.fenced("replica-a", old)
    leader_a.save(Workflow("n1", state="cordoned"))  # while it leads, it writes
    deadline = time.monotonic() + 10
    while (new := R(b).acquire_lease("replica-b", 30)) is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    leader_b = b.fenced("replica-b", new)

    for write in (
        lambda: leader_a.save(Workflow("n1", state="healthy")),
        lambda: leader_a.begin_action("inc:0:reset_gpu"),
        lambda: leader_a.audit(AuditRecord(1, "automation", "n1", "uncordon", "clean", STARTED)),
        lambda: leader_a.kept.put("breaker", "{}"),
        lambda: R(leader_a).queue_command("n1", "inc:0:reset_gpu#3", b"x"),
        lambda: leader_a.check_fence("a repair pass"),
    ):
        with pytest.raises(Fenced, match="epoch 1"):
            write()
    assert b.workflows()["n1"].state == "cordoned"  # none of it took effect
    assert b.action_outcome("inc:0:reset_gpu") is None
    assert b.kept.get("breaker") is None
    assert R(b).take_commands("replica-b", ["n1"]) == []
    refusals = [r for r in b.audit_log() if r.action == "fenced"]
    assert len(refusals) == 6
    assert refusals[0].actor == "replica-a (epoch 1)"
    assert refusals[0].outcome.status is Status.REFUSED
    assert "held by replica-b with epoch 2" in refusals[0].outcome.detail
    assert not [r for r in b.audit_log() if r.action == "uncordon"]
    leader_b.save(Workflow("n1", state="validating"))  # the new leader's writes go through
    assert a.workflows()["n1"].state == "validating"


def test_an_expired_lease_fences_even_before_anyone_takes_over(make_state: Any) -> None:
    a = make_state()
    epoch = R(a).acquire_lease("replica-a", 0.1)
    assert epoch is not None
    leader = a.fenced("replica-a", epoch)
    deadline = time.monotonic() + 10
    while a.lease().live:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with pytest.raises(Fenced, match="expired"):
        leader.save(Workflow("n1"))


def test_live_view_rows_only_move_forward(make_state: Any) -> None:
    a, b = make_state(), make_state()
    R(a).put_live("replica-a", [("n1", 100, True, b"a1"), ("n2", 100, True, b"a2")])
    rows = R(b).live_rows()
    assert {(r.node, r.replica, r.body) for r in rows} == {
        ("n1", "replica-a", b"a1"),
        ("n2", "replica-a", b"a2"),
    }
    cursor = max(r.version for r in rows)
    R(b).put_live("replica-b", [("n1", 200, True, b"b1")])  # n1's collector moved to replica-b
    R(a).put_live("replica-a", [("n1", 150, False, b"a1-disconnected")])  # a's late news of it
    changed = R(a).live_rows(after_version=cursor)
    assert [(r.node, r.replica, r.heard_ns, r.connected, r.body) for r in changed] == [
        ("n1", "replica-b", 200, True, b"b1")
    ]
    R(b).put_live("replica-b", [("n1", 190, False, b"b1-gone")])  # the holder's own row: always
    assert {r.node: r.body for r in R(a).live_rows()}["n1"] == b"b1-gone"


def test_a_live_row_committed_after_a_later_one_is_still_read(pg_url: str, tmp_path: Path) -> None:
    """Replica A's write of node-new draws its version first and commits last (its transaction
    held open here, as a descheduled process holds it under load); replica B's later version
    commits first and a reader reads past it. Reading only past the newest version seen, the
    reader would not list node-new until its next full read; the cursor's look-back reads it at
    the next read, and a row read twice is taken once."""
    a, b, reader = (open_state(pg_url, str(tmp_path / "unused.sqlite3")) for _ in range(3))
    try:
        cursor = LiveViewCursor(overlap=2)
        with a.db.transaction():
            R(a).put_live("replica-a", [("node-new", 100, True, b"a")])  # version drawn, not committed
            R(b).put_live("replica-b", [("node-old", 100, True, b"b")])  # a later version, committed
            first = R(reader).live_rows(cursor.after())
            cursor.read(first)
            assert [r.node for r in first] == ["node-old"]
            assert R(reader).live_rows(max(r.version for r in first)) == [], "past the newest: missed"
        second = R(reader).live_rows(cursor.after())
        cursor.read(second)
        assert "node-new" in [r.node for r in second]
        for row in first:
            cursor.took(row)
        assert [r.node for r in second if not cursor.taken(r)] == ["node-new"], "node-old taken twice"
    finally:
        for s in (a, b, reader):
            s.close()


def test_commands_go_to_one_replica_once_and_results_come_back(make_state: Any) -> None:
    a, b, c = make_state(), make_state(), make_state()
    epoch = R(a).acquire_lease("leader", 30)
    assert epoch is not None
    leader = a.fenced("leader", epoch)
    R(leader).queue_command("n1", "inc:0:reset_gpu#3", b"reset-3")
    R(leader).queue_command("n1", "inc:0:reset_gpu#3", b"reset-3")  # queued twice: once
    R(leader).queue_command("n2", "inc:1:reset_gpu#0", b"reset-0")
    assert R(c).take_commands("replica-c", ["n9"]) == []
    assert R(c).take_commands("replica-c", ["n1"], max_age_s=0) == []  # too old to send: never taken
    got: list[Any] = []
    threads = [
        threading.Thread(target=lambda s=s, name=name: got.extend(R(s).take_commands(name, ["n1", "n2"])))
        for s, name in ((b, "replica-b"), (c, "replica-c"))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(q.command_id for q in got) == ["inc:0:reset_gpu#3", "inc:1:reset_gpu#0"]
    assert all(q.epoch == epoch for q in got)
    first = R(a).last_command_result_seq()
    R(b).put_command_result("n1", "inc:0:reset_gpu#3", b"ok")
    R(b).put_command_result("n1", "inc:0:reset_gpu#3", b"ok")  # a retried write: once
    assert [(n, body) for _, n, body in R(a).command_results(first)] == [("n1", b"ok")]


def test_replicas_relay_only_commands_of_the_current_leader(make_state: Any) -> None:
    """A command a deposed leader queued (or any row put in the table under another epoch) is
    never sent to a node: replicas take only what the lease's current epoch queued."""
    a, b = make_state(), make_state()
    old = R(a).acquire_lease("leader-a", 0.2)
    assert old is not None
    R(a.fenced("leader-a", old)).queue_command("n1", "inc:0:reset_gpu#3~old", b"old")
    wait_until(lambda: not b.lease().live, 5, "the first leader's lease to run out")
    new = R(b).acquire_lease("leader-b", 30)
    assert new == old + 1
    R(b.fenced("leader-b", new)).queue_command("n1", "inc:1:reset_gpu#3~new", b"new")
    assert [q.command_id for q in R(b).take_commands("replica-c", ["n1"])] == ["inc:1:reset_gpu#3~new"]
    assert R(b).take_commands("replica-c", ["n1"]) == []


def test_collector_tokens_are_revoked_by_id_on_every_replica(make_state: Any) -> None:
    a, b = make_state(), make_state()
    assert a.kept.revoke_collector_token("0123abcd", "gpu-7", "alice", "host reimaged") is True
    assert a.kept.revoke_collector_token("0123abcd", "gpu-7", "alice", "again") is False  # once
    assert b.kept.revoked_collector_tokens() == {"0123abcd"}
    (entry,) = [e for e in b.audit_log("gpu-7", 10) if e.action == "revoke_token"]
    assert (entry.actor, entry.reason) == ("alice", "token 0123abcd: host reimaged")


def test_replicas_heartbeat(make_state: Any) -> None:
    a = make_state()
    R(a).heartbeat("replica-a", {"fleet": "10.0.0.1:7711", "streams": 3})
    R(a).heartbeat("replica-b", {"fleet": "10.0.0.2:7711", "streams": 0})
    R(a).heartbeat("replica-a", {"fleet": "10.0.0.1:7711", "streams": 4})
    got = R(make_state()).replicas()
    assert [(r.replica, r.info["streams"]) for r in got] == [("replica-a", 4), ("replica-b", 0)]
    assert all(r.age_s < 60 for r in got)
    R(a).forget_replica("replica-b")
    assert [r.replica for r in R(a).replicas()] == ["replica-a"]


def test_racing_replicas_elect_exactly_one_leader_per_epoch(make_state: Any) -> None:
    states = [make_state() for _ in range(4)]
    wins: list[tuple[str, int | None]] = []
    barrier = threading.Barrier(len(states))

    def contend(i: int) -> None:
        barrier.wait()
        wins.append((f"r{i}", R(states[i]).acquire_lease(f"r{i}", 30)))

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(len(states))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    leaders = [(who, e) for who, e in wins if e is not None]
    assert len(leaders) == 1 and leaders[0][1] == 1
    assert states[0].lease().holder == leaders[0][0]


def test_postgres_down_is_a_clear_error_and_the_connection_comes_back() -> None:
    from harness.pg import PostgresServer

    server = PostgresServer()
    server.start()
    try:
        url = server.new_database()
        state = open_state(url)
        state.save(Workflow("n1"))
        server.stop()
        with pytest.raises(
            StateError, match=r"control-plane PostgreSQL postgresql://postgres:\*\*\*@127.0.0.1"
        ):
            state.workflows()
        server.start()
        assert set(state.workflows()) == {"n1"}  # the next call connects again
        with pytest.raises(StateError, match="password authentication failed"):
            open_state(url.replace("gpufleet-test-password", "wrong"))
    finally:
        server.cleanup()


def test_a_repair_state_file_from_before_migrations_is_upgraded_in_place(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "repair.sqlite3"
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE workflow (node TEXT PRIMARY KEY, body TEXT NOT NULL);"
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "CREATE TABLE audit (seq INTEGER PRIMARY KEY AUTOINCREMENT, time_ns INTEGER NOT NULL,"
        " actor TEXT NOT NULL, node TEXT NOT NULL, action TEXT NOT NULL, reason TEXT NOT NULL,"
        " outcome TEXT NOT NULL,"
        " incident_id TEXT NOT NULL);"
        """INSERT INTO workflow VALUES ('n1', '{"node": "n1", "state": "quarantined"}');"""
        """INSERT INTO meta VALUES ('breaker', '{"tripped": true}');"""
    )
    old.commit()
    old.close()
    state = open_state("sqlite", str(path))
    assert state.schema_version() == MIGRATIONS[-1].version
    assert state.workflows()["n1"].state == "quarantined"
    assert state.kept.get("breaker") == '{"tripped": true}'
    state.close()


def test_db_migrate_and_status_from_the_command_line(pg_url: str, tmp_path: Path) -> None:
    import subprocess

    from harness.processes import gpufleet_argv

    def db(*args: str) -> subprocess.CompletedProcess[str]:
        flags = ("--control-plane", pg_url, "--store", "influxdb", "--data-dir", str(tmp_path))
        return subprocess.run(gpufleet_argv("db", *args, *flags), capture_output=True, text=True, timeout=60)

    before = db("status")
    assert before.returncode == 1 and "schema version 0 of" in before.stdout and "pending 2" in before.stdout
    assert "gpufleet-test-password" not in before.stdout  # the URL is shown without its password
    migrated = db("migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert f"schema at version {MIGRATIONS[-1].version} ({len(MIGRATIONS)} applied now)" in migrated.stdout
    again = db("migrate")
    assert "(0 applied now)" in again.stdout
    assert db("status").returncode == 0
    wrong = subprocess.run(
        gpufleet_argv(
            "db",
            "status",
            "--control-plane",
            pg_url.replace("test-password", "nope"),
            "--store",
            "influxdb",
            "--data-dir",
            str(tmp_path),
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert wrong.returncode == 2 and "password authentication failed" in wrong.stderr


def test_a_leader_paused_inside_a_transaction_does_not_block_a_takeover(pg_url: str) -> None:
    """A replica SIGSTOPped between two statements of a fenced write holds the lease row's
    lock: the server ends its session (idle_in_transaction_session_timeout), so the lease
    can still move, and the paused replica's transaction never commits."""
    from gpufleet.repair.state_postgres import postgres_state

    paused, other = (
        postgres_state(pg_url, connect_timeout_s=1.0),
        postgres_state(pg_url, connect_timeout_s=1.0),
    )
    paused.migrate()
    epoch = R(paused).acquire_lease("replica-a", 0.5)
    assert epoch is not None
    leader = paused.fenced("replica-a", epoch)
    taken = None
    with pytest.raises(StateError, match=r"idle-in-transaction|terminat|closed"), paused.db.transaction():
        leader.db.read_lease_for_share()  # the shared lock a fenced write takes first
        deadline = time.monotonic() + 20
        while taken is None:
            assert time.monotonic() < deadline, "the takeover waited on the paused session's lock"
            try:
                taken = R(other).acquire_lease("replica-b", 30)
            except StateError:  # lock_timeout: the row is still locked; try again
                continue
        paused.db.execute("INSERT INTO meta VALUES ('written-by-a', 'x')")
    assert taken == epoch + 1
    assert other.kept.get("written-by-a") is None
    paused.close()
    other.close()
