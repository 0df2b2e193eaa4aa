"""The capacity guard across a leader failover, on a real PostgreSQL control plane: a drain
waiting for serving capacity under one leader is still waiting, since the same moment, under
the next; the deposed leader cannot drain it; and once capacity returns it drains exactly once
(checked from the audit log)."""

from __future__ import annotations

import asyncio

import pytest

from gpufleet.aggregator.replication.records import ReplicaRecords
from gpufleet.repair.outcome import Status
from gpufleet.repair.policy import load_policy_text
from gpufleet.repair.state import Fenced, RepairState, open_state
from harness.capacity_fleet import DEFERRABLE, MODEL, Fleet, controller
from harness.waiting import wait_until

POLICY = load_policy_text(DEFERRABLE, "test")


def drains(state: RepairState) -> list[str]:
    return [a.outcome.status.value for a in state.audit_log("n1") if a.action == "drain"]


def test_a_wait_for_capacity_survives_a_leader_failover_and_drains_once(pg_url: str) -> None:
    async def scenario() -> None:
        fleet = Fleet({"n1": 0.85, "n2": 0.85, "n3": 0.85}, idle=["n4"])
        fleet.xid("n1")
        a_store, b_store = open_state(pg_url), open_state(pg_url)
        try:
            epoch_a = ReplicaRecords(a_store).acquire_lease("replica-a", 0.5)
            assert epoch_a is not None
            a = controller(a_store.fenced("replica-a", epoch_a), fleet, POLICY)
            for _ in range(3):
                await a.pass_once()
            waiting = a.workflows["n1"]
            assert waiting.state == "cordoned" and waiting.held is not None
            assert drains(b_store) == [Status.HELD.value]

            # replica-a stops renewing (paused, partitioned): replica-b takes the lease.
            epoch_b = wait_until(
                lambda: ReplicaRecords(b_store).acquire_lease("replica-b", 30),
                10,
                "replica-b taking the lease",
            )
            b = controller(b_store.fenced("replica-b", epoch_b), fleet, POLICY)
            for _ in range(3):
                await b.pass_once()
            again = b.workflows["n1"]
            assert again.state == "cordoned" and again.detail.startswith(
                f"waiting for capacity: {MODEL} 3 → 2"
            )
            assert again.capacity_wait_since_ns == waiting.capacity_wait_since_ns
            assert drains(b_store) == [Status.HELD.value], "held once, across both leaders"

            # Capacity returns. The deposed leader wakes first: its pass is refused before it acts.
            fleet.add_replica("n4", 0.0)
            with pytest.raises(Fenced):
                await a.pass_once()
            await b.pass_once()
            assert drains(b_store) == [Status.HELD.value, Status.STARTED.value, Status.OK.value]
            for _ in range(3):
                await b.pass_once()
            assert drains(b_store).count(Status.STARTED.value) == 1
        finally:
            a_store.close()
            b_store.close()

    asyncio.run(scenario())
