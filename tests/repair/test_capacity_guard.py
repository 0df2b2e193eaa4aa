"""The capacity guard in the repair controller, in-process, on node snapshots and engine
readings built here (its input), with the real policy, the SQLite state and the `none`
backend: a drain that may wait is held while it would take a serving pool below its floor and
goes on within one pass of capacity returning; an urgent one drains at once with a "capacity at
risk" alert; a node cannot hold its own urgent repair back; the wait survives a restart with no
second drain; a person's `proceed` lets it go."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from gpufleet.repair.controller import RepairController
from gpufleet.repair.health import HoldKind
from gpufleet.repair.outcome import Status
from gpufleet.repair.policy import load_policy_text
from gpufleet.repair.state import RepairState, open_state
from harness.capacity_fleet import DEFERRABLE, MODEL, Fleet, controller, drains_started


def capacity_alerts(state: RepairState) -> dict[str, str]:
    """Each capacity alert identity the dispatcher keeps, and what it says now (firing or
    resolved; still in its group wait here: no sink, no flush)."""
    return {
        key: json.loads(body)["status"]
        for key, _, body in state.kept.alert_identities()
        if key.endswith("/capacity")
    }


async def passes(repair: RepairController, n: int = 3) -> None:
    for _ in range(n):
        await repair.pass_once()


def test_a_drain_that_may_wait_waits_for_capacity_then_goes_within_one_pass_of_a_fourth_replica(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        fleet = Fleet({"n1": 0.85, "n2": 0.85, "n3": 0.85}, idle=["n4"])
        state = open_state("sqlite", str(tmp_path / "repair.sqlite3"))
        repair = controller(state, fleet, load_policy_text(DEFERRABLE, "test"))
        fleet.xid("n1")
        await passes(repair)
        wf = repair.workflows["n1"]
        assert wf.state == "cordoned", (wf.state, wf.detail)
        assert wf.held is not None and wf.held.kind is HoldKind.CAPACITY
        assert wf.detail == f"waiting for capacity: {MODEL} 3 → 2 replicas, projected KV 85 % → 127 %"
        assert drains_started(state, "n1") == 0
        (held,) = [a for a in state.audit_log("n1") if a.action == "drain"]
        assert held.outcome.status is Status.HELD and "waiting for capacity" in str(held.outcome)
        await passes(repair, 5)  # checked again every pass, audited once
        assert [a.action for a in state.audit_log("n1")].count("drain") == 1
        # A fourth replica comes up with an empty cache: 2.55 / 3 = 0.85 once n1 leaves.
        fleet.add_replica("n4", 0.0)
        await repair.pass_once()
        assert drains_started(state, "n1") == 1
        assert repair.workflows["n1"].state not in ("cordoned", "healthy")
        assert capacity_alerts(state) == {}, "no alert: it waited less than max_capacity_wait_s"

    asyncio.run(scenario())


def test_an_urgent_finding_drains_at_once_with_a_capacity_at_risk_alert(tmp_path: Path) -> None:
    async def scenario() -> None:
        fleet = Fleet({"n1": 0.85, "n2": 0.85, "n3": 0.85})
        state = open_state("sqlite", str(tmp_path / "repair.sqlite3"))
        repair = controller(state, fleet, load_policy_text("", "shipped"))
        fleet.xid("n1")
        await passes(repair)
        assert drains_started(state, "n1") == 1
        wf = repair.workflows["n1"]
        assert wf.capacity_alert and not wf.may_wait
        assert capacity_alerts(state) == {f"{wf.incident_id}/capacity": "firing"}

    asyncio.run(scenario())


def test_a_node_cannot_hold_its_own_urgent_repair_back_by_reporting_pressure(tmp_path: Path) -> None:
    """The only replica of its model, reporting a full cache and a queue: an urgent finding
    drains it anyway (urgency is the policy's, never the node's)."""

    async def scenario() -> None:
        fleet = Fleet({"n1": 1.0})
        state = open_state("sqlite", str(tmp_path / "repair.sqlite3"))
        repair = controller(state, fleet, load_policy_text("", "shipped"))
        fleet.xid("n1")
        await passes(repair)
        assert drains_started(state, "n1") == 1

    asyncio.run(scenario())


async def waiting(tmp: Path, policy: str = DEFERRABLE) -> tuple[Fleet, RepairState, RepairController]:
    """Two replicas at 0.85 and a fault that may wait on n1: its drain waits for capacity."""
    fleet = Fleet({"n1": 0.85, "n2": 0.85})
    state = open_state("sqlite", str(tmp / "repair.sqlite3"))
    repair = controller(state, fleet, load_policy_text(policy, "test"))
    fleet.xid("n1")
    await passes(repair)
    assert repair.workflows["n1"].held is not None and drains_started(state, "n1") == 0
    return fleet, state, repair


def test_an_urgent_finding_while_waiting_ends_the_wait(tmp_path: Path) -> None:
    async def scenario() -> None:
        fleet, state, repair = await waiting(tmp_path)
        fleet.snaps["n1"].gpus[2].ecc_dbe_volatile = 1  # uncorrected ECC: urgent
        await passes(repair)
        assert drains_started(state, "n1") == 1

    asyncio.run(scenario())


def test_the_wait_survives_a_restart_and_the_drain_happens_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        fleet = Fleet({"n1": 0.85, "n2": 0.85, "n3": 0.85})
        path = str(tmp_path / "repair.sqlite3")
        policy = load_policy_text(DEFERRABLE, "test")
        first = controller(open_state("sqlite", path), fleet, policy)
        fleet.xid("n1")
        await passes(first)
        since = first.workflows["n1"].capacity_wait_since_ns
        assert since and first.workflows["n1"].held is not None
        # A new process on the same state: still waiting, since the same time, audited once.
        state = open_state("sqlite", path)
        second = controller(state, fleet, policy)
        await passes(second)
        wf = second.workflows["n1"]
        assert wf.state == "cordoned" and wf.detail.startswith("waiting for capacity: ")
        assert wf.capacity_wait_since_ns == since
        assert [a.action for a in state.audit_log("n1")].count("drain") == 1
        fleet.add_replica("n4", 0.1)
        await passes(second)
        third = controller(open_state("sqlite", path), fleet, policy)
        await passes(third)
        assert drains_started(state, "n1") == 1

    asyncio.run(scenario())


def test_a_person_says_proceed_and_the_drain_goes_on_audited_and_alerted(tmp_path: Path) -> None:
    async def scenario() -> None:
        _, state, repair = await waiting(tmp_path)
        await repair.proceed("n1", "maintenance window, traffic shifted", "alice")
        await repair.pass_once()
        assert drains_started(state, "n1") == 1
        (said,) = [a for a in state.audit_log("n1") if a.action == "proceed"]
        assert (said.actor, said.reason) == ("alice", "maintenance window, traffic shifted")
        assert list(capacity_alerts(state).values()) == ["firing"], "capacity at risk, said"

    asyncio.run(scenario())


def test_the_wait_ends_at_max_capacity_wait_and_the_drain_goes_on_with_capacity_at_risk(
    tmp_path: Path,
) -> None:
    """Pressure a node reports, real or not, holds another node's repair for at most
    max_capacity_wait_s (docs/repair.md): then the drain starts, with the critical alert."""

    async def scenario() -> None:
        fleet = Fleet({"n1": 0.85, "n2": 0.85})
        state = open_state("sqlite", str(tmp_path / "repair.sqlite3"))
        policy = load_policy_text(DEFERRABLE + "[serving]\nmax_capacity_wait_s = 0\n", "test")
        repair = controller(state, fleet, policy)
        fleet.xid("n1")
        await passes(repair)
        assert drains_started(state, "n1") == 1
        wf = repair.workflows["n1"]
        assert wf.capacity_alert and wf.may_wait
        assert list(capacity_alerts(state).values()) == ["firing"]
        (said,) = [a for a in state.audit_log("n1") if a.action == "drain"][:1]
        assert said.outcome.status is Status.STARTED, "never held: the wait was already over"

    asyncio.run(scenario())


def test_hold_past_max_capacity_wait_keeps_waiting_alerted_and_resolves_when_it_goes(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        policy = DEFERRABLE + "[serving]\nmax_capacity_wait_s = 0\nhold_past_max_capacity_wait = true\n"
        fleet, state, repair = await waiting(tmp_path, policy)
        assert repair.workflows["n1"].capacity_alert
        assert list(capacity_alerts(state).values()) == ["firing"]
        fleet.kv.update(n1=0.2, n2=0.2)  # pressure falls: 0.4 on the one left
        await repair.pass_once()
        assert drains_started(state, "n1") == 1
        assert not repair.workflows["n1"].capacity_alert
        assert list(capacity_alerts(state).values()) == ["resolved"]

    asyncio.run(scenario())


def test_the_guard_off_never_holds(tmp_path: Path) -> None:
    async def scenario() -> None:
        fleet = Fleet({"n1": 0.99})
        state = open_state("sqlite", str(tmp_path / "repair.sqlite3"))
        repair = controller(state, fleet, load_policy_text(DEFERRABLE + "[serving]\nguard = false\n", "t"))
        fleet.xid("n1")
        await passes(repair)
        assert drains_started(state, "n1") == 1

    asyncio.run(scenario())
