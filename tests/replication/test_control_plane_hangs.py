"""Replicas when the control plane hangs (docs/architecture.md "When the control plane hangs"):
a PostgreSQL that stops answering — every server process SIGSTOPped, or its port blackholed
by a proxy that holds every byte — never stops ingest, acks or the Fleet API; the repair
leader stops acting before its lease can run out and nothing acts while the store hangs; a
takeover stays within the lease plus one round; a collector leaves a replica that stopped
acknowledging. Real processes: replicas, PostgreSQL, influxd, collectors."""

from __future__ import annotations

import statistics
import time
import zlib
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gpufleet.aggregator.replication.leadership import LEASE_TRUST
from gpufleet.protos import fleet_pb2
from gpufleet.repair.state import RepairState, StateError
from gpufleet.repair.state_postgres import postgres_state
from harness.influx import influx_flags
from harness.pg import sessions_report
from harness.processes import AggregatorHandle, Cluster
from harness.repair import audit
from harness.replicas import ECC_FAULT, LEASE_S, Fleet, replica
from harness.stored import influx_seqs
from harness.streams import HealthyNode
from harness.tcp_proxy import BlackholeProxy
from harness.waiting import wait_until

HANG_S = 20.0
RENEWAL_S = LEASE_S / 3  # a leader renews every third of its lease


def via(proxy: BlackholeProxy, url: str) -> str:
    """The database URL with its port replaced by the proxy's."""
    head, _, tail = url.rpartition("@")
    _, _, database = tail.partition("/")
    return f"{head}@127.0.0.1:{proxy.port}/{database}"


def upstream(url: str) -> tuple[str, int]:
    host, _, port = url.rpartition("@")[2].partition("/")[0].rpartition(":")
    return host, int(port)


@pytest.fixture
def proxy(pg_url: str) -> Iterator[BlackholeProxy]:
    p = BlackholeProxy(upstream(pg_url))
    try:
        yield p
    finally:
        p.close()


def test_a_call_to_a_hung_server_ends_within_its_timeout_and_the_next_at_once(
    pg_url: str, proxy: BlackholeProxy
) -> None:
    state = postgres_state(via(proxy, pg_url), connect_timeout_s=1.0, call_timeout_s=0.5)
    state.migrate()
    state.kept.put("answer", "42")
    proxy.hang()
    try:
        began = time.monotonic()
        with pytest.raises(StateError, match=r"no answer within 0\.5 s"):
            state.kept.get("answer")
        assert time.monotonic() - began < 1.5
        assert state.db.call_timeouts_total == 1
        for _ in range(5):  # while the new connection hangs, calls do not wait for it
            began = time.monotonic()
            with pytest.raises(StateError, match="no connection yet"):
                state.kept.get("answer")
            assert time.monotonic() - began < 0.5
    finally:
        proxy.resume()

    def answers() -> str | None:
        try:
            return state.kept.get("answer")
        except StateError:
            return None

    assert wait_until(answers, 20, "the state answering again after the hang") == "42"
    state.close()


def timed_hook_flags(cluster: Cluster, name: str) -> tuple[str, ...]:
    """The hook backend; each replica appends 'node unix-time' per cordon to a file of its own."""
    return (
        "--repair-backend",
        "hook",
        "--repair-hook-cordon",
        f"sh -c 'echo {{node}} $(date +%s.%N) >> {cluster.tmp / f'cordon-{name}.txt'}'",
        "--repair-hook-uncordon",
        "true",
    )


def cordons(cluster: Cluster, *names: str) -> list[tuple[str, float]]:
    out = []
    for name in names:
        path = cluster.tmp / f"cordon-{name}.txt"
        for line in path.read_text().splitlines() if path.exists() else []:
            node, when = line.split()
            out.append((node, float(when)))
    return out


def when(row: dict[str, Any]) -> float:
    """An audit row's time (unix seconds)."""
    return datetime.fromisoformat(row["time"]).timestamp()


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) >= 2 else max(values, default=0.0)


def hang_the_store(how: str, postgres_server: Any, proxy: BlackholeProxy) -> Callable[[], None]:
    """Start the hang; the returned call ends it."""
    if how == "sigstop":
        pids = postgres_server.pause()
        return lambda: postgres_server.resume(pids)
    proxy.hang()
    return proxy.resume


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigstop", "blackhole"])
def test_a_hung_postgresql_stops_no_ingest_and_nothing_acts_while_it_hangs(
    how: str,
    cluster: Cluster,
    pg_url: str,
    postgres_server: Any,
    proxy: BlackholeProxy,
    influxd: str,
) -> None:
    database = f"hang_{time.time_ns()}"
    influx = influx_flags(influxd, database)
    control_plane = pg_url if how == "sigstop" else via(proxy, pg_url)
    fleet = Fleet(cluster)
    a = replica(cluster, "agg-a", control_plane, influx, *timed_hook_flags(cluster, "agg-a"))
    wait_until(lambda: fleet.status(a).repair_leader, 20, "agg-a leading")
    b = replica(cluster, "agg-b", control_plane, influx, *timed_hook_flags(cluster, "agg-b"))
    faulty = "node-faulty"
    (cluster.tmp / "faults.toml").write_text(ECC_FAULT.format(node=faulty).replace("2.0", "3.0"))
    healthy = {
        agg.proc.name: HealthyNode(
            agg.ingest,
            cluster.secrets.collector_token(f"steady-{agg.proc.name}"),
            f"steady-{agg.proc.name}",
            0.2,
        )
        for agg in (a, b)
    }
    wait_until(lambda: all(len(h.latencies_s) > 5 for h in healthy.values()), 30, "steady streams acked")
    for h in healthy.values():
        h.latencies_s.clear()

    hang_began = time.time()
    end_hang = hang_the_store(how, postgres_server, proxy)
    # A GPU that fails while the store hangs (its collector starts now, the fault 3 s later,
    # well inside the hang however slow the set-up was): its cordon waits for the store.
    cluster.collector(
        faulty, a.ingest, "--interval-s", "1", "--sim-scenario", str(cluster.tmp / "faults.toml")
    )
    status_s: list[float] = []
    try:
        # While it hangs: the Fleet API answers on both replicas, and agg-a stops leading
        # before its lease could run out (renewals stop; LEASE_TRUST x lease at most).
        deadline = time.monotonic() + HANG_S
        deposed_after_s = None
        while time.monotonic() < deadline:
            for agg in (a, b):
                began = time.monotonic()
                status = fleet.status(agg)
                status_s.append(time.monotonic() - began)
                if agg is a and not status.repair_leader and deposed_after_s is None:
                    deposed_after_s = time.time() - hang_began
            time.sleep(0.1)  # the polling period of this observer, not synchronisation
    finally:
        end_hang()
    hang_ended = time.time()
    during = {name: list(h.latencies_s) for name, h in healthy.items()}

    # After: a leader again, and the fault that came during the hang is dealt with once.
    wait_until(lambda: fleet.leader([a, b]) is not None, 30, "a repair leader after the hang")
    wait_until(lambda: cordons(cluster, "agg-a", "agg-b"), 60, "the faulty node cordoned after the hang")
    for h in healthy.values():
        h.close()

    for name, latencies in during.items():
        assert len(latencies) > HANG_S / 0.2 / 2, f"{name}: only {len(latencies)} reports acked in the hang"
        assert p99(latencies) < 2.0, f"{name}: ack p99 {p99(latencies):.2f} s during the hang"
        assert not healthy[name].errors, healthy[name].errors
    assert max(status_s) < 2.0, f"GetStatus took {max(status_s):.2f} s during the hang"
    assert deposed_after_s is not None and deposed_after_s < LEASE_S, (
        f"agg-a still led {deposed_after_s} s into the hang (lease {LEASE_S} s)"
    )
    done = cordons(cluster, "agg-a", "agg-b")
    assert [n for n, _ in done] == [faulty], done
    assert all(when > hang_ended for _, when in done), f"a cordon while the store hung: {done}"

    # No term acted that was shorter than one renewal: every action's term lasted past it.
    rows = audit(b, cluster)
    elected = {r["actor"]: r for r in rows if r["action"] == "leader_elected"}
    deposed = {r["actor"]: r for r in rows if r["action"] == "leader_deposed"}
    for actor in {r["actor"] for r in rows if r["action"] == "cordon"}:
        if actor in deposed:
            term_s = when(deposed[actor]) - when(elected[actor])
            assert term_s >= RENEWAL_S, f"{actor} cordoned in a term of {term_s:.2f} s"

    cluster.stop_all()
    seqs = influx_seqs(influxd, database)
    for (node, boot), got in seqs.items():
        assert sorted(got) == list(range(1, max(got) + 1)), f"{node} boot {boot}: gaps or doubles"
    assert {n for n, _ in seqs} >= {faulty, "steady-agg-a", "steady-agg-b"}
    print(
        f"\n{how}: {HANG_S:.0f} s hang; ack p99 "
        + ", ".join(f"{n} {p99(v) * 1000:.0f} ms ({len(v)} acks)" for n, v in during.items())
        + f"; GetStatus worst {max(status_s) * 1000:.0f} ms; agg-a stepped down after {deposed_after_s:.2f} s"
    )


def first_address_is(node: str, first: AggregatorHandle, other: AggregatorHandle) -> str:
    """An --aggregator list whose first pick for this node (crc32(node) % n) is `first`."""
    pair = [first.ingest, other.ingest]
    return ",".join(pair if zlib.crc32(node.encode()) % 2 == 0 else pair[::-1])


def held_by(fleet: Fleet, agg: AggregatorHandle, node: str) -> str:
    listed = fleet.call(agg, "ListNodes", fleet_pb2.ListNodesRequest()).nodes
    return next((n.replica for n in listed if n.node == node and n.connected), "")


@pytest.mark.slow
def test_a_collector_leaves_a_replica_that_stopped_acknowledging(
    cluster: Cluster, pg_url: str, influxd: str, tmp_path: Path
) -> None:
    import signal

    database = f"move_{time.time_ns()}"
    influx = influx_flags(influxd, database)
    fleet = Fleet(cluster)
    a = replica(cluster, "agg-a", pg_url, influx)
    b = replica(cluster, "agg-b", pg_url, influx)
    interval_s = 1.0
    node = "node-moving"
    cluster.collector(node, first_address_is(node, a, b), "--interval-s", str(interval_s))
    wait_until(lambda: held_by(fleet, b, node) == "agg-a", 30, "the node streaming to agg-a")

    a.proc.popen.send_signal(signal.SIGSTOP)
    paused = time.monotonic()
    try:
        wait_until(lambda: held_by(fleet, b, node) == "agg-b", 30, "the node streaming to agg-b")
        moved_s = time.monotonic() - paused
    finally:
        a.proc.popen.send_signal(signal.SIGCONT)
    # ack_timeout_intervals = 2 (the default): the next report, then two intervals without an
    # acknowledgement; the rest is the reconnect and this test's polling.
    assert moved_s <= 3 * interval_s + 1.0, (
        f"moved after {moved_s:.1f} s ({moved_s / interval_s:.1f} intervals)"
    )
    print(f"\nmoved to agg-b {moved_s:.2f} s ({moved_s / interval_s:.1f} intervals) after agg-a was paused")

    cluster.stop_all()
    seqs = influx_seqs(influxd, database)
    (got,) = [v for (n, _), v in seqs.items() if n == node]
    assert sorted(got) == list(range(1, max(got) + 1)), f"gaps or doubles in {got}"


TAKEOVERS = 20
SYNC_S = 0.3  # harness/replicas.py's --live-sync-s
# The follower takes the lease at its first sync after the lease ran out; that sync itself (its
# event loop's turn, a PostgreSQL round trip, the log line) takes time on two cores shared by six
# test workers: one takeover of 20 measured 3.39 s against lease + sync = 3.3 s.
TAKEOVER_TURN_S = 0.15


def _elections(replica_handle: Any) -> list[float]:
    """When (Unix seconds, from its log) the replica became the repair leader, each time."""
    return [
        datetime.fromisoformat(line.split("ts=", 1)[1].split()[0].replace("Z", "+00:00")).timestamp()
        for line in replica_handle.proc.log().splitlines()
        if "this replica is the repair leader now" in line and "ts=" in line
    ]


def _takeovers(cluster: Cluster, pg_url: str, influxd: str, times: int) -> list[float]:
    """The leader paused, `times` times in turn; the seconds until the other replica led."""
    import signal

    influx = influx_flags(influxd)
    fleet = Fleet(cluster)
    a = replica(cluster, "agg-a", pg_url, influx)
    wait_until(lambda: fleet.status(a).repair_leader, 20, "agg-a leading")
    b = replica(cluster, "agg-b", pg_url, influx)
    leader, follower = a, b
    takeovers_s = []
    for _ in range(times):
        seen = len(_elections(follower))
        leader.proc.popen.send_signal(signal.SIGSTOP)
        paused = time.time()
        try:
            try:
                wait_until(
                    lambda f=follower: fleet.status(f).repair_leader, LEASE_S + 10, "the takeover", 0.02
                )
            except AssertionError as exc:
                raise AssertionError(f"{exc}\nthe database's sessions:\n{sessions_report(pg_url)}") from None
            # When the follower took the lease, as it logged it: not when this test's status
            # call, polled on a loaded machine, next heard of it (a six-worker run measured
            # 3.35 s against a bound of 3.3 s that way).
            # (The log line follows the status by a moment: the replica leads, then says so.)
            elected = wait_until(
                lambda f=follower, n=seen: _elections(f)[n:],
                10,
                "the follower's log of its election",
            )
            takeovers_s.append(elected[0] - paused)
        finally:
            leader.proc.popen.send_signal(signal.SIGCONT)
        wait_until(lambda o=leader: not fleet.status(o).repair_leader, 20, "the paused leader stepping down")
        leader, follower = follower, leader
    return takeovers_s


@pytest.mark.slow
def test_takeover_within_the_lease_and_one_sync_every_time(
    cluster: Cluster, pg_url: str, influxd: str
) -> None:
    """The leader paused, TAKEOVERS times in turn: the other replica leads within
    leader_lease_s + one live sync of the pause (the lease was renewed at most then)."""
    takeovers_s = _takeovers(cluster, pg_url, influxd, TAKEOVERS)
    worst = max(takeovers_s)
    print(
        f"\ntakeovers ({TAKEOVERS}, lease {LEASE_S:g} s, sync {SYNC_S:g} s): median "
        f"{statistics.median(takeovers_s):.2f} s, worst {worst:.2f} s"
    )
    assert worst <= LEASE_S + SYNC_S + TAKEOVER_TURN_S, (
        f"a takeover took {worst:.2f} s: {sorted(takeovers_s)}"
    )


SKEWED_TAKEOVERS = 5


@pytest.fixture(params=[3600, -3600], ids=["db-clock-1h-ahead", "db-clock-1h-behind"])
def skewed_pg_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A database on a PostgreSQL whose clock is an hour ahead of, or behind, the replicas'."""
    from harness.pg import PostgresServer

    server = PostgresServer(clock_offset_s=request.param)
    try:
        server.start()
        offset_s = server.now_offset_s()
        assert abs(offset_s - request.param) < 60, f"the server's clock is {offset_s:+.0f} s off, not skewed"
        url = server.new_database()
        # The stand-in keeps what the takeover bound rests on: the server still ends a session
        # left idle in its transaction (a paused leader's) on time with its clock moved.
        idle = psycopg.connect(url, autocommit=True, options="-c idle_in_transaction_session_timeout=200")
        try:
            idle.execute("BEGIN")
            idle.execute("SELECT 1")
            began = time.monotonic()
            with psycopg.connect(url, autocommit=True) as watch:
                wait_until(
                    lambda: (
                        not watch.execute(
                            "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (idle.info.backend_pid,)
                        ).fetchall()
                    ),
                    5,
                    "the skewed server ending a session idle in its transaction",
                )
            assert time.monotonic() - began < 2, "idle_in_transaction_session_timeout fired late"
        finally:
            idle.close()  # ended by the server: closing it only frees the client's side
        yield url
    finally:
        server.cleanup()


@pytest.mark.slow
def test_takeover_bound_holds_with_the_database_clock_an_hour_off(
    cluster: Cluster, skewed_pg_url: str, influxd: str
) -> None:
    """The lease is timed by the database's clock and the replicas compare only durations
    (its time left, less the time since it was read): with PostgreSQL's clock an hour ahead of
    or behind the replicas', a paused leader is still replaced within lease + one sync, and a
    leader that keeps renewing is never replaced (each takeover waits for its pause)."""
    takeovers_s = _takeovers(cluster, skewed_pg_url, influxd, SKEWED_TAKEOVERS)
    print(
        f"\ntakeovers with a skewed database clock ({SKEWED_TAKEOVERS}): "
        f"{', '.join(f'{t:.2f}' for t in takeovers_s)} s"
    )
    # Not early either: the paused leader's lease was renewed at most its trust before the
    # pause, so the lease runs out no sooner than lease x (1 - trust) after it.
    earliest_s = LEASE_S * (1 - LEASE_TRUST) - 0.05
    latest_s = LEASE_S + SYNC_S + TAKEOVER_TURN_S
    assert all(earliest_s <= t <= latest_s for t in takeovers_s), sorted(takeovers_s)


@pytest.mark.slow
def test_a_leader_paused_inside_its_transaction_does_not_hold_the_takeover(skewed_pg_url: str) -> None:
    """The case a SIGSTOP only sometimes hits: the leader stops inside a fenced write, its
    transaction open and the lease row locked for share. The server ends that session after
    idle_in_transaction_session_timeout (half the lease), so the other replica still takes the
    lease once it runs out, not when the paused process wakes; the woken writer's commit fails.
    With the database's clock an hour ahead and behind (the timeout is the server's own timer)."""
    import threading

    from gpufleet.aggregator.replication.records import ReplicaRecords

    lease_s = 3.0

    def open_replica() -> RepairState:
        return postgres_state(skewed_pg_url, connect_timeout_s=lease_s / 2, call_timeout_s=lease_s / 4)

    leader, follower = open_replica(), open_replica()
    leader.migrate()
    epoch = ReplicaRecords(leader).acquire_lease("agg-a", lease_s)
    runs_out = time.monotonic() + lease_s  # no earlier than this the lease has run out
    assert epoch is not None
    fenced = leader.fenced("agg-a", epoch)
    inside, wake = threading.Event(), threading.Event()
    woke_with: list[BaseException] = []

    def paused_writer() -> None:
        try:
            with fenced.fenced_write("a write the leader paused in"):
                inside.set()
                wake.wait(30)  # paused: the session sits idle in its transaction, the row locked
        except BaseException as exc:  # what the leader sees when it wakes
            woke_with.append(exc)

    writer = threading.Thread(target=paused_writer, daemon=True)
    writer.start()
    assert inside.wait(10), "the leader's write never began"
    paused = time.monotonic()
    records = ReplicaRecords(follower)

    attempts: list[tuple[float, bool]] = []  # (when an attempt began, whether it took the lease)

    def took_over() -> int | None:
        began = time.monotonic()
        try:
            got = records.acquire_lease("agg-b", lease_s)
        except StateError:
            got = None  # the row still locked: lock_timeout, or no answer in time
        attempts.append((began, got is not None))
        return got

    new_epoch = wait_until(took_over, 20, "agg-b taking the lease", 0.02)
    took_s = time.monotonic() - paused
    wake.set()
    writer.join(10)
    assert new_epoch == epoch + 1
    # Held by the paused transaction, no attempt would take it until the leader woke (20 s).
    # Not held, the first attempt begun after the lease ran out takes it: asserted on the
    # attempts, not on seconds, which a loaded machine stretches by its scheduling (3.72 s in
    # one six-worker run, with the attempt itself prompt).
    # (The database times the lease from a moment before runs_out: the taking attempt may
    # begin a little before it.)
    after = [took for began, took in attempts if began >= runs_out]
    assert not after or after[0], f"attempts begun after the lease ran out: {after} (took {took_s:.2f} s)"
    assert woke_with and isinstance(woke_with[0], StateError), f"the woken leader's write: {woke_with}"
    print(f"\ntaken over {took_s:.2f} s after the leader paused inside its transaction")
    leader.close()
    follower.close()
