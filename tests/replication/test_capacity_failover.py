"""The capacity guard across a leader failover, on a real PostgreSQL control plane: a drain
waiting for serving capacity under one leader is still waiting, since the same moment, under
the next; the deposed leader cannot drain it; and once capacity returns it drains exactly once
(checked from the audit log)."""

from __future__ import annotations

import asyncio
import time

import pytest

from gpufleet.aggregator.replication.records import ReplicaRecords
from gpufleet.protos import telemetry_pb2, vocabulary_pb2
from gpufleet.repair.alerts.dispatcher import AlertDispatcher
from gpufleet.repair.backends.none import NoBackend
from gpufleet.repair.controller import Hooks, Rails, RepairController
from gpufleet.repair.model import NodeSnapshot
from gpufleet.repair.outcome import Status
from gpufleet.repair.policy import load_policy_text
from gpufleet.repair.serving import ReplicaReading
from gpufleet.repair.state import Fenced, RepairState, open_state
from harness.waiting import wait_until

POLICY = load_policy_text("[xid.79]\nmay_wait = true\n", "test")


class Fleet:
    def __init__(self) -> None:
        self.kv = {"n1": 0.85, "n2": 0.85, "n3": 0.85}
        now = time.time_ns()
        self.snaps = {
            n: NodeSnapshot(
                n, "c", vocabulary_pb2.LIVENESS_REPORTING, 0.5, "boot-1", True, 8, sample_time_ns=now
            )
            for n in (*self.kv, "n4")
        }
        self.snaps["n1"].events.append(
            telemetry_pb2.Event(
                kind=vocabulary_pb2.EVENT_KIND_XID,
                source=vocabulary_pb2.EVENT_SOURCE_NVML,
                time_unix_ns=now,
                gpu_index=0,
                xid=79,
            )
        )

    def snapshots(self, only: set[str] | None) -> list[NodeSnapshot]:
        return [s for n, s in self.snaps.items() if only is None or n in only]

    def readings(self) -> list[ReplicaReading]:
        return [
            ReplicaReading(n, "c", "vllm", "llama", 8000, kv_cache_usage_ratio=kv)
            for n, kv in self.kv.items()
        ]


def leader(state: RepairState, fleet: Fleet) -> RepairController:
    return RepairController(
        POLICY,
        state,
        NoBackend(),
        Rails(max_out_of_service_fraction=1),
        Hooks(),
        AlertDispatcher([], store=state),
        fleet.snapshots,
        lambda node, command: False,
        serving=fleet.readings,
    )


def drains(state: RepairState) -> list[str]:
    return [a.outcome.status.value for a in state.audit_log("n1") if a.action == "drain"]


def test_a_wait_for_capacity_survives_a_leader_failover_and_drains_once(pg_url: str) -> None:
    async def scenario() -> None:
        fleet = Fleet()
        a_store, b_store = open_state(pg_url), open_state(pg_url)
        try:
            epoch_a = ReplicaRecords(a_store).acquire_lease("replica-a", 0.5)
            assert epoch_a is not None
            a = leader(a_store.fenced("replica-a", epoch_a), fleet)
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
            b = leader(b_store.fenced("replica-b", epoch_b), fleet)
            for _ in range(3):
                await b.pass_once()
            again = b.workflows["n1"]
            assert again.state == "cordoned" and again.detail.startswith("waiting for capacity: llama 3 → 2")
            assert again.capacity_wait_since_ns == waiting.capacity_wait_since_ns
            assert drains(b_store) == [Status.HELD.value], "held once, across both leaders"

            # Capacity returns. The deposed leader wakes first: its pass is refused before it acts.
            fleet.kv["n4"] = 0.0
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
