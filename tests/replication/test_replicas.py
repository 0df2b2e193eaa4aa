"""Replicas of the aggregator sharing one control plane (docs/architecture.md "Control plane
and replicas"), with real processes: three aggregators, a real PostgreSQL, a real influxd and
thirty simulated collectors. A leader is SIGKILLed in the middle of a repair, a replica holding
streams is SIGKILLed, and a leader is SIGSTOPped past its lease and woken again."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import grpc
import pytest

from gpufleet.protos import fleet_pb2, vocabulary_pb2
from harness.influx import influx_flags
from harness.processes import AggregatorHandle, Cluster
from harness.repair import audit, gpufleet_cli, incidents
from harness.replicas import ECC_FAULT, LEASE_S, Fleet, replica
from harness.stored import influx_seqs
from harness.waiting import wait_until


class Watcher(threading.Thread):
    """Lists the nodes on one replica every 0.3 s and records what a user would notice: a
    node missing from the list, or one reported silent."""

    def __init__(self, fleet: Fleet, agg: AggregatorHandle, nodes: set[str]) -> None:
        super().__init__(daemon=True)
        self.fleet, self.agg, self.nodes = fleet, agg, nodes
        self.problems: list[str] = []
        self.lists = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.3):
            try:
                listed = self.fleet.call(self.agg, "ListNodes", fleet_pb2.ListNodesRequest()).nodes
            except grpc.RpcError as exc:
                self.problems.append(f"ListNodes failed: {exc.code().name} {exc.details()}")
                continue
            self.lists += 1
            names = {n.node for n in listed}
            if names != self.nodes:
                self.problems.append(f"listed {len(names)} nodes; missing {sorted(self.nodes - names)}")
            silent = [n.node for n in listed if n.liveness == vocabulary_pb2.LIVENESS_SILENT]
            if silent:
                self.problems.append(f"reported silent: {silent}")


@pytest.mark.slow
def test_leader_and_replica_killed_mid_repair_nothing_lost_or_repeated(
    cluster: Cluster, pg_url: str, influxd: str
) -> None:
    database = f"replicas_{time.time_ns()}"
    influx = influx_flags(influxd, database)
    aggs = [replica(cluster, f"agg-{i}", pg_url, influx) for i in range(3)]
    fleet = Fleet(cluster)
    first = wait_until(lambda: fleet.leader(aggs), 20, "one repair leader")
    survivor = next(a for a in aggs if a is not first)  # asked for the repair status throughout

    nodes = {f"node-{i:02d}" for i in range(30)}
    faulty = "node-07"
    (cluster.tmp / "faults.toml").write_text(ECC_FAULT.format(node=faulty))
    addresses = ",".join(a.ingest for a in aggs)
    for node in sorted(nodes):
        extra = ["--sim-scenario", str(cluster.tmp / "faults.toml")] if node == faulty else []
        cluster.collector(node, addresses, "--interval-s", "1", *extra)

    def resets() -> int:
        """GPU resets the faulty node's collector carried out (its simulated GPU is reset)."""
        return (cluster.tmp / f"{faulty}.log").read_text().count("reset GPU 5 (simulated)")

    def all_listed(agg: AggregatorHandle) -> bool:
        listed = fleet.call(agg, "ListNodes", fleet_pb2.ListNodesRequest()).nodes
        return {n.node for n in listed} == nodes and all(
            n.liveness == vocabulary_pb2.LIVENESS_REPORTING for n in listed
        )

    # Every replica that will be watched lists them all before its watch starts: a replica
    # learns of a node another holds one sync of each later (it listed 29 of 30 once when the
    # watch started as soon as one replica listed them all).
    watched = [a for a in aggs if a is not first]
    wait_until(
        lambda: all(all_listed(a) for a in watched), 90, "all 30 nodes reporting on every replica watched"
    )
    streams = {a.proc.name: fleet.status(a).streams_open for a in aggs}
    assert sum(streams.values()) == 30 and all(streams.values()), (
        f"collectors spread over replicas: {streams}"
    )
    # A Fleet API client on each replica that outlives the leader lists the fleet throughout.
    watchers = {a.proc.name: Watcher(fleet, a, nodes) for a in watched}
    for w in watchers.values():
        w.start()

    # The repair: cordoned, the GPU reset on the node, validation pending.
    def validating() -> bool:
        status = fleet.call(survivor, "GetRepairStatus", fleet_pb2.RepairStatusRequest())  # forwarded
        return any(
            n.node == faulty and n.state == vocabulary_pb2.NODE_HEALTH_VALIDATING for n in status.nodes
        )

    wait_until(validating, 60, f"{faulty} validating after its GPU reset")
    assert resets() == 1

    killed_at = time.monotonic()
    first.proc.stop(signal.SIGKILL)
    second = wait_until(lambda: fleet.leader(aggs), LEASE_S + 5, "a new repair leader")
    took_s = time.monotonic() - killed_at
    assert took_s <= LEASE_S + 1.0, (
        f"the lease moved {took_s:.1f} s after the leader died (lease {LEASE_S} s)"
    )
    before = fleet.status(second).leader_epoch

    # The new leader carries on from the shared state: validation ends, the node returns.
    def repaired() -> dict[str, Any] | None:
        return next(
            (i for i in incidents(second, cluster, "--all") if i["node"] == faulty and not i["open"]), None
        )

    incident = wait_until(repaired, 60, f"{faulty} repaired under the new leader")
    assert incident["outcome"] == "repaired by reset_gpu"
    assert resets() == 1, "the GPU reset was not sent again"
    steps = [(a["action"], a["outcome"], a["actor"]) for a in audit(second, cluster, faulty)]
    assert [s for s in steps if s[0] == "reset_gpu"] == [
        ("reset_gpu", "started", "automation"),
        ("reset_gpu", "ok", "automation"),
    ], steps

    # A replica holding streams dies (the one that does not lead): its collectors move on.
    victim = next(a for a in aggs if a.proc.alive() and a is not second)
    held = fleet.status(victim).streams_open
    assert held, "the replica to kill holds collector streams"
    watchers[victim.proc.name].halt.set()
    watchers[victim.proc.name].join()
    victim.proc.stop(signal.SIGKILL)
    alive = [a for a in aggs if a.proc.alive()]
    wait_until(lambda: sum(fleet.status(a).streams_open for a in alive) == 30, 30, "every collector moved")
    assert fleet.status(second).leader_epoch == before, "killing a follower does not move the lease"

    settle = time.monotonic() + 3
    wait_until(lambda: time.monotonic() > settle, 10, "three more seconds of reports")
    for w in watchers.values():
        w.halt.set()
        w.join()
        assert w.lists > 10, f"{w.agg.proc.name} listed the fleet only {w.lists} times"
        assert w.problems == [], (w.agg.proc.name, w.problems[:5])

    cluster.stop_all()  # collectors drain their buffers to the surviving replicas first
    seqs = influx_seqs(influxd, database)
    assert {n for n, _ in seqs} == nodes
    for (node, boot), got in seqs.items():
        assert sorted(got) == list(range(1, max(got) + 1)), f"{node} boot {boot}: gaps or doubles in {got}"


def hook_flags(cluster: Cluster, name: str) -> tuple[str, ...]:
    """The hook backend, each replica writing what it did to files of its own."""
    return (
        "--repair-backend",
        "hook",
        "--repair-hook-cordon",
        f"sh -c 'echo {{node}} >> {cluster.tmp / f'cordon-{name}.txt'}'",
        "--repair-hook-uncordon",
        f"sh -c 'echo {{node}} >> {cluster.tmp / f'uncordon-{name}.txt'}'",
    )


def done_by(cluster: Cluster, action: str, name: str) -> list[str]:
    path = cluster.tmp / f"{action}-{name}.txt"
    return path.read_text().split() if path.exists() else []


def state_of(fleet: Fleet, agg: AggregatorHandle, node: str) -> int:
    status = fleet.call(agg, "GetRepairStatus", fleet_pb2.RepairStatusRequest())
    return next((n.state for n in status.nodes if n.node == node), vocabulary_pb2.NODE_HEALTH_HEALTHY)


@pytest.mark.slow
def test_a_paused_leader_that_wakes_after_a_takeover_cannot_act(
    cluster: Cluster, pg_url: str, influxd: str
) -> None:
    influx = influx_flags(influxd)
    a = replica(cluster, "agg-a", pg_url, influx, *hook_flags(cluster, "agg-a"))
    fleet = Fleet(cluster)
    wait_until(lambda: fleet.status(a).repair_leader, 20, "agg-a leading")
    b = replica(cluster, "agg-b", pg_url, influx, *hook_flags(cluster, "agg-b"))
    node = "node-01"
    (cluster.tmp / "faults.toml").write_text(ECC_FAULT.format(node=node))
    cluster.collector(
        node,
        f"{a.ingest},{b.ingest}",
        "--interval-s",
        "1",
        "--sim-scenario",
        str(cluster.tmp / "faults.toml"),
    )

    wait_until(
        lambda: state_of(fleet, a, node) == vocabulary_pb2.NODE_HEALTH_VALIDATING,
        60,
        "validating under agg-a",
    )
    assert done_by(cluster, "cordon", "agg-a") == [node]

    # Paused past its lease: agg-b takes over and finishes the repair while agg-a sleeps with a
    # validation in memory that is due (it would uncordon on its next pass).
    a.proc.popen.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: fleet.status(b).repair_leader, LEASE_S + 5, "agg-b leading")
        wait_until(lambda: done_by(cluster, "uncordon", "agg-b") == [node], 60, "agg-b returning the node")
    finally:
        a.proc.popen.send_signal(signal.SIGCONT)

    def deposed() -> Any:
        status = fleet.status(a)
        return status if not status.repair_leader and status.leader else None

    status_a = wait_until(deposed, 20, "agg-a knowing it no longer leads, and who does")
    assert status_a.leader == "agg-b" and status_a.leader_epoch == 2

    # Nothing agg-a did after waking took effect, and the audit log says what happened.
    assert done_by(cluster, "uncordon", "agg-a") == []
    assert done_by(cluster, "cordon", "agg-b") == []
    rows = audit(b, cluster)
    old = [r for r in rows if r["actor"] == "agg-a (epoch 1)"]
    assert old and old[0]["action"] == "leader_elected"
    stopped = [r for r in old if r["action"] in ("fenced", "leader_deposed")]
    assert stopped, f"agg-a's end as leader is audited: {old}"
    assert any(r["action"] == "leader_elected" and r["actor"] == "agg-b (epoch 2)" for r in rows)
    uncordons = [r for r in rows if r["action"] == "uncordon" and r["node"] == node and r["outcome"] == "ok"]
    assert len(uncordons) == 1
    # The incident closes with its outcome right after the uncordon it follows (a pass later).
    (incident,) = wait_until(
        lambda: (listed := incidents(b, cluster, "--all")) and listed[0]["outcome"] and listed,
        20,
        "the incident closed with its outcome",
    )
    assert incident["outcome"] == "repaired by reset_gpu"
    # The node stays healthy: agg-a's stale view never overwrote the workflow agg-b saved.
    settle = time.monotonic() + 2
    wait_until(lambda: time.monotonic() > settle, 10, "two more seconds")
    assert state_of(fleet, a, node) == vocabulary_pb2.NODE_HEALTH_HEALTHY  # forwarded to agg-b


@pytest.mark.slow
def test_breaker_and_cap_hold_across_a_leader_change(cluster: Cluster, pg_url: str, influxd: str) -> None:
    influx = influx_flags(influxd)
    rails = (
        "--repair-max-out-of-service",
        "1",
        "--repair-breaker-nodes",
        "2",
        "--repair-breaker-window-s",
        "600",
    )
    a = replica(cluster, "agg-a", pg_url, influx, *hook_flags(cluster, "agg-a"), *rails)
    fleet = Fleet(cluster)
    wait_until(lambda: fleet.status(a).repair_leader, 20, "agg-a leading")
    b = replica(cluster, "agg-b", pg_url, influx, *hook_flags(cluster, "agg-b"), *rails)
    faults = cluster.tmp / "faults.toml"
    faults.write_text(ECC_FAULT.format(node="node-a") + ECC_FAULT.format(node="node-b"))
    for node in ("node-a", "node-b", "node-c"):
        cluster.collector(node, f"{a.ingest},{b.ingest}", "--interval-s", "1", "--sim-scenario", str(faults))

    def tripped(agg: AggregatorHandle) -> bool:
        return fleet.call(agg, "GetRepairStatus", fleet_pb2.RepairStatusRequest()).breaker_tripped

    def held() -> dict[str, int] | None:
        """Both nodes' states once the breaker holds them: each out of service or waiting. (Read
        the moment the breaker tripped, the node it held still read healthy: agg-a's next pass
        makes it `waiting`, held back by the rail, which is no step taken; one four-worker run
        failed on that.)"""
        states = {n: state_of(fleet, a, n) for n in ("node-a", "node-b")}
        unsettled = (vocabulary_pb2.NODE_HEALTH_HEALTHY, vocabulary_pb2.NODE_HEALTH_SUSPECT)
        return states if tripped(a) and not set(states.values()) & set(unsettled) else None

    frozen = wait_until(held, 60, "the breaker tripped by two failing nodes, both held")
    a.proc.stop(signal.SIGKILL)
    wait_until(lambda: fleet.status(b).repair_leader, LEASE_S + 5, "agg-b leading")
    wait_until(lambda: b.metric_value("gpufleet_repair_passes_total") > 20, 30, "twenty passes of agg-b's")
    assert tripped(b), "the new leader comes up with the breaker tripped"
    assert {n: state_of(fleet, b, n) for n in frozen} == frozen, "nothing moved while the breaker is tripped"
    assert done_by(cluster, "cordon", "agg-b") == []

    out = gpufleet_cli(b, cluster, "ops", "breaker", "reset", "--reason", "checked both nodes")
    assert out.returncode == 0, out.stderr

    def both_repaired() -> bool:
        # Polled through the Fleet API (a CLI process per look was most of this test's CPU).
        listed = fleet.call(b, "ListIncidents", fleet_pb2.ListIncidentsRequest(limit=100)).incidents
        return all(any(i.node == n and not i.open for i in listed) for n in frozen)

    wait_until(both_repaired, 90, "both nodes repaired under agg-b, one at a time")
    rows = [r for r in audit(b, cluster) if r["outcome"] == "ok" and r["action"] in ("cordon", "uncordon")]
    order = [(r["action"], r["node"]) for r in rows]
    first_out = order[0][1]
    second_out = "node-b" if first_out == "node-a" else "node-a"
    assert order.index(("uncordon", first_out)) < order.index(("cordon", second_out)), (
        f"the cap of one held across the leader change: {order}"
    )


@pytest.mark.slow
def test_a_gpu_reset_reaches_a_node_whose_stream_another_replica_holds(
    cluster: Cluster, pg_url: str, influxd: str
) -> None:
    influx = influx_flags(influxd)
    leader = replica(cluster, "agg-a", pg_url, influx)
    fleet = Fleet(cluster)
    wait_until(lambda: fleet.status(leader).repair_leader, 20, "agg-a leading")
    follower = replica(cluster, "agg-b", pg_url, influx)
    node = "node-01"
    (cluster.tmp / "faults.toml").write_text(ECC_FAULT.format(node=node))
    # The node streams to the replica that does not lead, and only to it.
    cluster.collector(
        node, follower.ingest, "--interval-s", "1", "--sim-scenario", str(cluster.tmp / "faults.toml")
    )

    def repaired() -> bool:
        listed = fleet.call(leader, "ListIncidents", fleet_pb2.ListIncidentsRequest(limit=100)).incidents
        return any(not i.open for i in listed)

    wait_until(repaired, 90, "the node repaired by a reset sent through the other replica")
    incident = next(i for i in incidents(leader, cluster, "--all") if not i["open"])  # as a person reads it
    assert incident["outcome"] == "repaired by reset_gpu"
    log = (cluster.tmp / f"{node}.log").read_text()
    assert log.count("reset GPU 5 (simulated)") == 1
    assert "queued for replica agg-b" in leader.proc.log()
    assert fleet.status(leader).repair_leader and not fleet.status(follower).repair_leader
    steps = [(a["action"], a["outcome"]) for a in audit(leader, cluster, node)]
    assert ("reset_gpu", "ok") in steps, steps
    # `gpufleet status` on either replica names the leader, its epoch and both replicas.
    shown = gpufleet_cli(follower, cluster, "viewer", "status")
    assert shown.returncode == 0, shown.stderr
    assert "replica agg-b; repair leader agg-a (epoch 1, lease" in shown.stdout, shown.stdout
    assert "this replica follows" in shown.stdout
    assert f"replica agg-a (leader): fleet API {leader.fleet}" in shown.stdout
    assert f"replica agg-b: fleet API {follower.fleet}, ingest {follower.ingest}, 1 streams" in shown.stdout


@pytest.mark.slow
def test_a_dba_sees_which_replica_and_connection_each_session_is(
    cluster: Cluster, pg_url: str, influxd: str
) -> None:
    """A DBA looking at PostgreSQL (a held lock, a long transaction) sees in pg_stat_activity
    which replica a session belongs to and what it is for, not a row of anonymous clients."""
    import psycopg

    a = replica(cluster, "agg-a", pg_url, influx_flags(influxd))
    fleet = Fleet(cluster)
    wait_until(lambda: fleet.status(a).repair_leader, 20, "agg-a leading")

    def names() -> set[str]:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT application_name FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        return {str(name) for (name,) in rows}

    wanted = {f"gpufleet agg-a {purpose}" for purpose in ("term", "lease", "sync", "reads", "revocations")}
    seen = wait_until(lambda: (n := names()) >= wanted and n, 20, f"sessions named {sorted(wanted)}")
    assert seen == wanted, f"sessions not named after their replica and purpose: {sorted(seen - wanted)}"
